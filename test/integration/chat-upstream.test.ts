/**
 * The OpenAI-compatible upstream adapter against real HTTP: a second instance of this server on its local
 * engine, and loopback upstreams that are slow, stall, truncate, fail with 500, refuse with 429 or fail
 * inside the stream. Also: failover and `prompt_cache_key` stickiness across backends, client disconnects
 * (the backend stops, what was produced is billed), the 504 of a long non-streamed request, and the per-model
 * concurrency cap.
 */
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { readSseEvents } from '../../client/sse.ts';
import type { ChatCompletion } from '../../generated/api.d.ts';
import { type ChatServer, postWatchingWrites, startChatServer } from '../support/chat-server.ts';
import { ContractValidator, loadBundle, repoRoot } from '../support/contract.ts';

const validator = new ContractValidator(loadBundle());
const eventSchema = validator.schema('ChatCompletionStreamEvent');

const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};
const llama = defaults.models['llama-3.3-70b'] as Record<string, unknown>;

/** A catalogue override with llama-like models routed to the given backends. */
function catalog(models: Record<string, { provider: unknown; maxConcurrency?: number }>): string {
  return stringify({
    models: Object.fromEntries(
      Object.entries(models).map(([id, m]) => [
        id,
        { ...llama, provider: m.provider, maxConcurrency: m.maxConcurrency ?? 32 },
      ]),
    ),
  });
}

// ---------------------------------------------------------------------------------------------------------
// Loopback upstreams

const chunk = (content: string, extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: null }], ...extra })}\n\n`;
const finish = `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n`;
const usage = `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: { prompt_tokens: 30, completion_tokens: 4, total_tokens: 34 } })}\n\n`;

let fake: Server;
let fakeBase = '';
const held: ServerResponse[] = [];

function route(req: IncomingMessage, res: ServerResponse) {
  const [, name] = (req.url ?? '').split('/');
  req.resume();
  const sse = () => res.writeHead(200, { 'content-type': 'text/event-stream' });
  switch (name) {
    case 'slow':
      held.push(res); // never answers
      return;
    case 'stall':
      sse();
      res.write(chunk('Hello'));
      held.push(res);
      return;
    case 'truncate':
      sse();
      res.write(chunk('Hello'));
      res.end(chunk(' wor'));
      return;
    case 'fail500':
      res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":"boom"}');
      return;
    case 'busy429':
      res
        .writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' })
        .end('{"error":"slow down"}');
      return;
    case 'reject400':
      res
        .writeHead(400, { 'content-type': 'application/json' })
        .end('{"error":{"message":"context too long"}}');
      return;
    case 'whole':
      // The whole answer in one write (headers included), as a fast upstream's arrives.
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`${chunk('all at once')}${finish}${usage}data: [DONE]\n\n`);
      return;
    case 'linger':
      // `[DONE]`, then the body left open (its last marker not sent) until the test ends it.
      sse();
      res.write(`${chunk('done early')}${finish}${usage}data: [DONE]\n\n`);
      held.push(res);
      return;
    case 'midfail':
      sse();
      res.write(chunk('Hello'));
      res.end(
        `data: ${JSON.stringify({ error: { message: 'backend crashed', type: 'server_error', code: 'upstream_error' } })}\n\n`,
      );
      return;
    default: {
      // `alpha`, `beta`, …: a well-behaved upstream that names itself.
      sse();
      res.write(chunk(`served by ${name}`));
      res.end(`${finish}${usage}data: [DONE]\n\n`);
    }
  }
}

let upstream: ChatServer; // the second instance, on its local engine
let upstreamKey = '';
let upstreamAccount = '';
let gateway: ChatServer;
let gatewayKey = '';

beforeAll(async () => {
  fake = createServer(route).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => fake.once('listening', () => resolve()));
  fakeBase = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  upstream = await startChatServer({ env: { LOCAL_CHAT_TOKEN_DELAY_MS: '1' } });
  ({ key: upstreamKey, accountId: upstreamAccount } = await upstream.account('20'));
  const up = (name: string, extra: Record<string, unknown> = {}) => ({
    kind: 'openai-compatible',
    name,
    baseUrl: `${fakeBase}/${name}/v1`,
    ...extra,
  });
  gateway = await startChatServer({
    env: { UPSTREAM_B_KEY: upstreamKey, UPSTREAM_TIMEOUT_MS: '400' },
    catalogYaml: catalog({
      'via-b': {
        provider: {
          kind: 'openai-compatible',
          name: 'second',
          baseUrl: upstream.base,
          apiKeyEnv: 'UPSTREAM_B_KEY',
          upstreamModel: 'llama-3.3-70b',
          timeoutMs: 30_000,
        },
      },
      'slow-model': { provider: up('slow') },
      'stall-model': { provider: up('stall') },
      'trunc-model': { provider: up('truncate') },
      'fail-model': { provider: up('fail500') },
      'busy-model': { provider: up('busy429') },
      'reject-model': { provider: up('reject400') },
      'midfail-model': { provider: up('midfail') },
      'whole-model': { provider: up('whole') },
      // Its own time limit, far over the test's: only the upstream's [DONE] can end the answer in time.
      'linger-model': { provider: up('linger', { timeoutMs: 60_000 }) },
      'multi-model': { provider: [up('alpha'), up('beta'), up('gamma')] },
      'failover-model': { provider: [up('fail500'), up('busy429'), up('delta')] },
    }),
  });
  ({ key: gatewayKey } = await gateway.account('20'));
}, 60_000);

afterAll(async () => {
  for (const res of held) res.destroy();
  fake?.closeAllConnections();
  await new Promise<void>((resolve) => (fake ? fake.close(() => resolve()) : resolve()));
  await gateway?.close();
  await upstream?.close();
});

const USER = [{ role: 'user' as const, content: 'Tell me about rivers and mountains.' }];

async function call(server: ChatServer, key: string, body: Record<string, unknown>, signal?: AbortSignal) {
  return fetch(`${server.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ messages: USER, ...body }),
    ...(signal ? { signal } : {}),
  });
}

