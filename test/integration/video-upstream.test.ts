/**
 * The job-based HTTP video adapter over real HTTP, against a second instance of this server (its own worker
 * rendering on the local engine): a job queued on the first instance is queued upstream, polled, downloaded and
 * cleaned up upstream; a resumed job polls the upstream job it already has instead of paying for another; and
 * the adapter's caps: a video larger than allowed and an upstream that never answers.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { createHttpVideoProvider } from '../../server/providers/video/http.ts';
import { VideoProviderError } from '../../server/providers/video/types.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

let upstream: ChatServer;
let gateway: ChatServer;
let upstreamKey = '';
let upstreamAccount = '';
let silent: Server;
let silentBase = '';
/** An upstream job the resume test finished and left stored (the adapter alone does not complete it). */
let finishedUpstreamJob = '';

const request = {
  model: 'wan-2-7-text-to-video',
  prompt: 'paper boats on a canal',
  duration: '5s',
  durationSeconds: 5,
  resolution: '480p',
  aspectRatio: '16:9',
  audio: false,
  seed: 3,
};

const post = (base: string, path: string, body: unknown, key: string) =>
  fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });

beforeAll(async () => {
  upstream = await startChatServer({ env: { VIDEO_WORKER_POLL_MS: '100' } });
  upstream.services.video.worker.start();
  ({ key: upstreamKey, accountId: upstreamAccount } = await upstream.account('10'));
  gateway = await startChatServer({
    env: { VIDEO_UPSTREAM_POLL_MS: '100', VIDEO_RELAY_KEY: upstreamKey },
    catalogYaml: stringify({
      models: {
        'relay-video': {
          type: 'video',
          created: 1761955200,
          provider: {
            kind: 'openai-compatible',
            name: 'relay',
            baseUrl: upstream.base,
            apiKeyEnv: 'VIDEO_RELAY_KEY',
            upstreamModel: 'wan-2-7-text-to-video',
          },
          rateLimits: { paid: { requestsPerMinute: 40 }, partner: { requestsPerMinute: 160 } },
          maxConcurrency: 4,
          video: { pricePerSecond: { '480p': '0.06' } },
          model_spec: {
            name: 'Relay video',
            description: 'Served by another instance.',
            modelSource: 'upstream',
            privacy: 'private',
            offline: false,
            constraints: {
              model_type: 'text-to-video',
              aspect_ratios: ['16:9'],
              resolutions: ['480p'],
              durations: ['5s'],
              audio: false,
              audio_configurable: false,
            },
          },
        },
      },
    }),
  });
  silent = createServer((req) => req.resume()).listen(0, '127.0.0.1'); // accepts, never answers
  await new Promise<void>((resolve) => silent.once('listening', () => resolve()));
  silentBase = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await gateway?.close();
  await upstream?.close();
  silent?.closeAllConnections();
  await new Promise<void>((resolve) => (silent ? silent.close(() => resolve()) : resolve()));
});

