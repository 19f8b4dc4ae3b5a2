/**
 * `POST /audio/speech` end to end on the embedded eSpeak NG engine and through the OpenAI-compatible upstream
 * adapter: the official `openai` SDK, every produced file read back by a decoder (WAV header and samples,
 * MP3 frames through mpg123, FLAC through libFLAC), determinism, voices, speed, streaming and billing.
 */

import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { FLACDecoder } from '@wasm-audio-decoders/flac';
import { MPEGDecoder } from 'mpg123-decoder';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';

const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};
const kokoro = defaults.models['tts-kokoro'] as Record<string, unknown>;

let server: ChatServer;
let upstream: ChatServer;
let fake: Server;

beforeAll(async () => {
  fake = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"not":"audio"}'));
  }).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => fake.once('listening', () => resolve()));
  const fakeBase = `http://127.0.0.1:${(fake.address() as AddressInfo).port}/v1`;
  upstream = await startChatServer();
  const { key: upstreamKey } = await upstream.account('5');
  server = await startChatServer({
    env: { TTS_UPSTREAM_KEY: upstreamKey },
    catalogYaml: stringify({
      models: {
        'tts-via-second': {
          ...kokoro,
          provider: {
            kind: 'openai-compatible',
            name: 'second',
            baseUrl: upstream.base,
            apiKeyEnv: 'TTS_UPSTREAM_KEY',
            upstreamModel: 'tts-kokoro',
          },
        },
        'tts-broken': {
          ...kokoro,
          provider: { kind: 'openai-compatible', name: 'broken', baseUrl: fakeBase },
        },
        'tts-wav-only': {
          ...kokoro,
          model_spec: {
            ...(kokoro.model_spec as Record<string, unknown>),
            defaultFormat: 'wav',
            supportedFormats: ['wav'],
          },
        },
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

const TEXT = 'Welcome aboard. Your first lesson starts in five minutes.';

async function speak(key: string, body: Record<string, unknown>, base = server.base) {
  const response = await fetch(`${base}/audio/speech`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tts-kokoro', input: TEXT, ...body }),
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  return { response, bytes };
}

/** Parses a canonical PCM WAV file: format fields and the 16-bit samples. */
function readWav(bytes: Buffer) {
  expect(bytes.subarray(0, 4).toString('latin1')).toBe('RIFF');
  expect(bytes.readUInt32LE(4)).toBe(bytes.length - 8);
  expect(bytes.subarray(8, 12).toString('latin1')).toBe('WAVE');
  expect(bytes.subarray(12, 16).toString('latin1')).toBe('fmt ');
  const format = {
    audioFormat: bytes.readUInt16LE(20),
    channels: bytes.readUInt16LE(22),
    sampleRate: bytes.readUInt32LE(24),
    byteRate: bytes.readUInt32LE(28),
    bitsPerSample: bytes.readUInt16LE(34),
  };
  expect(bytes.subarray(36, 40).toString('latin1')).toBe('data');
  const size = bytes.readUInt32LE(40);
  expect(size).toBe(bytes.length - 44);
  const samples = new Int16Array(size / 2);
  for (let i = 0; i < samples.length; i++) samples[i] = bytes.readInt16LE(44 + i * 2);
  return { ...format, samples };
}

const rms = (samples: ArrayLike<number>) => {
  let sum = 0;
  for (let i = 0; i < samples.length; i++) sum += (samples[i] ?? 0) ** 2;
  return Math.sqrt(sum / samples.length);
};

/** Every MP3 frame header in order, walking frame by frame (MPEG-2 layer III, 24 kHz). */
function mp3Frames(bytes: Buffer) {
  let offset = 0;
  let frames = 0;
  while (offset + 4 <= bytes.length) {
    expect(bytes[offset]).toBe(0xff);
    const b1 = bytes[offset + 1] as number;
    const b2 = bytes[offset + 2] as number;
    expect(b1 & 0xe0).toBe(0xe0); // frame sync
    expect((b1 >> 3) & 3).toBe(2); // MPEG-2
    expect((b1 >> 1) & 3).toBe(1); // layer III
    const bitrate = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160][b2 >> 4] as number;
    expect((b2 >> 2) & 3).toBe(1); // 24000 Hz in MPEG-2
    const padding = (b2 >> 1) & 1;
    offset += Math.floor((72 * bitrate * 1000) / 24000) + padding;
    frames++;
  }
  expect(offset).toBe(bytes.length);
  return frames;
}

describe('the openai SDK against the server', () => {
  test('behavior: audio.speech.create gives an MP3 that mpg123 decodes to speech', async () => {
    const { key } = await server.account('1');
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    const response = await client.audio.speech.create({ model: 'tts-kokoro', input: TEXT, voice: 'af_sky' });
    expect(response.headers.get('content-type')).toBe('audio/mpeg');
    const bytes = Buffer.from(await response.arrayBuffer());
    expect(mp3Frames(bytes)).toBeGreaterThan(50);
    const decoder = new MPEGDecoder();
    await decoder.ready;
    const decoded = decoder.decode(new Uint8Array(bytes));
    decoder.free();
    expect(decoded.errors).toEqual([]);
    expect(decoded.sampleRate).toBe(24000);
    expect(decoded.samplesDecoded / 24000).toBeGreaterThan(2);
    expect(rms(decoded.channelData[0] as Float32Array)).toBeGreaterThan(0.01);
    // The OpenAI model name maps to the catalogue's model.
    const alias = await client.audio.speech.create({
      model: 'tts-1',
      input: TEXT,
      voice: 'af_sky' as 'alloy',
    });
    expect(Buffer.from(await alias.arrayBuffer()).equals(bytes)).toBe(true);
  });
});

describe('formats', () => {
  test('behavior: WAV is 16-bit mono PCM at the model rate, real speech, longer for longer text, deterministic', async () => {
    const { key } = await server.account('1');
    const one = await speak(key, { response_format: 'wav' });
    expect(one.response.status).toBe(200);
    expect(one.response.headers.get('content-type')).toBe('audio/wav');
    const wav = readWav(one.bytes);
    expect(wav).toMatchObject({
      audioFormat: 1,
      channels: 1,
      sampleRate: 24000,
      byteRate: 48000,
      bitsPerSample: 16,
    });
    const seconds = wav.samples.length / 24000;
    expect(seconds).toBeGreaterThan(2);
    expect(seconds).toBeLessThan(8);
    expect(rms(wav.samples)).toBeGreaterThan(300);
    const again = await speak(key, { response_format: 'wav' });
    expect(again.bytes.equals(one.bytes)).toBe(true);
    const longer = readWav((await speak(key, { response_format: 'wav', input: `${TEXT} ${TEXT}` })).bytes);
    expect(longer.samples.length).toBeGreaterThan(wav.samples.length * 1.7);
  });

  test('behavior: FLAC decodes (libFLAC) to exactly the WAV samples; PCM is the WAV data chunk', async () => {
    const { key } = await server.account('1');
    const wav = readWav((await speak(key, { response_format: 'wav' })).bytes);
    const flac = await speak(key, { response_format: 'flac' });
    expect(flac.response.headers.get('content-type')).toBe('audio/flac');
    const decoder = new FLACDecoder();
    await decoder.ready;
    const decoded = await decoder.decodeFile(new Uint8Array(flac.bytes));
    decoder.free();
    expect(decoded.errors).toEqual([]);
    expect(decoded.sampleRate).toBe(24000);
    expect(decoded.samplesDecoded).toBe(wav.samples.length);
    const channel = decoded.channelData[0] as Float32Array;
    // The decoder scales to [-1, 1] (its rounding may differ by one step): the samples are the WAV's.
    let worst = 0;
    for (let i = 0; i < channel.length; i++)
      worst = Math.max(worst, Math.abs((channel[i] as number) * 32768 - (wav.samples[i] as number)));
    expect(worst).toBeLessThanOrEqual(1);
    expect(flac.bytes.length).toBeLessThan(wav.samples.length * 2);
    const pcm = await speak(key, { response_format: 'pcm' });
    expect(pcm.response.headers.get('content-type')).toBe('audio/pcm');
    expect(pcm.bytes.equals(Buffer.from(wav.samples.buffer))).toBe(true);
  });

  test('behavior: a format the backends cannot produce is 400 (opus and aac need an upstream); mp3 is the default', async () => {
    const { key } = await server.account('1');
    for (const format of ['opus', 'aac']) {
      const { response, bytes } = await speak(key, { response_format: format });
      expect(response.status).toBe(400);
      expect(JSON.parse(bytes.toString()).error).toMatch(
        new RegExp(`cannot produce ${format} audio on its configured backends`),
      );
    }
    const plain = await speak(key, {});
    expect(plain.response.headers.get('content-type')).toBe('audio/mpeg');
  });

  test('behavior: a format the model does not list is 400; without response_format the model default is used', async () => {
    const { key } = await server.account('1');
    const mp3 = await speak(key, { model: 'tts-wav-only', response_format: 'mp3' });
    expect(mp3.response.status).toBe(400);
    expect(JSON.parse(mp3.bytes.toString()).error).toMatch(/Format mp3 is not offered by model tts-wav-only/);
    const plain = await speak(key, { model: 'tts-wav-only' });
    expect(plain.response.headers.get('content-type')).toBe('audio/wav');
    readWav(plain.bytes);
  });
});

describe('options', () => {
  test('behavior: voices sound different; an unknown voice is 400', async () => {
    const { key } = await server.account('1');
    const sky = await speak(key, { voice: 'af_sky', response_format: 'wav' });
    const adam = await speak(key, { voice: 'am_adam', response_format: 'wav' });
    const emma = await speak(key, { voice: 'bf_emma', response_format: 'wav' });
    expect(adam.bytes.equals(sky.bytes)).toBe(false);
    expect(emma.bytes.equals(sky.bytes)).toBe(false);
    const unknown = await speak(key, { voice: 'nobody' });
    expect(unknown.response.status).toBe(400);
    expect(JSON.parse(unknown.bytes.toString()).error).toMatch(/Voice nobody is not available/);
  });

  test('behavior: speed changes the duration', async () => {
    const { key } = await server.account('1');
    const normal = readWav((await speak(key, { response_format: 'wav' })).bytes).samples.length;
    const fast = readWav((await speak(key, { response_format: 'wav', speed: 2 })).bytes).samples.length;
    const slow = readWav((await speak(key, { response_format: 'wav', speed: 0.6 })).bytes).samples.length;
    expect(fast).toBeLessThan(normal * 0.7);
    expect(slow).toBeGreaterThan(normal * 1.3);
  });

  test('behavior: streaming sends the same bytes with chunked encoding', async () => {
    const { key } = await server.account('1');
    for (const format of ['mp3', 'wav']) {
      const whole = await speak(key, { response_format: format });
      const streamed = await speak(key, { response_format: format, streaming: true });
      expect(streamed.response.status).toBe(200);
      expect(streamed.response.headers.get('transfer-encoding')).toBe('chunked');
      expect(streamed.bytes.equals(whole.bytes)).toBe(true);
    }
  });
});

describe('billing', () => {
  test('behavior: one CHARGE per request at the per-character price', async () => {
    const { key, accountId } = await server.account('1');
    const input = 'Grüße, ünïcode!';
    const { response } = await speak(key, { input });
    expect(response.status).toBe(200);
    const entries = await server.services.ledger.listEntries(accountId, { limit: 100 });
    const charges = entries.filter((e) => e.type === 'CHARGE');
    expect(charges).toHaveLength(1);
    // 3.5 USD per million characters = 3500 nano-USD per character.
    expect(-BigInt(charges[0]?.amountNano as bigint)).toBe(BigInt(Array.from(input).length) * 3500n);
    expect(charges[0]?.modelId).toBe('tts-kokoro');
    expect(charges[0]?.requestId).toBe(response.headers.get('cf-ray'));
  });
});

describe('the OpenAI-compatible upstream adapter', () => {
  test('behavior: a second instance speaks the same bytes; malformed upstream audio is 500 and not charged', async () => {
    const { key, accountId } = await server.account('1');
    const direct = await speak(key, { response_format: 'wav', voice: 'bf_emma' });
    const via = await speak(key, { model: 'tts-via-second', response_format: 'wav', voice: 'bf_emma' });
    expect(via.response.status).toBe(200);
    expect(via.response.headers.get('x-service-model-router')).toBe('second');
    expect(via.bytes.equals(direct.bytes)).toBe(true);
    const before = (await server.services.ledger.listEntries(accountId, { limit: 100 })).length;
    const broken = await speak(key, { model: 'tts-broken' });
    expect(broken.response.status).toBe(500);
    expect((await server.services.ledger.listEntries(accountId, { limit: 100 })).length).toBe(before);
  });
});
