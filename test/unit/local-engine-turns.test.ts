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

describe('local engine events', () => {
  /** The promises made while the request's events are read to their end (an async hook), and the events. */
  async function promisesOf(overrides: Partial<ChatProviderRequest>): Promise<[number, ChatEvent[]]> {
    const engine = createLocalChatEngine();
    const events: ChatEvent[] = [];
    let promises = 0;
    const hook = createHook({
      init(_id, type) {
        if (type === 'PROMISE') promises++;
      },
    });
    const iterator = engine.stream(engineRequest(7, overrides))[Symbol.asyncIterator]();
    hook.enable();
    try {
      for (let next = await iterator.next(); !next.done; next = await iterator.next())
        events.push(next.value);
    } finally {
      hook.disable();
    }
    return [promises, events];
  }

  test('an answer without turns: about one promise an event, none of a generator of its own', async () => {
    // The steps are a synchronous generator; an async generator made a promise and awaited what it yielded
    // for every event besides the caller's (bench/HISTORY.md, forty-seventh round). No turn of the event loop
    // is taken here, so nothing else runs meanwhile: the counts are the same on every run.
    const [streamed, deltas] = await promisesOf({ maxTokens: 16 });
    expect(deltas.length).toBe(19);
    // Each `next()` (the last one's `done` included): its promise and what the reader's `await` of it makes
    // with the hook on (50 here). Through an async generator: 85.
    expect(streamed).toBeLessThanOrEqual(3 * (deltas.length + 1));
    // Read whole: one delta, the finish and the usage; 15 here, 21 through an async generator.
    const [whole, events] = await promisesOf({ maxTokens: 16, whole: true });
    expect(events.map((e) => e.type)).toEqual(['delta', 'finish', 'usage']);
    expect(whole).toBeLessThanOrEqual(4 * (events.length + 1));
  });

  test('a turn of the event loop is waited for, and the events go on after it', async () => {
    const [, events] = await promisesOf({ maxTokens: 40, whole: true });
    // Read whole, a delta a turn (after 16 and 32 tokens) and the last 8 tokens' at the end.
    expect(events.map((e) => e.type)).toEqual(['delta', 'delta', 'delta', 'finish', 'usage']);
    const usage = events.at(-1);
    expect(usage?.type === 'usage' && usage.usage.completionTokens).toBe(40);
  });

  test('return() ends the answer: nothing more is produced', async () => {
    const engine = createLocalChatEngine();
    const iterator = engine.stream(engineRequest(7, { maxTokens: 64 }))[Symbol.asyncIterator]();
    expect((await iterator.next()).done).toBe(false);
    expect(await iterator.return?.()).toEqual({ done: true, value: undefined });
    expect(await iterator.next()).toEqual({ done: true, value: undefined });
  });

  test('next() asked for again while a turn is under way: the events in order, as one at a time', async () => {
    const request = engineRequest(7, { maxTokens: 40 });
    const one: ChatEvent[] = [];
    for await (const event of createLocalChatEngine().stream(request)) one.push(event);
    const iterator = createLocalChatEngine().stream(request)[Symbol.asyncIterator]();
    const all: ChatEvent[] = [];
    // Four at a time: the turns after 16 and 32 tokens fall inside some of the batches.
    for (;;) {
      const batch = await Promise.all([iterator.next(), iterator.next(), iterator.next(), iterator.next()]);
      for (const result of batch) if (!result.done) all.push(result.value);
      if (batch.some((result) => result.done)) break;
    }
    expect(all).toEqual(one);
  });

  test('an abort during a turn rejects the next event, and the answer ends', async () => {
    const engine = createLocalChatEngine();
    const controller = new AbortController();
    const iterator = engine
      .stream(engineRequest(7, { maxTokens: 64, whole: true, signal: controller.signal }))
      [Symbol.asyncIterator]();
    // Read whole, the first event is the first turn's gathered delta; the next waits for the turn.
    expect((await iterator.next()).done).toBe(false);
    const next = iterator.next();
    // Asked for while the turn is under way: after it, the answer ended.
    const queued = iterator.next();
    controller.abort();
    await expect(next).rejects.toThrow();
    expect(await queued).toEqual({ done: true, value: undefined });
    expect(await iterator.next()).toEqual({ done: true, value: undefined });
  });
});
