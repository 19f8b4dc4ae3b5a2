/**
 * The local engine draws and tokenizes only what a `max_tokens` bound lets it send: the bounded answer must
 * still be exactly the start of the unbounded one (same seed), with and without log probabilities, and with
 * a stop sequence (where the whole answer is drawn).
 */
import { describe, expect, test } from 'vitest';
import { createLocalChatEngine } from '../../server/providers/chat/local.ts';
import type { ChatEvent, ChatProviderRequest } from '../../server/providers/chat/types.ts';
import { engineRequest } from '../support/local-engine.ts';

const engine = createLocalChatEngine();

async function answer(overrides: Partial<ChatProviderRequest>) {
  const request = engineRequest(42, overrides);
  let content = '';
  let finish: string | undefined;
  let tokens = 0;
  const logprobs: string[] = [];
  for await (const event of engine.stream(request) as AsyncIterable<ChatEvent>) {
    if (event.type === 'delta') {
      content += event.content ?? '';
      for (const lp of event.logprobs ?? []) logprobs.push(JSON.stringify(lp));
    }
    if (event.type === 'finish') finish = event.reason;
    if (event.type === 'usage') tokens = event.usage.completionTokens;
  }
  return { content, finish, tokens, logprobs };
}

describe('local engine under max_tokens', () => {
  test.each([1, 2, 16, 40])(
    'max_tokens %i: the start of the full answer, finish length',
    async (maxTokens) => {
      const full = await answer({});
      const bounded = await answer({ maxTokens });
      expect(full.finish).toBe('stop');
      expect(bounded.finish).toBe('length');
      expect(bounded.tokens).toBe(maxTokens);
      expect(bounded.content.length).toBeGreaterThan(0);
      expect(full.content.startsWith(bounded.content)).toBe(true);
    },
  );

  test('with top log probabilities: the same tokens and alternatives as the full answer', async () => {
    const full = await answer({ logprobs: { top: 3 } });
    const bounded = await answer({ maxTokens: 12, logprobs: { top: 3 } });
    expect(bounded.logprobs.length).toBe(12);
    expect(full.logprobs.slice(0, 12)).toEqual(bounded.logprobs);
  });

  test('a stop sequence straddling the bound still cuts where the full answer says', async () => {
    const full = await answer({});
    const words = full.content.split(' ');
    const stop = words.slice(6, 30).join(' ');
    const bounded = await answer({ maxTokens: 12, sampling: { seed: 42, stop: [stop] } });
    const cut = full.content.indexOf(stop);
    expect(full.content.slice(0, cut).startsWith(bounded.content)).toBe(true);
  });
});
