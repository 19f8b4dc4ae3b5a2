/**
 * `POST /audio/transcriptions` through the OpenAI-compatible upstream adapter, against a loopback upstream that
 * parses the multipart form it receives: forwarded file and fields, JSON and text output, timestamps, the
 * 503 without a backend, the 413 upload limit, the 415 of a non-multipart body, the 422 of a refused
 * recording, and billing per audio second. The official `openai` SDK transcribes through it too.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { wavFile } from '../../server/providers/audio/encode.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

type Received = { fields: Record<string, string[]>; file?: { name: string; type: string; bytes: Buffer } };
const received: Received[] = [];
let fake: Server;
let server: ChatServer;

/** 2.5 s of a 16 kHz tone, as WAV. */
const SAMPLE_RATE = 16000;
const tone = new Int16Array(SAMPLE_RATE * 2.5).map((_, i) =>
  Math.round(8000 * Math.sin((2 * Math.PI * 300 * i) / SAMPLE_RATE)),
);
const WAV = wavFile(tone, SAMPLE_RATE);

const VERBOSE = {
  task: 'transcribe',
  language: 'english',
  duration: 2.5,
  text: ' Welcome aboard. Your first lesson.',
  words: [
    { word: 'Welcome', start: 0.1, end: 0.5 },
    { word: 'aboard.', start: 0.5, end: 1.0 },
    { word: 'Your', start: 1.2, end: 1.4 },
    { word: 'first', start: 1.4, end: 1.8 },
    { word: 'lesson.', start: 1.8, end: 2.3 },
  ],
  segments: [
    { id: 0, text: ' Welcome aboard.', start: 0.1, end: 1.0 },
    { id: 1, text: ' Your first lesson.', start: 1.2, end: 2.3 },
  ],
};

async function route(req: IncomingMessage, res: ServerResponse) {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const [, name] = (req.url ?? '').split('/');
  // Parse the multipart form with the platform's own parser.
  const form = await new Request('http://upstream.test/', {
    method: 'POST',
    headers: { 'content-type': req.headers['content-type'] ?? '' },
    body: Buffer.concat(chunks),
  }).formData();
  const entry: Received = { fields: {} };
  for (const [key, value] of form.entries()) {
    if (typeof value === 'string') entry.fields[key] = [...(entry.fields[key] ?? []), value];
    else entry.file = { name: value.name, type: value.type, bytes: Buffer.from(await value.arrayBuffer()) };
  }
  received.push(entry);
  const json = (status: number, payload: unknown) =>
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(payload));
  if (name === 'refuse') return json(422, { error: { message: 'Audio file could not be decoded' } });
  if (name === 'noduration')
    return json(200, { text: 'hello', segments: [{ text: 'hello', start: 0, end: 1.25 }] });
  return json(200, VERBOSE);
}

const whisper = {
  type: 'asr',
  created: 1727740800,
  rateLimits: { paid: { requestsPerMinute: 60 }, partner: { requestsPerMinute: 240 } },
  maxConcurrency: 4,
  model_spec: {
    name: 'Whisper upstream',
    privacy: 'private',
    offline: false,
    pricing: { per_audio_second: '0.0001' },
  },
};

beforeAll(async () => {
  fake = createServer((req, res) => {
    route(req, res).catch((error: unknown) => res.writeHead(500).end(String(error)));
  }).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => fake.once('listening', () => resolve()));
  const base = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  const up = (name: string) => ({
    kind: 'openai-compatible',
    name,
    baseUrl: `${base}/${name}/v1`,
    apiKeyEnv: 'ASR_KEY',
    upstreamModel: 'whisper-1',
  });
  server = await startChatServer({
    env: { ASR_KEY: 'sk-upstream-asr' },
    catalogYaml: stringify({
      models: {
        'whisper-up': { ...whisper, provider: up('good') },
        'whisper-refuse': { ...whisper, provider: up('refuse') },
        'whisper-noduration': { ...whisper, provider: up('noduration') },
      },
    }),
  });
}, 60_000);

afterAll(async () => {
  fake?.closeAllConnections();
  await new Promise<void>((resolve) => (fake ? fake.close(() => resolve()) : resolve()));
  await server?.close();
});

async function transcribe(
  key: string,
  fields: Record<string, string>,
  file: Buffer | null = WAV,
  type = 'audio/wav',
) {
  const form = new FormData();
  if (file) form.append('file', new Blob([new Uint8Array(file)], { type }), 'lesson.wav');
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  const response = await fetch(`${server.base}/audio/transcriptions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}` },
    body: form,
  });
  const text = await response.text();
  return { response, text, json: () => JSON.parse(text) as Record<string, unknown> };
}