async function events(response: Response) {
  const out: { data: string; json?: Record<string, unknown> }[] = [];
  for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>)) {
    if (event.data === '[DONE]') {
      out.push({ data: event.data });
      continue;
    }
    const json = JSON.parse(event.data) as Record<string, unknown>;
    expect(validator.validate(eventSchema, json)).toEqual([]);
    out.push({ data: event.data, json });
  }
  return out;
}

async function waitFor<T>(read: () => Promise<T>, ok: (value: T) => boolean): Promise<T> {
  for (let i = 0; i < 200; i++) {
    const value = await read();
    if (ok(value)) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
  return read();
}

/**
 * Reads a stream until it has delivered `frames` chunks with visible content, so that output was certainly
 * produced (a fixed number of reads can end before the first token on a loaded machine).
 */
async function readContentFrames(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  frames: number,
): Promise<void> {
  const decoder = new TextDecoder();
  let text = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    text += decoder.decode(value, { stream: true });
    if ((text.match(/"content":"[^"]/g) ?? []).length >= frames) return;
  }
}

/** The account's CHARGE entries, once the captures the answers did not wait for are in. */
async function chargesOf(server: ChatServer, accountId: string) {
  await server.services.charges.idle();
  const entries = await server.services.ledger.listEntries(accountId, { limit: 1000 });
  return entries.filter((e) => e.type === 'CHARGE');
}

