/**
 * Video jobs across server instances on one real PostgreSQL: a job is claimed by exactly one worker. First the
 * claim itself under contention (many concurrent claims from two connection pools), then two whole instances,
 * each running its worker on the shared queue, with jobs queued through either of them.
 */
import { afterAll, describe, expect, test } from 'vitest';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { createVideoJobs } from '../../server/storage/video-jobs.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

const postgres = postgresPerFile();
const servers: ChatServer[] = [];
const databases: Database[] = [];

afterAll(async () => {
  for (const database of databases) await database.close();
  for (const server of servers) await server.close();
});

describe('video job claims on PostgreSQL', () => {
  test('behavior: 60 concurrent claims from two pools on 20 queued jobs -> each job claimed exactly once', async () => {
    const url = await postgres().createDatabase('video_claims');
    // The first instance creates the schema; the two extra pools act as two more instances' workers.
    const owner = await startChatServer({ databaseUrl: url });
    servers.push(owner);
    const { accountId } = await owner.account('1');
    const pools = [await createDatabase(url), await createDatabase(url)];
    databases.push(...pools);
    const [a, b] = pools.map((database) => createVideoJobs(database));
    if (!a || !b) throw new Error('pools missing');
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) {
      const id = `job-${i}`;
      await a.create({
        id,
        accountId,
        apiKeyId: null,
        requestId: `req-${i}`,
        modelId: 'wan-2-7-text-to-video',
        backend: 'local',
        params: {},
        priceNano: 1n,
        ttlMs: 3_600_000,
      });
      await a.markQueued(id, { first: i, last: i });
      ids.push(id);
    }
    const claims = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        (i % 2 === 0 ? a : b).claim({ owner: `worker-${i % 2}-${i}`, leaseMs: 60_000 }),
      ),
    );
    const won = claims.filter((job) => job !== undefined).map((job) => job.id);
    expect(won.sort()).toEqual([...ids].sort());
    for (const id of ids) expect((await a.get(id))?.attempts).toBe(1);
  });

  test('behavior: two instances run their workers on one queue; every job is rendered once and completes', async () => {
    const url = await postgres().createDatabase('video_instances');
    const first = await startChatServer({ databaseUrl: url });
    const second = await startChatServer({ databaseUrl: url });
    servers.push(first, second);
    const { key } = await first.account('10');
    const queued: Array<{ queue_id: string; model: string }> = [];
    for (let i = 0; i < 4; i++) {
      const server = i % 2 === 0 ? first : second;
      const res = await fetch(`${server.base}/video/queue`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
        body: JSON.stringify({
          model: 'wan-2-7-text-to-video',
          prompt: `harbour ${i}`,
          duration: '5s',
          resolution: '480p',
          audio: false,
        }),
      });
      expect(res.status).toBe(200);
      queued.push((await res.json()) as { queue_id: string; model: string });
    }
    const [ranFirst, ranSecond] = await Promise.all([
      first.services.video.worker.runOnce(),
      second.services.video.worker.runOnce(),
    ]);
    expect(ranFirst + ranSecond).toBe(4);
    for (const job of queued) {
      const stored = await first.services.video.jobs.get(job.queue_id);
      expect(stored).toMatchObject({ status: 'completed', attempts: 1 });
      // Either instance serves the media the other rendered.
      const res = await fetch(`${second.base}/video/retrieve`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
        body: JSON.stringify(job),
      });
      expect(res.headers.get('content-type')).toBe('video/mp4');
      const bytes = Buffer.from(await res.arrayBuffer());
      expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    }
  });
});
