/**
 * The mock serves the whole contract: every operation's documented example request, sent to `npm run mock`,
 * gets a response that validates against the spec, for every 2xx media type the operation declares. The
 * streamed chat is checked frame by frame.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createServiceClient } from '../../client/index.ts';
import { readSseEvents } from '../../client/sse.ts';
import { loadChunkExamples, type RunningMock, renderChunkFrames, startMock } from '../../mocks/front.ts';
import {
  bundlePath,
  ContractValidator,
  deref,
  type Example,
  listOperations,
  loadBundle,
  mediaExamples,
  mediaOf,
  type Operation,
  type Parameter,
  parameterExample,
} from '../support/contract.ts';

const doc = loadBundle();
const validator = new ContractValidator(doc);
const operations = listOperations(doc);
let mock: RunningMock;

beforeAll(async () => {
  mock = await startMock({ port: 0, log: () => {} });
});

afterAll(async () => {
  await mock?.close();
});

/** A wallet proof in the header's JSON shape; the mock only checks that the credential is present. */
const SIWX = Buffer.from(
  JSON.stringify({
    address: '0x5268B7a3c9D1e2F4a6B8c0D2e4F6a8B0c2D43999',
    message: 'mock',
    signature: '0x00',
    timestamp: 1795240800000,
    chainId: 8453,
  }),
).toString('base64');

type Case = { name: string; op: Operation; example?: Example; requestMedia?: string; accept: string };

function successMediaTypes(op: Operation): string[] {
  const types = new Set<string>();
  for (const [status, raw] of Object.entries(op.responses)) {
    if (!status.startsWith('2')) continue;
    for (const media of Object.keys((deref(doc, raw).content as object) ?? {})) types.add(media);
  }
  return [...types];
}

function cases(): Case[] {
  const all: Case[] = [];
  for (const op of operations) {
    const body = op.requestBody ? deref(doc, op.requestBody) : undefined;
    const requestMedia = body ? Object.keys(body.content as object)[0] : undefined;
    const examples = requestMedia ? mediaExamples(doc, mediaOf(body, requestMedia)) : [undefined];
    for (const accept of successMediaTypes(op)) {
      for (const example of examples) {
        // A streamed chat request is answered with an event stream, and only a streamed one.
        const streamed = (example?.value as { stream?: unknown } | undefined)?.stream === true;
        if (streamed !== (accept === 'text/event-stream')) continue;
        all.push({
          name: `${op.method.toUpperCase()} ${op.path} ${op.operationId} [${example?.name ?? 'no body'}] accept ${accept}`,
          op,
          accept,
          ...(example ? { example } : {}),
          ...(requestMedia ? { requestMedia } : {}),
        });
      }
    }
  }
  return all;
}

function buildRequest(c: Case): { url: string; init: RequestInit } {
  const { op } = c;
  let path = op.path;
  const query = new URLSearchParams();
  const headers = new Headers({ accept: c.accept });
  for (const parameter of op.parameters as Parameter[]) {
    const value = parameterExample(doc, parameter);
    if (value === undefined) continue;
    if (parameter.in === 'path')
      path = path.replace(`{${parameter.name}}`, encodeURIComponent(String(value)));
    else if (parameter.in === 'query' && parameter.required) {
      for (const item of Array.isArray(value) ? value : [value]) query.append(parameter.name, String(item));
    } else if (parameter.in === 'header' && parameter.required) headers.set(parameter.name, String(value));
  }
  const requirements = op.security;
  const open = requirements.length === 0 || requirements.some((r) => Object.keys(r).length === 0);
  if (!open) {
    if (requirements.some((r) => 'BearerAuth' in r)) headers.set('authorization', 'Bearer mock-admin-key');
    else headers.set('sign-in-with-x', SIWX);
  }
  const init: RequestInit = { method: op.method.toUpperCase(), headers };
  if (c.example && c.requestMedia === 'application/json') {
    headers.set('content-type', 'application/json');
    init.body = JSON.stringify(c.example.value);
  } else if (c.example && c.requestMedia === 'multipart/form-data') {
    const form = new FormData();
    for (const [key, value] of Object.entries(c.example.value as Record<string, unknown>)) {
      if (key === 'file') form.append(key, new Blob([String(value)], { type: 'audio/wav' }), 'sample.wav');
      else form.append(key, String(value));
    }
    init.body = form;
  }
  const qs = query.toString();
  return { url: `${mock.url}${path}${qs ? `?${qs}` : ''}`, init };
}