describe('against a second instance of the server', () => {
  test('behavior: the answer, usage and cost match the second instance answering directly; the key is sent', async () => {
    const body = { seed: 17, service_parameters: { include_service_system_prompt: false } };
    const via = await call(gateway, gatewayKey, { model: 'via-b', ...body });
    expect(via.status).toBe(200);
    expect(via.headers.get('x-service-model-router')).toBe('second');
    const viaJson = (await via.json()) as ChatCompletion;
    const direct = (await (
      await call(upstream, upstreamKey, { model: 'llama-3.3-70b', seed: 17 })
    ).json()) as ChatCompletion;
    expect(viaJson.choices?.[0]?.message).toMatchObject({ content: direct.choices?.[0]?.message.content });
    expect(viaJson.usage.prompt_tokens).toBe(direct.usage.prompt_tokens);
    expect(viaJson.usage.completion_tokens).toBe(direct.usage.completion_tokens);
    expect(viaJson.cost).toEqual(direct.cost);
    expect(viaJson.model).toBe('via-b');
    // Upstream latency and outcome reach the metrics.
    const metrics = await (await fetch(`${gateway.origin}/metrics`)).text();
    expect(metrics).toMatch(/upstream_request_duration_seconds_count\{upstream="chat:second:ok"\} [1-9]/);
  });

  test('behavior: a streamed answer passes through chunk by chunk and ends with usage, cost and [DONE]', async () => {
    const body = { seed: 18, service_parameters: { include_service_system_prompt: false } };
    const plain = (await (
      await call(gateway, gatewayKey, { model: 'via-b', ...body })
    ).json()) as ChatCompletion;
    const list = await events(await call(gateway, gatewayKey, { model: 'via-b', stream: true, ...body }));
    expect(list.at(-1)?.data).toBe('[DONE]');
    const last = list.at(-2)?.json as { choices: unknown[]; usage: unknown; cost: unknown };
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual(plain.usage);
    const text = list
      .flatMap((e) =>
        ((e.json?.choices as { delta: { content?: string } }[] | undefined) ?? []).map(
          (c) => c.delta.content ?? '',
        ),
      )
      .join('');
    expect(text).toBe(plain.choices?.[0]?.message.content);
    expect(
      list.filter((e) => e.json?.choices && (e.json.choices as unknown[]).length > 0).length,
    ).toBeGreaterThan(10);
  });

  test('behavior: a client that disconnects stops the upstream; both instances bill only what was produced', {
    timeout: 60_000,
  }, async () => {
    const { key, accountId } = await gateway.account('5');
    const before = (await chargesOf(upstream, upstreamAccount)).length;
    const aborter = new AbortController();
    const response = await call(
      gateway,
      key,
      {
        model: 'via-b',
        stream: true,
        messages: [{ role: 'user', content: 'Write 3000 words about rivers.' }],
      },
      aborter.signal,
    );
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    await readContentFrames(reader, 3);
    aborter.abort();
    const mine = await waitFor(
      () => chargesOf(gateway, accountId),
      (list) => list.some((e) => e.sku === 'chat.output_tokens'),
    );
    const output = mine.find((e) => e.sku === 'chat.output_tokens');
    expect(Number(output?.units) * 1e6).toBeGreaterThan(0);
    expect(Number(output?.units) * 1e6).toBeLessThan(3000);
    const theirs = await waitFor(
      () => chargesOf(upstream, upstreamAccount),
      (list) => list.length > before + 1,
    );
    const upstreamOutput = theirs.slice(before).find((e) => e.sku === 'chat.output_tokens');
    expect(Number(upstreamOutput?.units) * 1e6).toBeLessThan(3000);
    expect((await gateway.services.ledger.getBalance(accountId)).usdReservedNano).toBe(0n);
  });
});

