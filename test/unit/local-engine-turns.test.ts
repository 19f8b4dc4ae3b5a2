/**
 * The local engine lets the event loop run between its tokens: a turn (`setImmediate`) after every 16 tokens
 * without a delay, the delay (`setTimeout`) between every two tokens with one. A turn is taken before the
 * token that follows, never after an answer's last token: nothing follows it, and a non-streamed chat of
 * exactly 16 tokens would wait a whole turn of the loop for nothing before its answer (about 35 µs a chat,
 * bench/HISTORY.md's thirty-fourth round).
 *
 * The turns are counted as the timers the engine's own code makes (an async hook, by the creating stack), so
 * nothing here is timed.
 */
import { createHook } from 'node:async_hooks';
import { describe, expect, test } from 'vitest';
import { createLocalChatEngine } from '../../server/providers/chat/local.ts';
import type { ChatEvent, ChatProviderRequest } from '../../server/providers/chat/types.ts';
import { engineRequest } from '../support/local-engine.ts';

type Counted = { immediates: number; timeouts: number; tokens: number; reasoning: number; finish: string[] };

/** Runs the request to its end, counting the timers the engine made and the tokens it reported. */
async function turnsOf(
  engine: ReturnType<typeof createLocalChatEngine>,
  overrides: Partial<ChatProviderRequest>,
): Promise<Counted> {
  const request = engineRequest(7, overrides);
  const counted: Counted = { immediates: 0, timeouts: 0, tokens: 0, reasoning: 0, finish: [] };
  const hook = createHook({
    init(_id, type) {
      if (type !== 'Immediate' && type !== 'Timeout') return;
      if (!new Error().stack?.includes('providers/chat/local.ts')) return;
      if (type === 'Immediate') counted.immediates++;
      else counted.timeouts++;
    },
  });
  hook.enable();
  try {
    for await (const event of engine.stream(request) as AsyncIterable<ChatEvent>) {
      if (event.type === 'finish') counted.finish.push(event.reason);
      if (event.type === 'usage') {
        counted.tokens = event.usage.completionTokens;
        counted.reasoning = event.usage.reasoningTokens;
      }
    }
  } finally {
    hook.disable();
  }
  return counted;
}

describe('local engine turns of the event loop', () => {
  const engine = createLocalChatEngine();

  test.each([
    [1, 0],
    [15, 0],
    [16, 0],
    [17, 1],
    [32, 1],
    [33, 2],
    [48, 2],
  ])('no delay, max_tokens %i (read whole and streamed): %i turns', async (maxTokens, turns) => {
    for (const whole of [true, false]) {
      const counted = await turnsOf(engine, { maxTokens, whole });
      expect(counted.tokens).toBe(maxTokens);
      expect(counted.finish).toEqual(['length']);
      expect(counted.immediates).toBe(turns);
      expect(counted.timeouts).toBe(0);
    }
  });

  test('no delay, an answer that ends by itself: one turn per 16 tokens after the first 16', async () => {
    const counted = await turnsOf(engine, {});
    expect(counted.finish).toEqual(['stop']);
    expect(counted.tokens).toBeGreaterThan(16);
    expect(counted.immediates).toBe(Math.ceil(counted.tokens / 16) - 1);
  });

  test('no delay, reasoning then content: the turns count both, none after the last token', async () => {
    for (const tags of [true, false]) {
      const counted = await turnsOf(engine, {
        maxTokens: 64,
        reasoning: { enabled: true, effort: 'low', tags },
      });
      expect(counted.tokens).toBe(64);
      expect(counted.reasoning).toBeGreaterThan(0);
      expect(counted.immediates).toBe(3);
    }
  });

  test('two choices: the turns run on across them, none after the last token of the last', async () => {
    const counted = await turnsOf(engine, { maxTokens: 24, n: 2 });
    expect(counted.finish).toEqual(['length', 'length']);
    expect(counted.tokens).toBe(48);
    expect(counted.immediates).toBe(2);
  });

  test('with a delay: one between every two tokens, none after the last', async () => {
    const paced = createLocalChatEngine({ tokenDelayMs: 1 });
    for (const maxTokens of [1, 2, 5]) {
      const counted = await turnsOf(paced, { maxTokens });
      expect(counted.tokens).toBe(maxTokens);
      expect(counted.timeouts).toBe(maxTokens - 1);
      expect(counted.immediates).toBe(0);
    }
  });
});
