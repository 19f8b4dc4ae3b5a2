/**
 * A request's `AbortSignal` is made only when its handler reads it (server/http/request-abort.ts), and the
 * non-streamed chat uses the request's own for its time limit instead of a second one linked to it: on Node 20
 * each signal costs microseconds to make. Counted, not timed: every signal made while the server answers one
 * request, sent through `node:http` (whose client makes none; `fetch` makes one per request).
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { send } from '../support/raw-http.ts';

let server: ChatServer;
let key: string;

/** Every signal made while counting: through a controller, or by `AbortSignal`'s factories. */
const made = new Set<AbortSignal>();
let counting = false;
const restore: Array<() => void> = [];

function countSignals() {
  const getter = Object.getOwnPropertyDescriptor(AbortController.prototype, 'signal');
  const read = getter?.get as (this: AbortController) => AbortSignal;
  Object.defineProperty(AbortController.prototype, 'signal', {
    ...getter,
    get(this: AbortController) {
      const signal = read.call(this);
      if (counting) made.add(signal);
      return signal;
    },
  });
  restore.push(() =>
    Object.defineProperty(AbortController.prototype, 'signal', getter as PropertyDescriptor),
  );
  for (const name of ['any', 'timeout', 'abort'] as const) {
    const factory = AbortSignal[name] as (...args: unknown[]) => AbortSignal;
    (AbortSignal as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => {
      const signal = factory.apply(AbortSignal, args);
      if (counting) made.add(signal);
      return signal;
    };
    restore.push(() => {
      (AbortSignal as unknown as Record<string, unknown>)[name] = factory;
    });
  }
}

/** The signals made while the server answers `request`. */
async function signalsOf(request: Parameters<typeof send>[1]): Promise<{ status: number; count: number }> {
  made.clear();
  counting = true;
  try {
    const response = await send(server.origin, request);
    return { status: response.status, count: made.size };
  } finally {
    counting = false;
  }
}

const chat = (stream: boolean) => ({
  method: 'POST',
  target: '/api/v1/chat/completions',
  headers: [
    ['authorization', `Bearer ${key}`],
    ['content-type', 'application/json'],
  ] as [string, string][],
  body: JSON.stringify({
    model: 'llama-3.3-70b',
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 8,
    stream,
  }),
});

beforeAll(async () => {
  server = await startChatServer();
  ({ key } = await server.account('5'));
  countSignals();
}, 60_000);

afterAll(async () => {
  for (const undo of restore.reverse()) undo();
  await server?.close();
});

describe('the signals a request makes', () => {
  test('behavior: an operation whose handler never reads its signal makes none', async () => {
    // Twice: the first request of a kind may do work of its own (a list built once).
    for (let i = 0; i < 2; i++) {
      expect(await signalsOf({ method: 'GET', target: '/api/v1/models' })).toEqual({ status: 200, count: 0 });
    }
  });

  test("behavior: a chat makes one, streamed or not (the time limit aborts the request's own)", async () => {
    for (const stream of [false, true, false]) {
      expect(await signalsOf(chat(stream))).toEqual({ status: 200, count: 1 });
    }
  });

  test('behavior: the counter sees a signal the server makes (the check itself)', async () => {
    counting = true;
    try {
      made.clear();
      const controller = new AbortController();
      void controller.signal;
      AbortSignal.timeout(10_000);
      expect(made.size).toBe(2);
    } finally {
      counting = false;
    }
  });
});