describe('video upstream adapter', () => {
  test('behavior: a job on the gateway is queued upstream, polled, downloaded, charged upstream and cleaned up there', async () => {
    const { key, accountId } = await gateway.account('5');
    const res = await post(
      gateway.base,
      '/video/queue',
      { model: 'relay-video', prompt: 'paper boats', duration: '5s', resolution: '480p' },
      key,
    );
    expect(res.status).toBe(200);
    expect(res.headers.get('x-service-model-router')).toBe('relay');
    const job = (await res.json()) as { queue_id: string; model: string };

    expect(await gateway.services.video.worker.runOnce()).toBe(1);
    const stored = await gateway.services.video.jobs.get(job.queue_id);
    expect(stored?.status).toBe('completed');
    const handle = stored?.upstreamHandle as string;
    expect(handle).toBeTruthy();

    const done = await post(gateway.base, '/video/retrieve', job, key);
    expect(done.headers.get('content-type')).toBe('video/mp4');
    expect(
      Buffer.from(await done.arrayBuffer())
        .subarray(4, 8)
        .toString('latin1'),
    ).toBe('ftyp');

    // The gateway charged its caller its own price; the upstream charged the gateway's key its price.
    const gatewayCharges = (await gateway.services.ledger.listEntries(accountId)).filter(
      (e) => e.type === 'CHARGE',
    );
    expect(gatewayCharges.reduce((sum, e) => sum + e.amountNano, 0n)).toBe(-300_000_000n);
    const upstreamCharges = (await upstream.services.ledger.listEntries(upstreamAccount)).filter(
      (e) => e.type === 'CHARGE',
    );
    expect(upstreamCharges.length).toBeGreaterThan(0);
    // The upstream job was completed (deleted) once the gateway had the video.
    expect(await upstream.services.video.jobs.get(handle)).toBeUndefined();
  });

  test('behavior: resuming with a handle polls that upstream job and queues nothing new', async () => {
    const queued = await post(
      upstream.base,
      '/video/queue',
      {
        model: request.model,
        prompt: request.prompt,
        duration: '5s',
        resolution: '480p',
        audio: false,
        seed: 3,
      },
      upstreamKey,
    );
    expect(queued.status).toBe(200);
    const { queue_id } = (await queued.json()) as { queue_id: string };
    finishedUpstreamJob = queue_id;
    const before = (await upstream.services.ledger.listEntries(upstreamAccount, { limit: 1000 })).length;
    const provider = createHttpVideoProvider({
      name: 'relay',
      baseUrl: upstream.base,
      apiKey: upstreamKey,
      upstreamModel: 'wan-2-7-text-to-video',
      pollIntervalMs: 100,
    });
    const handles: string[] = [];
    const result = await provider.generate(request, {
      signal: new AbortController().signal,
      resume: queue_id,
      onHandle: async (h) => {
        handles.push(h);
      },
    });
    expect(result.bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    expect(handles).toEqual([]);
    expect((await upstream.services.ledger.listEntries(upstreamAccount, { limit: 1000 })).length).toBe(
      before,
    );
  });

  test('behavior: a video over the size cap fails; an upstream that never answers times out', async () => {
    const small = createHttpVideoProvider({
      name: 'relay',
      baseUrl: upstream.base,
      apiKey: upstreamKey,
      upstreamModel: 'wan-2-7-text-to-video',
      pollIntervalMs: 100,
      maxBytes: 1_000,
    });
    const tooBig = await small
      .generate(request, {
        signal: new AbortController().signal,
        resume: finishedUpstreamJob,
        onHandle: async () => {},
      })
      .catch((error: unknown) => error);
    expect(tooBig).toBeInstanceOf(VideoProviderError);
    expect((tooBig as VideoProviderError).message).toMatch(/size limit/);

    const mute = createHttpVideoProvider({
      name: 'mute',
      baseUrl: silentBase,
      upstreamModel: 'x',
      requestTimeoutMs: 100,
    });
    const timedOut = await mute
      .generate(request, { signal: new AbortController().signal, onHandle: async () => {} })
      .catch((error: unknown) => error);
    expect(timedOut).toBeInstanceOf(VideoProviderError);
    expect((timedOut as VideoProviderError).kind).toBe('timeout');
  });

  test('behavior: an unknown upstream queue id fails the job instead of polling forever', async () => {
    const provider = createHttpVideoProvider({
      name: 'relay',
      baseUrl: upstream.base,
      apiKey: upstreamKey,
      upstreamModel: 'wan-2-7-text-to-video',
      pollIntervalMs: 100,
    });
    const error = await provider
      .generate(request, {
        signal: new AbortController().signal,
        resume: 'no-such-job',
        onHandle: async () => {},
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(VideoProviderError);
    expect((error as VideoProviderError).kind).toBe('failed');
  });
});