describe('streaming without extra writes', () => {
  test('behavior: an upstream answer read at once leaves the gateway in one socket write, its final frames included', async () => {
    const { text: body, writes } = await postWatchingWrites(gateway, gatewayKey, '/chat/completions', {
      model: 'whole-model',
      stream: true,
      messages: USER,
    });
    expect(body).toContain('"content":"all at once"');
    expect(body).toContain('"usage":');
    expect(body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(writes).toHaveLength(1);
  });

  test("behavior: the answer ends at the upstream's [DONE], without waiting for the upstream to end its body", async () => {
    const before = held.length;
    const list = await events(await call(gateway, gatewayKey, { model: 'linger-model', stream: true }));
    // The gateway's answer is complete while the upstream's body is still open.
    expect(held.length).toBe(before + 1);
    expect((held.at(-1) as ServerResponse).writableEnded).toBe(false);
    expect(list.at(-1)?.data).toBe('[DONE]');
    expect(list.some((e) => JSON.stringify(e.json ?? {}).includes('done early'))).toBe(true);
    (held.at(-1) as ServerResponse).end();
  });
});

describe('upstream failures', () => {
  test('behavior: no answer in time is 504 recommending stream; a stall inside a stream is an in-band error', async () => {
    const slow = await call(gateway, gatewayKey, { model: 'slow-model' });
    expect(slow.status).toBe(504);
    expect(((await slow.json()) as { error: string }).error).toContain('stream=true');
    const stalled = await events(await call(gateway, gatewayKey, { model: 'stall-model', stream: true }));
    expect(stalled.at(-1)?.data).toBe('[DONE]');
    expect(stalled.at(-2)?.json?.error).toMatchObject({ type: 'server_error', code: 'timeout' });
  });

  test('behavior: a truncated upstream stream is 500 when not streamed, an in-band error when streamed, never a clean end', async () => {
    const plain = await call(gateway, gatewayKey, { model: 'trunc-model' });
    expect(plain.status).toBe(500);
    expect(await plain.json()).toMatchObject({ error: 'Inference processing failed' });
    const list = await events(await call(gateway, gatewayKey, { model: 'trunc-model', stream: true }));
    expect(list.at(-1)?.data).toBe('[DONE]');
    expect(list.at(-2)?.json?.error).toMatchObject({ type: 'server_error', code: 'upstream_error' });
    expect(list.some((e) => e.json?.usage)).toBe(false);
  });

  test('behavior: 500 maps to 500, 429 to 503 at capacity with Retry-After, 400 to 400 with the reason', async () => {
    const failed = await call(gateway, gatewayKey, { model: 'fail-model' });
    expect(failed.status).toBe(500);
    const busy = await call(gateway, gatewayKey, { model: 'busy-model', stream: true });
    expect(busy.status).toBe(503);
    expect(busy.headers.get('retry-after')).toBe('7');
    expect(await busy.json()).toMatchObject({ error: 'The model is at capacity. Please try again later.' });
    const rejected = await call(gateway, gatewayKey, { model: 'reject-model' });
    expect(rejected.status).toBe(400);
    expect(((await rejected.json()) as { error: string }).error).toContain('context too long');
  });

  test('behavior: an error event inside the upstream stream becomes an in-band error; delivered output is billed', async () => {
    const { key, accountId } = await gateway.account('1');
    const list = await events(await call(gateway, key, { model: 'midfail-model', stream: true }));
    const contents = list.flatMap((e) =>
      ((e.json?.choices as { delta: { content?: string } }[] | undefined) ?? []).map(
        (c) => c.delta.content ?? '',
      ),
    );
    expect(contents.join('')).toBe('Hello');
    expect(list.at(-2)?.json?.error).toMatchObject({ message: 'Inference processing failed' });
    const charges = await chargesOf(gateway, accountId);
    expect(charges.find((e) => e.sku === 'chat.output_tokens')?.units).toBe(String(1 / 1e6));
    expect((await gateway.services.ledger.getBalance(accountId)).usdReservedNano).toBe(0n);
  });

  test('behavior: nothing is charged when the upstream fails before answering', async () => {
    const { key, accountId } = await gateway.account('1');
    expect((await call(gateway, key, { model: 'fail-model' })).status).toBe(500);
    expect(await chargesOf(gateway, accountId)).toEqual([]);
    expect((await gateway.services.ledger.getBalance(accountId)).usdReservedNano).toBe(0n);
  });
});

describe('idempotency while in flight', () => {
  test('behavior: a duplicate while the first is still running is 409; a failed first lets a retry run', async () => {
    const { key } = await gateway.account('1');
    const before = held.length;
    const headers = {
      authorization: `Bearer ${key}`,
      'content-type': 'application/json',
      'idempotency-key': 'slow-1',
    };
    const body = JSON.stringify({ model: 'slow-model', messages: USER });
    const first = fetch(`${gateway.base}/chat/completions`, { method: 'POST', headers, body });
    await waitFor(
      async () => held.length,
      (n) => n > before,
    );
    const duplicate = await fetch(`${gateway.base}/chat/completions`, { method: 'POST', headers, body });
    expect(duplicate.status).toBe(409);
    expect((await first).status).toBe(504);
    // The first failed before anything chargeable: the key is free again.
    const retry = await fetch(`${gateway.base}/chat/completions`, { method: 'POST', headers, body });
    expect(retry.status).toBe(504);
  });
});

describe('routing', () => {
  test('behavior: the same prompt_cache_key always reaches the same backend; different keys spread', async () => {
    const routers = new Map<string, Set<string>>();
    for (const conversation of ['conv-1', 'conv-2', 'conv-3', 'conv-4', 'conv-5', 'conv-6']) {
      for (let turn = 0; turn < 3; turn++) {
        const response = await call(gateway, gatewayKey, {
          model: 'multi-model',
          prompt_cache_key: conversation,
        });
        const json = (await response.json()) as ChatCompletion;
        const router = response.headers.get('x-service-model-router') ?? '';
        expect(json.choices?.[0]?.message.content).toBe(`served by ${router}`);
        routers.set(conversation, (routers.get(conversation) ?? new Set()).add(router));
      }
    }
    for (const set of routers.values()) expect(set.size).toBe(1);
    expect(new Set([...routers.values()].flatMap((s) => [...s])).size).toBeGreaterThan(1);
    // Without a key, the first backend in order of preference.
    const plain = await call(gateway, gatewayKey, { model: 'multi-model' });
    expect(plain.headers.get('x-service-model-router')).toBe('alpha');
  });

  test('behavior: a backend that fails before answering is skipped for the next one', async () => {
    const response = await call(gateway, gatewayKey, { model: 'failover-model' });
    expect(response.status).toBe(200);
    expect(response.headers.get('x-service-model-router')).toBe('delta');
  });

  test('behavior: upstream usage is what gets billed', async () => {
    const { key, accountId } = await gateway.account('1');
    const response = await call(gateway, key, { model: 'multi-model' });
    const json = (await response.json()) as ChatCompletion;
    expect(json.usage).toMatchObject({ prompt_tokens: 30, completion_tokens: 4, total_tokens: 34 });
    const charged = -(await chargesOf(gateway, accountId)).reduce((sum, e) => sum + e.amountNano, 0n);
    expect(charged).toBe(30n * 700n + 4n * 2800n);
  });
});

describe('local engine limits', () => {
  let local: ChatServer;
  beforeAll(async () => {
    local = await startChatServer({
      env: { LOCAL_CHAT_TOKEN_DELAY_MS: '3', CHAT_TIMEOUT_MS: '300' },
      catalogYaml: catalog({ solo: { provider: { kind: 'local' }, maxConcurrency: 1 } }),
    });
  });
  afterAll(async () => {
    await local?.close();
  });

  test('behavior: a long non-streamed request is 504 recommending stream and charged nothing; streamed it runs', async () => {
    const { key, accountId } = await local.account('5');
    const long = {
      model: 'llama-3.3-70b',
      messages: [{ role: 'user', content: 'Write 500 words about rivers.' }],
    };
    const response = await call(local, key, long);
    expect(response.status).toBe(504);
    expect(((await response.json()) as { error: string }).error).toContain('stream=true');
    expect(await chargesOf(local, accountId)).toEqual([]);
    const list = await events(await call(local, key, { ...long, stream: true }));
    expect(list.at(-2)?.json?.usage).toBeDefined();
  });

  test('behavior: a client that disconnects mid-stream is billed for what was produced, and the slot is freed', {
    timeout: 60_000,
  }, async () => {
    const { key, accountId } = await local.account('5');
    const aborter = new AbortController();
    const response = await call(
      local,
      key,
      {
        model: 'solo',
        stream: true,
        messages: [{ role: 'user', content: 'Write 3000 words about rivers.' }],
      },
      aborter.signal,
    );
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    // The only slot is taken: the model is at capacity.
    const second = await call(local, key, { model: 'solo' });
    expect(second.status).toBe(503);
    expect(await second.json()).toMatchObject({ error: 'The model is at capacity. Please try again later.' });
    await readContentFrames(reader, 3);
    aborter.abort();
    const charges = await waitFor(
      () => chargesOf(local, accountId),
      (list) => list.some((e) => e.sku === 'chat.output_tokens'),
    );
    const tokens = Number(charges.find((e) => e.sku === 'chat.output_tokens')?.units) * 1e6;
    expect(tokens).toBeGreaterThan(0);
    expect(tokens).toBeLessThan(3000);
    expect((await local.services.ledger.getBalance(accountId)).usdReservedNano).toBe(0n);
    const third = await waitFor(
      async () => (await call(local, key, { model: 'solo', max_completion_tokens: 5 })).status,
      (status) => status === 200,
    );
    expect(third).toBe(200);
  });
});
