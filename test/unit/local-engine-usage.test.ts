/**
 * The local engine's prompt count: the caller's count of the same prompt when it gives one (the chat service
 * counted it for the reservation already), and otherwise its own count with our tokenizer.
 */
import { describe, expect, test } from 'vitest';
import { createLocalChatEngine } from '../../server/providers/chat/local.ts';
import { countPromptTokens } from '../../server/providers/chat/tokenizer.ts';
import type { ChatEvent, ChatProviderRequest, ProviderUsage } from '../../server/providers/chat/types.ts';
import { engineRequest } from '../support/local-engine.ts';

const engine = createLocalChatEngine();

async function usageOf(request: ChatProviderRequest): Promise<ProviderUsage | undefined> {
  let usage: ProviderUsage | undefined;
  for await (const event of engine.stream(request) as AsyncIterable<ChatEvent>)
    if (event.type === 'usage') usage = event.usage;
  return usage;
}

describe("the local engine's prompt tokens", () => {
  test('counted with our tokenizer when the caller gives no count', async () => {
    const request = engineRequest(7, {});
    expect(request.promptTokens).toBeUndefined();
    const usage = await usageOf(request);
    expect(usage?.promptTokens).toBe(countPromptTokens(request.messages, request.tools));
    expect(usage?.promptTokens).toBeGreaterThan(3);
  });

  test("the caller's count when it gives one, and the same answer", async () => {
    const own = engineRequest(7, {});
    const given = engineRequest(7, { promptTokens: 4321 });
    const usage = await usageOf(given);
    expect(usage?.promptTokens).toBe(4321);
    expect({ ...usage, promptTokens: 0 }).toEqual({ ...(await usageOf(own)), promptTokens: 0 });
  });
});