describe('mock: every operation answers its documented examples within the contract', () => {
  test('behavior: the bundle has every operation of the interface', () => {
    const found = operations.map((op) => `${op.method.toUpperCase()} ${op.path}`).sort();
    expect(found).toEqual(EXPECTED_OPERATIONS.slice().sort());
  });

  test.each(cases().map((c) => [c.name, c] as const))('%s', async (_name, c) => {
    const { url, init } = buildRequest(c);
    const response = await fetch(url, init);
    const mediaType = (response.headers.get('content-type') ?? '').split(';')[0] ?? '';
    const text = await response.text();
    const body = mediaType.endsWith('json') ? { json: JSON.parse(text) as unknown, text } : { text };
    expect(response.status, text.slice(0, 500)).toBeGreaterThanOrEqual(200);
    expect(response.status, text.slice(0, 500)).toBeLessThan(300);
    expect(mediaType).toBe(c.accept);
    expect(validator.checkResponse(c.op, response.status, response.headers, body)).toEqual([]);
  });
});

describe('mock: streamed chat', () => {
  const chunks = loadChunkExamples(bundlePath);
  const chunkSchema = validator.schema('ChatCompletionChunk');
  const chat = {
    model: 'qwen3-235b',
    messages: [{ role: 'user' as const, content: 'Tell me about lighthouses.' }],
    stream: true,
  };

  test('behavior: the spec streams a whole answer: role first, usage last, all valid chunks', () => {
    expect(chunks.length).toBeGreaterThanOrEqual(4);
    for (const chunk of chunks) expect(validator.validate(chunkSchema, chunk)).toEqual([]);
    const first = chunks[0] as { choices: { delta: { role?: string } }[] };
    expect(first.choices[0]?.delta.role).toBe('assistant');
    const last = chunks.at(-1) as { choices: unknown[]; usage?: unknown; cost?: unknown };
    expect(last.choices).toEqual([]);
    expect(last.usage).toBeDefined();
    expect(last.cost).toBeDefined();
  });

  test('behavior: the text/event-stream example is exactly the chunk examples as frames', () => {
    const chatOp = operations.find((op) => op.operationId === 'createChatCompletion');
    expect(chatOp).toBeDefined();
    const ok = validator.response(chatOp as Operation, 200);
    const [example] = mediaExamples(doc, mediaOf(ok, 'text/event-stream'));
    expect(example?.value).toBe(renderChunkFrames(chunks).join(''));
  });

  test('behavior: stream: true gets an SSE stream, frame by frame the chunk examples, then [DONE]', async () => {
    const response = await fetch(`${mock.url}/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer mock-key', 'content-type': 'application/json' },
      body: JSON.stringify(chat),
    });
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(response.body).not.toBeNull();
    const frames: string[] = [];
    for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>))
      frames.push(event.data);
    expect(frames.at(-1)).toBe('[DONE]');
    const streamed = frames.slice(0, -1).map((data) => JSON.parse(data) as Record<string, unknown>);
    expect(streamed).toHaveLength(chunks.length);
    streamed.forEach((chunk, i) => {
      expect(validator.validate(chunkSchema, chunk), `frame ${i}`).toEqual([]);
      expect(chunk).toEqual({ ...chunks[i], model: chat.model });
    });
  });

  test('behavior: the typed client reads the mock stream into chunks and the final usage', async () => {
    const client = createServiceClient({ baseUrl: mock.url, apiKey: 'mock-key' });
    const received = [];
    for await (const chunk of client.streamChatCompletion({ model: chat.model, messages: chat.messages })) {
      received.push(chunk);
    }
    expect(received).toHaveLength(chunks.length);
    expect(received.at(-1)?.usage?.total_tokens).toBeGreaterThan(0);
    const text = received.map((c) => c.choices[0]?.delta.content ?? '').join('');
    expect(text.length).toBeGreaterThan(0);
  });

  test('behavior: a streamed request without credentials gets the x402 discovery 402, not a stream', async () => {
    const response = await fetch(`${mock.url}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(chat),
    });
    expect(response.status).toBe(402);
    expect(response.headers.get('content-type')).not.toMatch(/event-stream/);
  });

  test('behavior: an invalid streamed request gets the documented error, not a stream', async () => {
    const response = await fetch(`${mock.url}/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer mock-key', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'llama-3.3-70b', messages: [], stream: true }),
    });
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toMatch(/json/);
  });

  test('behavior: responses carry the real Date, not the documented example', async () => {
    const before = Date.now() - 2_000;
    const response = await fetch(`${mock.url}/image/styles`);
    const date = Date.parse(response.headers.get('date') ?? '');
    expect(date).toBeGreaterThanOrEqual(Math.floor(before / 1000) * 1000);
    expect(response.headers.get('content-encoding')).toBeNull();
  });

  test('behavior: paths work with and without the /api/v1 base path', async () => {
    const withBase = await fetch(`${mock.url}/models`);
    const withoutBase = await fetch(`${mock.url.replace(/\/api\/v1$/, '')}/models`);
    expect(withBase.status).toBe(200);
    expect(withoutBase.status).toBe(200);
    expect(await withBase.json()).toEqual(await withoutBase.json());
  });
});

describe('mock: no credentials on an inference operation', () => {
  const inference = operations.filter(
    (op) => op.responses['402'] && !op.security.some((r) => Object.keys(r).length === 0),
  );

  test('behavior: every inference operation is covered', () => {
    expect(inference.map((op) => op.operationId)).toEqual(
      expect.arrayContaining([
        'createChatCompletion',
        'generateImage',
        'createEmbedding',
        'callCryptoRpc',
        'queueVideo',
      ]),
    );
  });

  test.each(inference.map((op) => [op.operationId, op] as const))(
    '%s answers 402 with the discovery body and the PAYMENT-REQUIRED header',
    async (_id, op) => {
      const path = op.parameters
        .filter((p) => p.in === 'path')
        .reduce(
          (at, p) => at.replace(`{${p.name}}`, encodeURIComponent(String(parameterExample(doc, p)))),
          op.path,
        );
      const response = await fetch(`${mock.url}${path}`, {
        method: op.method.toUpperCase(),
        ...(op.requestBody ? { headers: { 'content-type': 'application/json' }, body: '{}' } : {}),
      });
      expect(response.status).toBe(402);
      const body = (await response.json()) as Record<string, unknown>;
      expect(validator.checkResponse(op, 402, response.headers, { json: body })).toEqual([]);
      expect(body).toMatchObject({ x402Version: 2, accepts: expect.any(Array) });
      const header = JSON.parse(
        Buffer.from(response.headers.get('payment-required') ?? '', 'base64').toString(),
      );
      const { authOptions: _authOptions, ...requirements } = body;
      expect(header).toEqual(requirements);
    },
  );
});

/** The operations the interface description names (issue: the contract). */
const EXPECTED_OPERATIONS = [
  'POST /chat/completions',
  'POST /image/generate',
  'GET /image/styles',
  'POST /images/generations',
  'POST /embeddings',
  'POST /audio/speech',
  'POST /audio/transcriptions',
  'POST /video/quote',
  'POST /video/queue',
  'POST /video/retrieve',
  'POST /video/complete',
  'POST /decisions',
  'GET /characters',
  'GET /characters/{slug}',
  'GET /models',
  'GET /models/traits',
  'GET /models/compatibility_mapping',
  'GET /api_keys',
  'POST /api_keys',
  'PATCH /api_keys',
  'DELETE /api_keys',
  'GET /api_keys/{id}',
  'GET /api_keys/rate_limits',
  'GET /api_keys/rate_limits/log',
  'GET /billing/balance',
  'GET /billing/usage-history',
  'GET /billing/usage-analytics',
  'POST /crypto/rpc/{network}',
  'GET /crypto/rpc/networks',
  'GET /x402/balance/{walletAddress}',
  'GET /x402/transactions/{walletAddress}',
  'POST /x402/top-up',
];
