/**
 * The video lifecycle through the real server on SQLite: quote, queue (charged in full), the worker driven
 * directly, retrieve (PROCESSING, then the MP4 read by a real decoder), deletion on complete and with
 * `delete_media_on_completion`, consent, the local engine's determinism and image-to-video, failed jobs refunded
 * (a loopback upstream that fails), and a lease taken over from a dead worker.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { createVideoService } from '../../server/domains/video/service.ts';
import { createVideoWorker } from '../../server/domains/video/worker.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { bundledFfmpegPath } from '../../server/providers/video/local.ts';
import type { VideoProvider } from '../../server/providers/video/types.ts';
import { createVideoJobs } from '../../server/storage/video-jobs.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

const require = createRequire(import.meta.url);
const ffprobe = (require('@ffprobe-installer/ffprobe') as { path: string }).path;
const ffmpeg = bundledFfmpegPath() as string;
const scratch = mkdtempSync(join(tmpdir(), 'video-test-'));

type Probe = {
  streams: Array<{
    codec_type: string;
    codec_name: string;
    width?: number;
    height?: number;
    nb_frames?: string;
  }>;
  format: { format_name: string; duration: string };
};

/** Probes and fully decodes an MP4 with the real ffprobe/ffmpeg; throws when either cannot read it. */
function decode(bytes: Buffer, name: string): Probe {
  const file = join(scratch, name);
  writeFileSync(file, bytes);
  const probe = JSON.parse(
    execFileSync(ffprobe, ['-v', 'error', '-show_streams', '-show_format', '-of', 'json', file], {
      encoding: 'utf8',
    }),
  ) as Probe;
  // Decode every frame: a broken stream makes ffmpeg exit non-zero.
  execFileSync(ffmpeg, ['-v', 'error', '-xerror', '-i', file, '-f', 'null', '-']);
  return probe;
}

