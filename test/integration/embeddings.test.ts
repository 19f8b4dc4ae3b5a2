/**
 * `POST /embeddings` end to end: the official `openai` SDK (which asks for base64 by default), float and base64
 * encodings, `dimensions`, the input rules, exact billing per input token, and the OpenAI-compatible upstream
 * adapter against a second instance of this server and against loopback upstreams that misbehave.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { countTokens } from '../../server/providers/chat/tokenizer.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

let server: ChatServer;
let upstream: ChatServer;
let fake: Server;
const received: unknown[] = [];

function route(req: IncomingMessage, res: ServerResponse) {
  const [, name] = (req.url ?? '').split('/');
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
      input: string[];
      dimensions?: number;
    };
    received.push(body);
    const json = (status: number, payload: unknown) =>
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(payload));
    if (name === 'busy') return json(429, { error: 'slow down' });
    if (name === 'short') return json(200, { data: [{ index: 0, embedding: [0.1, 0.2] }] });
    if (name === 'nan')
      return json(200, { data: body.input.map((_, index) => ({ index, embedding: 'AADAfw==' })) });
    // `counted`: a well-behaved upstream whose vectors are its index, reporting 5 tokens.
    return json(200, {
      data: body.input
        .map((_, index) => ({
          index,
          embedding: Array.from({ length: body.dimensions ?? 1024 }, () => index),
        }))
        .reverse(),
      usage: { prompt_tokens: 5, total_tokens: 5 },
    });
  });
}

const bge = {
  type: 'embedding',
  created: 1727740800,
  rateLimits: {
    paid: { requestsPerMinute: 500, tokensPerMinute: 1000000 },
    partner: { requestsPerMinute: 2000, tokensPerMinute: 4000000 },
  },
  maxConcurrency: 8,
  model_spec: {
    name: 'Upstream BGE',
    privacy: 'private',
    offline: false,
    embeddingDimensions: 1024,
    maxInputTokens: 8192,
    pricing: { input: '0.15', output: '0.6' },
  },
};

beforeAll(async () => {
  fake = createServer(route).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => fake.once('listening', () => resolve()));
  const fakeBase = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  upstream = await startChatServer();
  const { key: upstreamKey } = await upstream.account('5');
  const up = (name: string) => ({ kind: 'openai-compatible', name, baseUrl: `${fakeBase}/${name}/v1` });
  server = await startChatServer({
    env: { EMBED_UPSTREAM_KEY: upstreamKey },
    catalogYaml: stringify({
      models: {
        'via-second': {
          ...bge,
          provider: {
            kind: 'openai-compatible',
            name: 'second',
            baseUrl: upstream.base,
            apiKeyEnv: 'EMBED_UPSTREAM_KEY',
            upstreamModel: 'text-embedding-bge-m3',
          },
        },
        'busy-embed': { ...bge, provider: up('busy') },
        'short-embed': { ...bge, provider: up('short') },
        'nan-embed': { ...bge, provider: up('nan') },
        'counted-embed': { ...bge, provider: up('counted') },
        'failover-embed': { ...bge, provider: [up('busy'), up('counted')] },
        'no-backend-embed': { ...bge, provider: [] },
      },
    }),
  });
}, 60_000);

afterAll(async () => {
  fake?.closeAllConnections();
  await new Promise<void>((resolve) => (fake ? fake.close(() => resolve()) : resolve()));
  await server?.close();
  await upstream?.close();
});

async function post(key: string, body: unknown, base = server.base) {
  const response = await fetch(`${base}/embeddings`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { response, json: (await response.json()) as EmbeddingBody };
}

type EmbeddingBody = {
  error?: string;
  data: { index: number; embedding: number[] & string }[];
  usage: { prompt_tokens: number };
  model: string;
};

const cosine = (a: number[], b: number[]) => a.reduce((sum, x, i) => sum + x * (b[i] ?? 0), 0);
const TEXTS = [
  'The lighthouse keeper logged the storm at dawn.',
  'At dawn the lighthouse keeper recorded the storm.',
  'Whisk the eggs with sugar and fold in the flour.',
];

describe('the openai SDK against the server', () => {
  test('behavior: embeddings.create (base64 under the hood) and float give the same vectors', async () => {
    const { key } = await server.account('1');
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    const sdk = await client.embeddings.create({ model: 'text-embedding-bge-m3', input: TEXTS });
    expect(sdk.data).toHaveLength(3);
    expect(sdk.data.map((d) => d.index)).toEqual([0, 1, 2]);
    const vectors = sdk.data.map((d) => d.embedding);
    expect(vectors[0]).toHaveLength(1024);
    expect(cosine(vectors[0] as number[], vectors[1] as number[])).toBeGreaterThan(
      cosine(vectors[0] as number[], vectors[2] as number[]) + 0.3,
    );
    const tokens = TEXTS.reduce((sum, text) => sum + countTokens(text), 0);
    expect(sdk.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens });

    const floats = await client.embeddings.create({
      model: 'text-embedding-bge-m3',
      input: TEXTS,
      encoding_format: 'float',
    });
    expect(floats.data.map((d) => d.embedding)).toEqual(vectors);
    // The OpenAI name maps to the catalogue's model.
    const alias = await client.embeddings.create({
      model: 'text-embedding-ada-002',
      input: TEXTS[0] as string,
    });
    expect(alias.model).toBe('text-embedding-bge-m3');
    expect(alias.data[0]?.embedding).toEqual(vectors[0]);
  });
});

describe('request rules', () => {
  test('behavior: base64 is little-endian float32 of the float vector', async () => {
    const { key } = await server.account('1');
    const float = await post(key, { model: 'text-embedding-bge-m3', input: 'one line' });
    const b64 = await post(key, {
      model: 'text-embedding-bge-m3',
      input: 'one line',
      encoding_format: 'base64',
    });
    expect(typeof b64.json.data[0]?.embedding).toBe('string');
    const bytes = Buffer.from(b64.json.data[0]?.embedding as string, 'base64');
    expect(bytes.length).toBe(1024 * 4);
    const decoded = Array.from({ length: 1024 }, (_, i) => bytes.readFloatLE(i * 4));
    expect(decoded).toEqual(float.json.data[0]?.embedding);
  });

  test('behavior: token-id arrays, empty strings and unknown fields are refused with 400', async () => {
    const { key } = await server.account('1');
    for (const input of [[1, 2, 3], [[1, 2]], '', [], ['ok', '']]) {
      const { response, json } = await post(key, { model: 'text-embedding-bge-m3', input });
      expect(response.status).toBe(400);
      expect(typeof json.error).toBe('string');
    }
    const extra = await post(key, { model: 'text-embedding-bge-m3', input: 'x', surprise: 1 });
    expect(extra.response.status).toBe(400);
  });

  test('behavior: dimensions shortens vectors where the model allows it, is ignored elsewhere, and is bounded', async () => {
    const { key } = await server.account('1');
    const full = await post(key, { model: 'text-embedding-qwen3-8b', input: 'nested dolls' });
    expect(full.json.data[0]?.embedding).toHaveLength(4096);
    const short = await post(key, {
      model: 'text-embedding-qwen3-8b',
      input: 'nested dolls',
      dimensions: 256,
    });
    expect(short.json.data[0]?.embedding).toHaveLength(256);
    const norm = Math.sqrt(
      (short.json.data[0]?.embedding ?? []).reduce((s: number, x: number) => s + x * x, 0),
    );
    expect(norm).toBeCloseTo(1, 5);
    const ignored = await post(key, {
      model: 'text-embedding-bge-m3',
      input: 'nested dolls',
      dimensions: 256,
    });
    expect(ignored.json.data[0]?.embedding).toHaveLength(1024);
    const tooLong = await post(key, { model: 'text-embedding-qwen3-8b', input: 'x', dimensions: 5000 });
    expect(tooLong.response.status).toBe(400);
    expect(tooLong.json.error).toMatch(/at most 4096/);
  });

  test('behavior: an input over the model token limit is 400; an unknown model is 404; no backend is 503', async () => {
    const { key } = await server.account('1');
    const long = await post(key, { model: 'text-embedding-bge-m3', input: ['fine', 'word '.repeat(9000)] });
    expect(long.response.status).toBe(400);
    expect(long.json.error).toMatch(/Input 1 has \d+ tokens/);
    const unknown = await post(key, { model: 'no-such-embedder', input: 'x' });
    expect(unknown.response.status).toBe(404);
    const offline = await post(key, { model: 'no-backend-embed', input: 'x' });
    expect(offline.response.status).toBe(503);
    expect(offline.json.error).toMatch(/No embedding backend/);
  });
});

describe('billing', () => {
  test('behavior: one CHARGE per request at the input price, with request and model ids', async () => {
    const { key, accountId } = await server.account('1');
    const input = ['alpha beta gamma', 'delta epsilon'];
    const { response, json } = await post(key, { model: 'text-embedding-bge-m3', input });
    expect(response.status).toBe(200);
    const tokens = countTokens(input[0] as string) + countTokens(input[1] as string);
    expect(json.usage.prompt_tokens).toBe(tokens);
    const entries = await server.services.ledger.listEntries(accountId, { limit: 100 });
    const charges = entries.filter((e) => e.type === 'CHARGE');
    expect(charges).toHaveLength(1);
    const charge = charges[0] as (typeof charges)[number];
    // 0.15 USD per million tokens = 150 nano-USD per token.
    expect(-BigInt(charge.amountNano as bigint)).toBe(
      (BigInt(tokens) * 150_000_000n + 999_999n) / 1_000_000n,
    );
    expect(charge.modelId).toBe('text-embedding-bge-m3');
    expect(charge.requestId).toBe(response.headers.get('cf-ray'));
  });

  test('behavior: a caller without credit gets 402 and nothing is charged', async () => {
    const { key, accountId } = await server.account('0');
    const { response } = await post(key, { model: 'text-embedding-bge-m3', input: 'x' });
    expect(response.status).toBe(402);
    const entries = await server.services.ledger.listEntries(accountId, { limit: 100 });
    expect(entries.filter((e) => e.type === 'CHARGE')).toHaveLength(0);
  });
});

describe('the OpenAI-compatible upstream adapter', () => {
  test('behavior: a second instance serves the vectors; the router header names it', async () => {
    const { key } = await server.account('1');
    const via = await post(key, { model: 'via-second', input: TEXTS });
    expect(via.response.status).toBe(200);
    expect(via.response.headers.get('x-service-model-router')).toBe('second');
    const direct = await post(key, { model: 'text-embedding-bge-m3', input: TEXTS });
    const close = (a: number[], b: number[]) => a.every((x, i) => Math.abs(x - (b[i] as number)) < 1e-6);
    for (const [i, d] of via.json.data.entries())
      expect(close(d.embedding, direct.json.data[i]?.embedding as number[])).toBe(true);
  });

  test('behavior: the upstream usage is billed, vectors are put back in input order', async () => {
    const { key, accountId } = await server.account('1');
    const { json } = await post(key, { model: 'counted-embed', input: ['a', 'b', 'c'] });
    expect(json.data.map((d: { embedding: number[] }) => d.embedding[0])).toEqual([0, 1, 2]);
    expect(json.usage.prompt_tokens).toBe(5);
    const entries = await server.services.ledger.listEntries(accountId, { limit: 100 });
    expect(entries.find((e) => e.type === 'CHARGE')?.units).toBe('0.000005');
  });

  test('behavior: capacity is 503, malformed answers are 500, failover reaches a healthy backend, nothing is charged on failure', async () => {
    const { key, accountId } = await server.account('1');
    expect((await post(key, { model: 'busy-embed', input: 'x' })).response.status).toBe(503);
    expect((await post(key, { model: 'short-embed', input: 'x' })).response.status).toBe(500);
    expect((await post(key, { model: 'nan-embed', input: 'x' })).response.status).toBe(500);
    const entries = await server.services.ledger.listEntries(accountId, { limit: 100 });
    expect(entries.filter((e) => e.type === 'CHARGE')).toHaveLength(0);
    const failover = await post(key, { model: 'failover-embed', input: 'x' });
    expect(failover.response.status).toBe(200);
    expect(failover.response.headers.get('x-service-model-router')).toBe('counted');
  });
});
