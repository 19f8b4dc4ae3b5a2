/**
 * The video worker inside the server process as `npm start` runs it: a queued job becomes a downloadable MP4
 * with nobody driving the worker; a job in hand when the server drains (SIGTERM) goes back to the queue; an
 * instance with `VIDEO_WORKER_ENABLED=false` leaves it there; the next instance with a worker finishes it.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { createDatabase } from '../../server/storage/database.ts';
import { createVideoJobs } from '../../server/storage/video-jobs.ts';
import { startServerProcess, stopServerProcesses } from '../support/server-process.ts';

const dir = mkdtempSync(join(tmpdir(), 'video-main-'));
const ADMIN = 'svc_admin_video_main_test_secret_0123456789';
afterEach(stopServerProcesses);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const start = (env: Record<string, string>) =>
  startServerProcess({ NODE_ENV: 'development', ADMIN_API_KEY: ADMIN, VIDEO_WORKER_ENABLED: 'true', ...env });

const call = (url: string, path: string, body: unknown) =>
  fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${ADMIN}` },
    body: JSON.stringify(body),
  });

/** Polls retrieve until the MP4 arrives (bounded by attempts, not asserted on time). */
async function waitForVideo(url: string, job: unknown): Promise<Buffer> {
  for (let i = 0; i < 600; i++) {
    const res = await call(url, '/video/retrieve', job);
    if (res.headers.get('content-type') === 'video/mp4') return Buffer.from(await res.arrayBuffer());
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error('the video never arrived');
}

describe('video worker in server/main.ts', () => {
  test('behavior: jobs are worked in the server process; drain gives a job in hand back; a worker-less instance leaves it', {
    timeout: 240_000,
  }, async () => {
    const env = { DATABASE_URL: `sqlite:${join(dir, 'video.db')}`, VIDEO_WORKER_POLL_MS: '50' };
    const first = await start(env);
    const queue = async (url: string, body: Record<string, unknown>) => {
      const res = await call(url, '/video/queue', {
        model: 'wan-2-7-text-to-video',
        duration: '5s',
        resolution: '480p',
        audio: false,
        ...body,
      });
      expect(res.status).toBe(200);
      return (await res.json()) as { queue_id: string; model: string };
    };
    const job1 = await queue(first.base, { prompt: 'tide pools' });
    const video = await waitForVideo(first.base, job1);
    expect(video.subarray(4, 8).toString('latin1')).toBe('ftyp');

    // A longer job: stop the server while it renders.
    const database = await createDatabase(env.DATABASE_URL);
    const jobs = createVideoJobs(database);
    try {
      const job2 = await queue(first.base, { prompt: 'night ferry', duration: '10s' });
      for (let i = 0; i < 3000 && (await jobs.get(job2.queue_id))?.status !== 'running'; i++) {
        await new Promise((r) => setTimeout(r, 10));
      }
      expect((await jobs.get(job2.queue_id))?.status).toBe('running');
      first.signal('SIGTERM');
      expect(await first.exited).toBe(0);
      expect(await jobs.get(job2.queue_id)).toMatchObject({
        status: 'queued',
        leaseOwner: null,
        attempts: 1,
      });

      const idle = await start({ ...env, VIDEO_WORKER_ENABLED: 'false' });
      const polled = await call(idle.base, '/video/retrieve', job2);
      expect(await polled.json()).toMatchObject({ status: 'PROCESSING' });
      idle.signal('SIGTERM');
      expect(await idle.exited).toBe(0);
      expect((await jobs.get(job2.queue_id))?.status).toBe('queued');

      const second = await start(env);
      const resumed = await waitForVideo(second.base, job2);
      expect(resumed.subarray(4, 8).toString('latin1')).toBe('ftyp');
      expect(await jobs.get(job2.queue_id)).toMatchObject({ status: 'completed', attempts: 2 });
      second.signal('SIGTERM');
      expect(await second.exited).toBe(0);
    } finally {
      await database.close();
    }
  });
});