const post = (server: ChatServer, path: string, body: unknown, key?: string) =>
  fetch(`${server.base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify(body),
  });

// ---------------------------------------------------------------------------------------------------------
// A loopback job-based upstream whose jobs fail the way the test names them.

let upstream: Server;
let upstreamBase = '';
function upstreamRoute(req: IncomingMessage, res: ServerResponse) {
  let raw = '';
  req.on('data', (c: Buffer) => {
    raw += c.toString();
  });
  req.on('end', () => {
    const body = raw ? (JSON.parse(raw) as { model?: string; queue_id?: string }) : {};
    const json = (status: number, value: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(value));
    };
    if (req.url === '/v1/video/queue') return json(200, { model: body.model, queue_id: `up-${body.model}` });
    if (req.url === '/v1/video/retrieve') {
      if (body.model === 'refuses')
        return json(422, {
          error: 'Refused by the upstream content policy',
          code: 'CONTENT_POLICY_VIOLATION',
          creditsRefunded: true,
          recommendedModel: 'wan-2-7-text-to-video',
        });
      if (body.model === 'breaks') return json(500, { error: 'GPU fell over' });
      if (body.model === 'garbage') {
        res.writeHead(200, { 'content-type': 'video/mp4' });
        return res.end('this is not a video');
      }
    }
    json(404, { error: 'not found' });
  });
}

const videoModel = (provider: unknown) => ({
  type: 'video',
  created: 1761955200,
  provider,
  rateLimits: { paid: { requestsPerMinute: 40 }, partner: { requestsPerMinute: 160 } },
  maxConcurrency: 4,
  video: { pricePerSecond: { '480p': '0.05', '720p': '0.08' }, audioPricePerSecond: '0.02' },
  model_spec: {
    name: 'Test video',
    description: 'A video model routed to a loopback upstream.',
    modelSource: 'test',
    privacy: 'private',
    offline: false,
    constraints: {
      model_type: 'text-to-video',
      aspect_ratios: ['16:9'],
      resolutions: ['480p', '720p'],
      durations: ['5s'],
      audio: true,
      audio_configurable: true,
    },
  },
});

let server: ChatServer;

beforeAll(async () => {
  upstream = createServer(upstreamRoute).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => upstream.once('listening', () => resolve()));
  upstreamBase = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
  const backend = (name: string) => ({
    kind: 'openai-compatible',
    baseUrl: upstreamBase,
    upstreamModel: name,
  });
  server = await startChatServer({
    env: { VIDEO_UPSTREAM_POLL_MS: '10' },
    catalogYaml: stringify({
      models: {
        'video-refuses': videoModel(backend('refuses')),
        'video-breaks': videoModel(backend('breaks')),
        'video-garbage': videoModel(backend('garbage')),
      },
    }),
  });
});

afterAll(async () => {
  await server?.close();
  upstream?.closeAllConnections();
  await new Promise<void>((resolve) => (upstream ? upstream.close(() => resolve()) : resolve()));
  rmSync(scratch, { recursive: true, force: true });
});

async function ledgerOf(accountId: string) {
  return server.services.ledger.listEntries(accountId, { limit: 1000 });
}

describe('quoteVideo', () => {
  test('behavior: the price is seconds × the resolution price, plus audio; no credentials needed', async () => {
    const quote = async (body: Record<string, unknown>) => {
      const res = await post(server, '/video/quote', body);
      expect(res.status).toBe(200);
      return ((await res.json()) as { quote: number }).quote;
    };
    expect(
      await quote({ model: 'wan-2-7-text-to-video', duration: '5s', resolution: '720p', audio: true }),
    ).toBe(0.5);
    expect(
      await quote({ model: 'wan-2-7-text-to-video', duration: '5s', resolution: '720p', audio: false }),
    ).toBe(0.4);
    expect(await quote({ model: 'wan-2-7-text-to-video', duration: '10s', resolution: '1080p' })).toBe(1.4);
    expect(
      await quote({ model: 'wan-2-7-image-to-video', duration: '10s', resolution: '1080p', audio: false }),
    ).toBe(1.35);
  });

  test('behavior: a duration or resolution the model lacks -> 400; an unknown model -> 404', async () => {
    const badDuration = await post(server, '/video/quote', {
      model: 'wan-2-7-text-to-video',
      duration: '7s',
    });
    expect(badDuration.status).toBe(400);
    expect(((await badDuration.json()) as { error: string }).error).toMatch(/duration 7s/);
    const badResolution = await post(server, '/video/quote', {
      model: 'wan-2-7-text-to-video',
      duration: '5s',
      resolution: '2160p',
    });
    expect(badResolution.status).toBe(400);
    const unknown = await post(server, '/video/quote', { model: 'no-such-video', duration: '5s' });
    expect(unknown.status).toBe(404);
  });
});

describe('video lifecycle on the local engine', () => {
  test('behavior: queue charges the quote; retrieve is PROCESSING until the worker ran, then a decodable MP4; complete deletes it', async () => {
    const { accountId, key } = await server.account('5');
    const body = {
      model: 'wan-2-7-text-to-video',
      prompt: 'A lighthouse on a rocky coast at dawn',
      duration: '5s',
      resolution: '480p',
      aspect_ratio: '16:9',
      audio: true,
      seed: 7,
    };
    const queued = await post(server, '/video/queue', body, key);
    expect(queued.status).toBe(200);
    const { queue_id, model } = (await queued.json()) as { queue_id: string; model: string };
    expect(model).toBe('wan-2-7-text-to-video');

    // Charged in full at queue time: 5 s × (0.05 + 0.02).
    const balance = await server.services.ledger.getBalance(accountId);
    expect(balance.usdNano).toBe(parseUsdToNano('5') - parseUsdToNano('0.35'));
    const charges = (await ledgerOf(accountId)).filter((e) => e.type === 'CHARGE');
    expect(charges.reduce((sum, e) => sum + e.amountNano, 0n)).toBe(-parseUsdToNano('0.35'));

    const processing = await post(server, '/video/retrieve', { model, queue_id }, key);
    expect(processing.status).toBe(200);
    const status = (await processing.json()) as Record<string, unknown>;
    expect(status.status).toBe('PROCESSING');
    expect(typeof status.average_execution_time).toBe('number');

    expect(await server.services.video.worker.runOnce()).toBe(1);

    const done = await post(server, '/video/retrieve', { model, queue_id }, key);
    expect(done.status).toBe(200);
    expect(done.headers.get('content-type')).toBe('video/mp4');
    const probe = decode(Buffer.from(await done.arrayBuffer()), 'lifecycle.mp4');
    expect(probe.format.format_name).toContain('mp4');
    const video = probe.streams.find((s) => s.codec_type === 'video');
    expect(video).toMatchObject({ codec_name: 'h264', width: 854, height: 480 });
    expect(Number(video?.nb_frames)).toBe(120);
    expect(probe.streams.find((s) => s.codec_type === 'audio')?.codec_name).toBe('aac');
    expect(Number(probe.format.duration)).toBeCloseTo(5, 0);

    // Still stored until complete; then gone.
    expect((await post(server, '/video/retrieve', { model, queue_id }, key)).status).toBe(200);
    const completed = await post(server, '/video/complete', { model, queue_id }, key);
    expect(await completed.json()).toEqual({ success: true });
    const gone = await post(server, '/video/retrieve', { model, queue_id }, key);
    expect(gone.status).toBe(404);
    expect(((await gone.json()) as { error: string }).error).toMatch(/Media could not be found/);
    // Nothing was refunded for a job that succeeded.
    expect((await ledgerOf(accountId)).some((e) => e.type === 'REFUND')).toBe(false);
  });

  test('behavior: delete_media_on_completion removes the media once returned; audio off gives no audio track', async () => {
    const { key } = await server.account('5');
    const queued = await post(
      server,
      '/video/queue',
      {
        model: 'wan-2-7-text-to-video',
        prompt: 'quiet snow',
        duration: '5s',
        resolution: '480p',
        audio: false,
      },
      key,
    );
    const { queue_id, model } = (await queued.json()) as { queue_id: string; model: string };
    await server.services.video.worker.runOnce();
    const done = await post(
      server,
      '/video/retrieve',
      { model, queue_id, delete_media_on_completion: true },
      key,
    );
    expect(done.headers.get('content-type')).toBe('video/mp4');
    const probe = decode(Buffer.from(await done.arrayBuffer()), 'silent.mp4');
    expect(probe.streams.map((s) => s.codec_type)).toEqual(['video']);
    expect((await post(server, '/video/retrieve', { model, queue_id }, key)).status).toBe(404);
  });

  test('behavior: the same prompt and seed give the same bytes; another seed gives other bytes', async () => {
    const { key } = await server.account('5');
    const job = async (seed: number) => {
      const res = await post(
        server,
        '/video/queue',
        {
          model: 'wan-2-7-text-to-video',
          prompt: 'red kites',
          duration: '5s',
          resolution: '480p',
          audio: false,
          seed,
        },
        key,
      );
      return (await res.json()) as { queue_id: string; model: string };
    };
    const a = await job(11);
    const b = await job(11);
    const c = await job(12);
    expect(await server.services.video.worker.runOnce()).toBe(3);
    const bytes = async (j: { queue_id: string; model: string }) =>
      Buffer.from(await (await post(server, '/video/retrieve', j, key)).arrayBuffer());
    const [ba, bb, bc] = [await bytes(a), await bytes(b), await bytes(c)];
    expect(ba.equals(bb)).toBe(true);
    expect(ba.equals(bc)).toBe(false);
  });

  test('behavior: a job is visible only to its account, and only under its model', async () => {
    const owner = await server.account('5');
    const other = await server.account('5');
    const queued = await post(
      server,
      '/video/queue',
      { model: 'wan-2-7-text-to-video', prompt: 'owl', duration: '5s', resolution: '480p' },
      owner.key,
    );
    const { queue_id } = (await queued.json()) as { queue_id: string };
    expect(
      (await post(server, '/video/retrieve', { model: 'wan-2-7-text-to-video', queue_id }, other.key)).status,
    ).toBe(404);
    expect(
      (await post(server, '/video/complete', { model: 'wan-2-7-text-to-video', queue_id }, other.key)).status,
    ).toBe(404);
    expect(
      (await post(server, '/video/retrieve', { model: 'wan-2-7-image-to-video', queue_id }, owner.key))
        .status,
    ).toBe(404);
    // Still running: complete cannot delete it yet.
    expect(
      await (
        await post(server, '/video/complete', { model: 'wan-2-7-text-to-video', queue_id }, owner.key)
      ).json(),
    ).toEqual({ success: false });
    await server.services.video.worker.runOnce();
  });

  test("behavior: polling retrieve is not held to the model's 40 requests a minute", async () => {
    const { key } = await server.account('5');
    const queued = await post(
      server,
      '/video/queue',
      { model: 'wan-2-7-text-to-video', prompt: 'patience', duration: '5s', resolution: '480p' },
      key,
    );
    const job = (await queued.json()) as { queue_id: string; model: string };
    for (let i = 0; i < 60; i++) {
      const res = await post(server, '/video/retrieve', job, key);
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    await server.services.video.worker.runOnce();
  });

  test('behavior: a balance below the price -> 402 and nothing is charged or queued', async () => {
    const { accountId, key } = await server.account('0.2');
    const res = await post(
      server,
      '/video/queue',
      { model: 'wan-2-7-text-to-video', prompt: 'a long shot', duration: '10s', resolution: '1080p' },
      key,
    );
    expect(res.status).toBe(402);
    expect(await ledgerOf(accountId)).toHaveLength(1); // the top-up only
    expect(await server.services.video.worker.runOnce()).toBe(0);
  });

  test('behavior: prompt over the model limit, image_url on text-to-video, missing image_url -> 400', async () => {
    const { key } = await server.account('5');
    const base = { model: 'wan-2-7-text-to-video', duration: '5s', resolution: '480p' };
    expect((await post(server, '/video/queue', { ...base, prompt: 'x'.repeat(2501) }, key)).status).toBe(400);
    expect(
      (
        await post(
          server,
          '/video/queue',
          { ...base, prompt: 'x', image_url: 'data:image/png;base64,AAAA' },
          key,
        )
      ).status,
    ).toBe(400);
    expect(
      (await post(server, '/video/queue', { ...base, model: 'wan-2-7-image-to-video', prompt: 'x' }, key))
        .status,
    ).toBe(400);
  });

  test('behavior: image-to-video needs consent (409), then animates the image at its own shape', async () => {
    const { accountId, key } = await server.account('5');
    // A 64x32 PNG made by the real encoder: the video keeps its 2:1 shape at 480p.
    const png = execFileSync(ffmpeg, [
      '-v',
      'error',
      '-f',
      'lavfi',
      '-i',
      'color=c=0x3366cc:s=64x32',
      '-frames:v',
      '1',
      '-f',
      'image2pipe',
      '-c:v',
      'png',
      'pipe:1',
    ]);
    const body = {
      model: 'wan-2-7-image-to-video',
      prompt: 'the sea starts to move',
      duration: '5s',
      resolution: '480p',
      audio: false,
      image_url: `data:image/png;base64,${png.toString('base64')}`,
    };
    const refused = await post(server, '/video/queue', body, key);
    expect(refused.status).toBe(409);
    expect(await refused.json()).toMatchObject({
      code: 'NEEDS_CONSENT',
      consentFlow: 'face_media',
      faceMediaRoles: ['image'],
    });
    expect(await ledgerOf(accountId)).toHaveLength(1);

    const consents = {
      face_media: {
        confirmed_terms_and_privacy: true,
        confirmed_legal_right: true,
        confirmed_screening_acknowledged: true,
      },
    };
    const queued = await post(server, '/video/queue', { ...body, consents }, key);
    expect(queued.status).toBe(200);
    const { queue_id, model, download_url } = (await queued.json()) as {
      queue_id: string;
      model: string;
      download_url: string;
    };
    // This model delivers through a pre-signed link: retrieve reports COMPLETED with it, never the bytes.
    expect(download_url).toMatch(new RegExp(`/media/video/${queue_id}\\.mp4\\?expires=\\d+&token=`));
    const link = new URL(download_url);
    const local = `${server.origin}${link.pathname}${link.search}`;
    expect((await fetch(local)).status).toBe(404); // not rendered yet
    await server.services.video.worker.runOnce();
    const done = await post(server, '/video/retrieve', { model, queue_id }, key);
    expect(done.status).toBe(200);
    expect(await done.json()).toMatchObject({ status: 'COMPLETED', download_url });

    const downloaded = await fetch(local);
    expect(downloaded.headers.get('content-type')).toBe('video/mp4');
    const probe = decode(Buffer.from(await downloaded.arrayBuffer()), 'i2v.mp4');
    expect(probe.streams[0]).toMatchObject({ codec_name: 'h264', width: 960, height: 480 });

    const forged = `${server.origin}${link.pathname}?token=${'A'.repeat(32)}`;
    expect((await fetch(forged)).status).toBe(404);
    expect((await fetch(forged, { method: 'DELETE' })).status).toBe(404);
    // DELETE on the link revokes it: the media and the job are gone.
    expect((await fetch(local, { method: 'DELETE' })).status).toBe(200);
    expect((await fetch(local)).status).toBe(404);
    expect((await post(server, '/video/retrieve', { model, queue_id }, key)).status).toBe(404);
  });
});

describe('failed video jobs are refunded', () => {
  const queueOn = async (model: string) => {
    const account = await server.account('5');
    const res = await post(
      server,
      '/video/queue',
      { model, prompt: 'storm', duration: '5s', resolution: '480p' },
      account.key,
    );
    expect(res.status).toBe(200);
    const job = (await res.json()) as { queue_id: string; model: string };
    await server.services.video.worker.runOnce();
    return { ...account, job };
  };

  const expectRefunded = async (accountId: string) => {
    const entries = await ledgerOf(accountId);
    const charged = entries.filter((e) => e.type === 'CHARGE').reduce((sum, e) => sum + e.amountNano, 0n);
    const refunds = entries.filter((e) => e.type === 'REFUND');
    expect(charged).toBe(-parseUsdToNano('0.35'));
    expect(refunds).toHaveLength(1);
    expect(refunds[0]?.amountNano).toBe(parseUsdToNano('0.35'));
    expect((await server.services.ledger.getBalance(accountId)).usdNano).toBe(parseUsdToNano('5'));
  };

  test('behavior: a content-policy refusal upstream -> retrieve 422 with creditsRefunded, a REFUND entry', async () => {
    const { accountId, key, job } = await queueOn('video-refuses');
    const res = await post(server, '/video/retrieve', job, key);
    expect(res.status).toBe(422);
    expect(await res.json()).toEqual({
      error: 'Refused by the upstream content policy',
      code: 'CONTENT_POLICY_VIOLATION',
      creditsRefunded: true,
      recommendedModel: 'wan-2-7-text-to-video',
    });
    await expectRefunded(accountId);
    // Asking again refunds nothing more; complete then forgets the job.
    expect((await post(server, '/video/retrieve', job, key)).status).toBe(422);
    await expectRefunded(accountId);
    expect(await (await post(server, '/video/complete', job, key)).json()).toEqual({ success: true });
    expect((await post(server, '/video/retrieve', job, key)).status).toBe(404);
  });

  test('behavior: an upstream failure -> retrieve 500 and a refund', async () => {
    const { accountId, key, job } = await queueOn('video-breaks');
    const res = await post(server, '/video/retrieve', job, key);
    expect(res.status).toBe(500);
    expect(((await res.json()) as { error: string }).error).toBe('Inference processing failed');
    await expectRefunded(accountId);
  });

  test('behavior: an upstream answering something that is not an MP4 fails the job and refunds', async () => {
    const { accountId, key, job } = await queueOn('video-garbage');
    expect((await post(server, '/video/retrieve', job, key)).status).toBe(500);
    await expectRefunded(accountId);
  });
});

describe('video worker leases', () => {
  test('behavior: a job whose worker died is taken over after its lease; the dead worker can no longer write', async () => {
    const { key } = await server.account('5');
    const res = await post(
      server,
      '/video/queue',
      { model: 'wan-2-7-text-to-video', prompt: 'orphan', duration: '5s', resolution: '480p', audio: false },
      key,
    );
    const { queue_id, model } = (await res.json()) as { queue_id: string; model: string };

    let clock = Date.now();
    const jobs = createVideoJobs(server.services.database, { now: () => clock });
    const dead = await jobs.claim({ owner: 'dead-worker', leaseMs: 60_000 });
    expect(dead?.id).toBe(queue_id);

    // Within the lease nobody else gets it.
    const generated: string[] = [];
    const provider: VideoProvider = {
      name: 'local',
      async generate(request) {
        generated.push(request.prompt);
        return { contentType: 'video/mp4', bytes: Buffer.from('not decoded in this test') };
      },
    };
    const rescuer = createVideoWorker({
      jobs,
      ledger: server.services.ledger,
      catalog: server.services.catalog,
      providerFor: () => provider,
      leaseMs: 60_000,
    });
    expect(await rescuer.runOnce()).toBe(0);

    clock += 60_001;
    expect(await rescuer.runOnce()).toBe(1);
    expect(generated).toEqual(['orphan']);
    const job = await jobs.get(queue_id);
    expect(job).toMatchObject({ status: 'completed', attempts: 2 });
    expect(
      await jobs.complete(queue_id, 'dead-worker', { contentType: 'video/mp4', bytes: Buffer.from('x') }),
    ).toBe(false);
    expect((await post(server, '/video/retrieve', { model, queue_id }, key)).status).toBe(200);
  });

  test('behavior: a job left unpaid by a request that died before its charge is failed by the sweep; nothing is charged', async () => {
    const { accountId, key } = await server.account('5');
    const authenticated = await server.services.keys.authenticate(key);
    if (!authenticated.ok) throw new Error('key not found');
    let clock = Date.now();
    const jobs = createVideoJobs(server.services.database, { now: () => clock });
    await jobs.create({
      id: 'died-mid-queue',
      accountId,
      apiKeyId: authenticated.key.id,
      requestId: 'died-request',
      modelId: 'wan-2-7-text-to-video',
      backend: 'local',
      params: {},
      priceNano: parseUsdToNano('0.25'),
      ttlMs: 3_600_000,
    });
    const principal = {
      kind: 'apiKey' as const,
      accountId,
      keyId: authenticated.key.id,
      keyType: 'INFERENCE' as const,
    };
    // The request held the price and died: its capture, which would have queued the job, never ran.
    const reservation = await server.services.charges.reserve(principal, {
      amountNano: parseUsdToNano('0.25'),
      requestId: 'died-request',
      modelId: 'wan-2-7-text-to-video',
    });
    const sweeper = createVideoWorker({
      jobs,
      ledger: server.services.ledger,
      catalog: server.services.catalog,
      providerFor: () => {
        throw new Error('nothing should run');
      },
    });
    expect(await sweeper.runOnce()).toBe(0);
    expect((await jobs.get('died-mid-queue'))?.status).toBe('unpaid'); // still within the grace period
    clock += 10 * 60_000 + 1;
    expect(await sweeper.runOnce()).toBe(0);
    expect(await jobs.get('died-mid-queue')).toMatchObject({
      status: 'failed',
      refunded: true,
      chargeSeqs: null,
    });
    const entries = await ledgerOf(accountId);
    expect(entries.filter((e) => e.type === 'CHARGE' || e.type === 'REFUND')).toEqual([]);
    // The hold is the reservations' to end (it expires, or here is released): the job's price was never taken.
    await server.services.charges.release(reservation);
    expect(await server.services.ledger.getBalance(accountId)).toMatchObject({
      usdNano: parseUsdToNano('5'),
      usdReservedNano: 0n,
    });
    expect(await server.services.video.worker.runOnce()).toBe(0);
  });
});

describe('video queue recovery', () => {
  test('behavior: a job the sweep gave up while its request stalled is not charged; its hold goes back (500)', async () => {
    const { accountId, key } = await server.account('5');
    const authenticated = await server.services.keys.authenticate(key);
    if (!authenticated.ok) throw new Error('key not found');
    const jobs = server.services.video.jobs;
    const charges = server.services.charges;
    let created = '';
    const stalled = createVideoService({
      catalog: server.services.catalog,
      // The sweep wins the race: it fails the unpaid job just before the request's capture.
      charges: {
        ...charges,
        captureWith: async (...args: Parameters<typeof charges.captureWith>) => {
          await jobs.failUnpaid(created, { code: 'INFERENCE_FAILED', message: 'given up' });
          return charges.captureWith(...args);
        },
      },
      ledger: server.services.ledger,
      jobs: {
        ...jobs,
        create: async (input: Parameters<typeof jobs.create>[0]) => {
          created = input.id;
          return jobs.create(input);
        },
      },
      isPro: async () => false,
      mediaTtlMs: 3_600_000,
    });
    const error = await stalled
      .queue({
        body: {
          model: 'wan-2-7-text-to-video',
          prompt: 'late',
          duration: '5s',
          resolution: '480p',
          audio: false,
        },
        principal: { kind: 'apiKey', accountId, keyId: authenticated.key.id, keyType: 'INFERENCE' },
        requestId: 'stalled-request',
      })
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ status: 500 });
    const entries = await ledgerOf(accountId);
    expect(entries.filter((e) => e.type === 'CHARGE' || e.type === 'REFUND')).toEqual([]);
    expect(await server.services.ledger.getBalance(accountId)).toMatchObject({
      usdNano: parseUsdToNano('5'),
      usdReservedNano: 0n,
    });
    expect(await jobs.get(created)).toMatchObject({ status: 'failed', chargeSeqs: null });
    expect(await server.services.video.worker.runOnce()).toBe(0);
  });
});
