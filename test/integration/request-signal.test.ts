/**
 * A request's `AbortSignal` is made only when something reads it (server/http/request-abort.ts): the chat (on
 * the local engine and through the upstream adapter) and the JSON-RPC proxy read the request's abort without
 * one (`ctx.cancellation`), and the non-streamed chat's time limit aborts the request's own instead of a second
 * linked to it. On Node 20 each signal is dear to make.
 * Counted, not timed: every signal made while the server answers one request, sent through `node:http` (whose
 * client makes none; `fetch` makes one per request).
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';
import { send } from '../support/raw-http.ts';
import { type RpcStandIn, startRpcStandIn } from '../support/rpc-upstream.ts';

const defaults = parse(readFileSync(`${repoRoot}/server/catalog/default-catalog.yaml`, 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};

let server: ChatServer;
/** The upstream of the chat upstream adapter: another server, in this process (its signals count too). */
let upstream: ChatServer;
let node: RpcStandIn;
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

/** A JSON POST under the base path with the test's key. */
const post = (path: string, body: unknown) => ({
  method: 'POST',
  target: `/api/v1${path}`,
  headers: [
    ['authorization', `Bearer ${key}`],
    ['content-type', 'application/json'],
  ] as [string, string][],
  body: JSON.stringify(body),
});

const chat = (stream: boolean, model = 'llama-3.3-70b') =>
  post('/chat/completions', {
    model,
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 8,
    stream,
  });

beforeAll(async () => {
  node = await startRpcStandIn('solana');
  upstream = await startChatServer();
  const { key: upstreamKey } = await upstream.account('5');
  server = await startChatServer({
    env: { RPC_UPSTREAM_SOLANA_MAINNET: node.url, CHAT_UPSTREAM_KEY: upstreamKey },
    catalogYaml: stringify({
      models: {
        'via-upstream': {
          ...defaults.models['llama-3.3-70b'],
          provider: {
            kind: 'openai-compatible',
            name: 'upstream',
            baseUrl: upstream.base,
            apiKeyEnv: 'CHAT_UPSTREAM_KEY',
            upstreamModel: 'llama-3.3-70b',
          },
        },
      },
    }),
  });
  ({ key } = await server.account('5'));
  countSignals();
}, 60_000);

afterAll(async () => {
  for (const undo of restore.reverse()) undo();
  await server?.close();
  await upstream?.close();
  await node?.close();
});

describe('the signals a request makes', () => {
  test('behavior: an operation whose handler never reads its signal makes none', async () => {
    // Twice: the first request of a kind may do work of its own (a list built once).
    for (let i = 0; i < 2; i++) {
      expect(await signalsOf({ method: 'GET', target: '/api/v1/models' })).toEqual({ status: 200, count: 0 });
    }
  });

  test("behavior: a chat on the local engine makes none, streamed or not (the time limit aborts the request's own)", async () => {
    for (const stream of [false, true, false]) {
      expect(await signalsOf(chat(stream))).toEqual({ status: 200, count: 0 });
    }
  });

  test('behavior: a chat through the upstream adapter makes none, streamed or not, on either server', async () => {
    for (const stream of [true, false, true]) {
      const answer = await send(server.origin, chat(stream, 'via-upstream'));
      expect(answer.headers.get('x-service-model-router')).toBe('upstream');
      expect(await signalsOf(chat(stream, 'via-upstream'))).toEqual({ status: 200, count: 0 });
    }
  });

  test('behavior: a JSON-RPC call makes none; the node was called', async () => {
    const before = node.requests.length;
    const call = post('/crypto/rpc/solana-mainnet', { jsonrpc: '2.0', id: 1, method: 'getSlot' });
    for (let i = 0; i < 2; i++) expect(await signalsOf(call)).toEqual({ status: 200, count: 0 });
    expect(node.requests.length).toBe(before + 2);
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