describe('transcription through an upstream', () => {
  test('behavior: the file and fields are forwarded; JSON with timestamps comes back', async () => {
    const { key } = await server.account('1');
    const before = received.length;
    const { response, json } = await transcribe(key, {
      model: 'whisper-up',
      timestamps: 'true',
      language: 'en',
    });
    expect(response.status).toBe(200);
    const sent = received[before] as Received;
    expect(sent.file?.bytes.equals(WAV)).toBe(true);
    expect(sent.file?.name).toBe('lesson.wav');
    expect(sent.file?.type).toBe('audio/wav');
    expect(sent.fields).toEqual({
      model: ['whisper-1'],
      response_format: ['verbose_json'],
      language: ['en'],
      'timestamp_granularities[]': ['word', 'segment'],
    });
    expect(json()).toEqual({
      text: 'Welcome aboard. Your first lesson.',
      duration: 2.5,
      timestamps: {
        word: VERBOSE.words,
        segment: [
          { text: 'Welcome aboard.', start: 0.1, end: 1.0 },
          { text: 'Your first lesson.', start: 1.2, end: 2.3 },
        ],
      },
    });
    expect(response.headers.get('x-service-model-router')).toBe('good');
  });

  test('behavior: without timestamps no timings are asked or returned; text output is plain text', async () => {
    const { key } = await server.account('1');
    const before = received.length;
    const plain = await transcribe(key, { model: 'whisper-up' });
    expect(plain.json()).toEqual({ text: 'Welcome aboard. Your first lesson.', duration: 2.5 });
    expect(received[before]?.fields['timestamp_granularities[]']).toBeUndefined();
    const text = await transcribe(key, { model: 'whisper-up', response_format: 'text', timestamps: 'true' });
    expect(text.response.headers.get('content-type')).toMatch(/^text\/plain/);
    expect(text.text).toBe('Welcome aboard. Your first lesson.');
  });

  test('behavior: the openai SDK transcribes through the server', async () => {
    const { key } = await server.account('1');
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    const result = await client.audio.transcriptions.create({
      file: await toFile(WAV, 'lesson.wav', { type: 'audio/wav' }),
      model: 'whisper-up',
    });
    expect(result.text).toBe('Welcome aboard. Your first lesson.');
  });

  test('behavior: billed per audio second from the upstream duration, else the WAV header, else the timings', async () => {
    const { key, accountId } = await server.account('1');
    const first = await transcribe(key, { model: 'whisper-up' });
    expect(first.response.status).toBe(200);
    // Not a WAV file and no duration in the answer: the end of the last segment is billed.
    const second = await transcribe(
      key,
      { model: 'whisper-noduration' },
      Buffer.alloc(4000, 7),
      'audio/mpeg',
    );
    expect(second.json().duration).toBe(1.25);
    const charges = (await server.services.ledger.listEntries(accountId, { limit: 100 }))
      .filter((e) => e.type === 'CHARGE')
      .map((e) => -BigInt(e.amountNano as bigint))
      .sort();
    const third = await transcribe(key, { model: 'whisper-noduration' });
    expect(third.json().duration).toBe(2.5);
    // 0.0001 USD per second = 100 000 nano-USD per second.
    expect(charges.length).toBe(2);
    expect(charges).toEqual([125_000n, 250_000n]);
  });
});

describe('failures', () => {
  test('behavior: no transcription backend configured is 503 with a clear error', async () => {
    const { key } = await server.account('1');
    const { response, json } = await transcribe(key, { model: 'openai/whisper-large-v3' });
    expect(response.status).toBe(503);
    expect(json().error).toBe('No transcription backend is configured for model openai/whisper-large-v3');
  });

  test('behavior: a recording the upstream refuses is 422 and not charged', async () => {
    const { key, accountId } = await server.account('1');
    const { response, json } = await transcribe(key, { model: 'whisper-refuse' });
    expect(response.status).toBe(422);
    expect(json().error).toMatch(/could not be decoded/);
    const entries = await server.services.ledger.listEntries(accountId, { limit: 100 });
    expect(entries.filter((e) => e.type === 'CHARGE')).toHaveLength(0);
  });

  test('behavior: a file over 25 MB is 413; a missing file is 400; a JSON body is 415; an unknown model is 400', async () => {
    const { key } = await server.account('1');
    const big = await transcribe(key, { model: 'whisper-up' }, Buffer.alloc(25 * 1024 * 1024 + 1));
    expect(big.response.status).toBe(413);
    const missing = await transcribe(key, { model: 'whisper-up' }, null);
    expect(missing.response.status).toBe(400);
    const json = await fetch(`${server.base}/audio/transcriptions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'whisper-up' }),
    });
    expect(json.status).toBe(415);
    const unknown = await transcribe(key, { model: 'no-such-asr' });
    expect(unknown.response.status).toBe(400);
    expect(unknown.json().error).toBe('Model no-such-asr was not found');
  });
});
