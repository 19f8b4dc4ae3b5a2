/**
 * Video jobs in the database, shared by every server instance: the queue, the claim that hands a job to exactly
 * one worker, the lease that lets another worker take over a job whose worker died, and the finished media.
 *
 * A job's life: `unpaid` (row written before the charge; a job whose request died before it is found and given
 * up) -> `queued` (paid: set in the capture's transaction, with the `seq`s of its charges, which its refund
 * gives back) -> `running` (claimed; `lease_owner` and `lease_until_ms` set) -> `completed` (media stored)
 * or `failed` (refund pending until `refunded` = 1). Every state change of a claimed job is a conditional UPDATE
 * on the owner and the state, so a worker that lost its lease can no longer write. The claim itself is a
 * conditional UPDATE too (`queued`, or `running` with an expired lease): on PostgreSQL the second of two
 * concurrent updates re-reads the row after the first commits and no longer matches, on SQLite writers are
 * serialised; either way exactly one worker wins.
 */
import type { Kysely, Selectable, Updateable } from 'kysely';
import { extend } from '../objects.ts';
import type { Database } from './database.ts';
import { type RepositoryOptions, resolveOptions, toNumber, toNumberOrNull } from './internal.ts';
import type { ChargeSeqs } from './ledger.ts';
import type { Tables, VideoJobsTable } from './schema.ts';

export type VideoJobStatus = VideoJobsTable['status'];

export type VideoJob = {
  id: string;
  accountId: string;
  apiKeyId: string | null;
  requestId: string;
  modelId: string;
  backend: string;
  params: unknown;
  priceNano: bigint;
  status: VideoJobStatus;
  attempts: number;
  leaseOwner: string | null;
  leaseUntilMs: number | null;
  upstreamHandle: string | null;
  errorCode: string | null;
  errorMessage: string | null;
  recommendedModel: string | null;
  refunded: boolean;
  /** The `seq`s of the entries its capture wrote (what a refund gives back); null until it is paid. */
  chargeSeqs: ChargeSeqs | null;
  createdAtMs: number;
  startedAtMs: number | null;
  finishedAtMs: number | null;
  expiresAtMs: number;
};

export type NewVideoJob = {
  id: string;
  accountId: string;
  apiKeyId: string | null;
  requestId: string;
  modelId: string;
  backend: string;
  params: unknown;
  priceNano: bigint;
  /** How long the job and its media are kept (from creation). */
  ttlMs: number;
};

export type VideoFailure = { code: string; message: string; recommendedModel?: string | null };

export type VideoMedia = { contentType: string; bytes: Buffer };

export type VideoJobsRepository = ReturnType<typeof createVideoJobs>;

function toJob(row: Selectable<VideoJobsTable>): VideoJob {
  return {
    id: row.id,
    accountId: row.account_id,
    apiKeyId: row.api_key_id,
    requestId: row.request_id,
    modelId: row.model_id,
    backend: row.backend,
    params: JSON.parse(row.params),
    priceNano: BigInt(row.price_nano),
    status: row.status,
    attempts: toNumber(row.attempts),
    leaseOwner: row.lease_owner,
    leaseUntilMs: toNumberOrNull(row.lease_until_ms),
    upstreamHandle: row.upstream_handle,
    errorCode: row.error_code,
    errorMessage: row.error_message,
    recommendedModel: row.recommended_model,
    refunded: toNumber(row.refunded) === 1,
    chargeSeqs:
      row.charge_seq_first === null || row.charge_seq_last === null
        ? null
        : { first: toNumber(row.charge_seq_first), last: toNumber(row.charge_seq_last) },
    createdAtMs: toNumber(row.created_at_ms),
    startedAtMs: toNumberOrNull(row.started_at_ms),
    finishedAtMs: toNumberOrNull(row.finished_at_ms),
    expiresAtMs: toNumber(row.expires_at_ms),
  };
}

/** The video job repository. */
export function createVideoJobs(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);

  async function get(id: string): Promise<VideoJob | undefined> {
    const row = await db.selectFrom('video_jobs').selectAll().where('id', '=', id).executeTakeFirst();
    return row ? toJob(row) : undefined;
  }

  async function deleteFinished(id: string): Promise<boolean> {
    return database.transaction(async (trx) => {
      const result = await trx
        .deleteFrom('video_jobs')
        .where('id', '=', id)
        .where((eb) =>
          eb.or([
            eb('status', '=', 'completed'),
            eb.and([eb('status', '=', 'failed'), eb('refunded', '=', 1)]),
          ]),
        )
        .executeTakeFirst();
      if (Number(result.numDeletedRows) !== 1) return false;
      await trx.deleteFrom('video_media').where('job_id', '=', id).execute();
      return true;
    });
  }

  /** Updates a job this worker holds; false when it no longer does (lease lost or job gone). */
  async function updateOwned(
    id: string,
    owner: string,
    values: Updateable<VideoJobsTable>,
  ): Promise<boolean> {
    const result = await db
      .updateTable('video_jobs')
      .set(values)
      .where('id', '=', id)
      .where('lease_owner', '=', owner)
      .where('status', '=', 'running')
      .executeTakeFirst();
    return Number(result.numUpdatedRows) === 1;
  }

  return {
    /** Writes a new job in state `unpaid`. */
    async create(input: NewVideoJob): Promise<VideoJob> {
      const at = now();
      const row = {
        id: input.id,
        account_id: input.accountId,
        api_key_id: input.apiKeyId,
        request_id: input.requestId,
        model_id: input.modelId,
        backend: input.backend,
        params: JSON.stringify(input.params),
        price_nano: input.priceNano,
        status: 'unpaid' as const,
        attempts: 0,
        refunded: 0,
        created_at_ms: at,
        expires_at_ms: at + input.ttlMs,
      };
      await db.insertInto('video_jobs').values(row).execute();
      return toJob(
        extend(row, {
          lease_owner: null,
          lease_until_ms: null,
          upstream_handle: null,
          error_code: null,
          error_message: null,
          recommended_model: null,
          charge_seq_first: null,
          charge_seq_last: null,
          started_at_ms: null,
          finished_at_ms: null,
        }),
      );
    },

    /**
     * The job was paid: hand it to the workers, with the `seq`s of its charges. Made in the capture's
     * transaction (`q`), so that a job is queued exactly when it is charged, and its refund finds its charges.
     * False when it is no longer unpaid (the sweep gave it up). Null `chargeSeqs`: nothing was charged.
     */
    async markQueued(id: string, chargeSeqs: ChargeSeqs | null, q: Kysely<Tables> = db): Promise<boolean> {
      const result = await q
        .updateTable('video_jobs')
        .set({
          status: 'queued',
          charge_seq_first: chargeSeqs?.first ?? null,
          charge_seq_last: chargeSeqs?.last ?? null,
        })
        .where('id', '=', id)
        .where('status', '=', 'unpaid')
        .executeTakeFirst();
      return Number(result.numUpdatedRows) === 1;
    },

    /** Forgets a job that was never paid (the charge was refused). */
    async deleteUnpaid(id: string): Promise<void> {
      await db.deleteFrom('video_jobs').where('id', '=', id).where('status', '=', 'unpaid').execute();
    },

    get,

    /**
     * Claims the oldest job that is queued, or running under an expired lease (its worker died), for `owner`
     * until `now + leaseMs`. Returns undefined when there is none. Exactly one caller wins a given job.
     */
    async claim(input: { owner: string; leaseMs: number }): Promise<VideoJob | undefined> {
      for (let round = 0; round < 5; round++) {
        const at = now();
        const candidates = await db
          .selectFrom('video_jobs')
          .select(['id'])
          .where((eb) =>
            eb.or([
              eb('status', '=', 'queued'),
              eb.and([eb('status', '=', 'running'), eb('lease_until_ms', '<=', at)]),
            ]),
          )
          .orderBy('created_at_ms')
          .limit(8)
          .execute();
        if (candidates.length === 0) return undefined;
        for (const { id } of candidates) {
          const result = await db
            .updateTable('video_jobs')
            .set((eb) => ({
              status: 'running',
              lease_owner: input.owner,
              lease_until_ms: at + input.leaseMs,
              attempts: eb('attempts', '+', 1),
              started_at_ms: eb.fn.coalesce('started_at_ms', eb.val(at)),
            }))
            .where('id', '=', id)
            .where((eb) =>
              eb.or([
                eb('status', '=', 'queued'),
                eb.and([eb('status', '=', 'running'), eb('lease_until_ms', '<=', at)]),
              ]),
            )
            .executeTakeFirst();
          if (Number(result.numUpdatedRows) === 1) return get(id);
        }
      }
      return undefined;
    },

    /** Extends the lease of a job this worker holds; false when the lease was lost. */
    renew(id: string, owner: string, leaseMs: number): Promise<boolean> {
      return updateOwned(id, owner, { lease_until_ms: now() + leaseMs });
    },

    /** Remembers the backend's handle (an upstream job id) so a worker taking over can resume it. */
    setHandle(id: string, owner: string, handle: string): Promise<boolean> {
      return updateOwned(id, owner, { upstream_handle: handle });
    },

    /** Gives a claimed job back to the queue (the worker is stopping). */
    release(id: string, owner: string): Promise<boolean> {
      return updateOwned(id, owner, { status: 'queued', lease_owner: null, lease_until_ms: null });
    },

    /** Stores the video and completes the job, atomically; false when this worker no longer holds it. */
    async complete(id: string, owner: string, media: VideoMedia): Promise<boolean> {
      return database.transaction(async (trx) => {
        const result = await trx
          .updateTable('video_jobs')
          .set({ status: 'completed', finished_at_ms: now(), lease_until_ms: null })
          .where('id', '=', id)
          .where('lease_owner', '=', owner)
          .where('status', '=', 'running')
          .executeTakeFirst();
        if (Number(result.numUpdatedRows) !== 1) return false;
        await trx
          .insertInto('video_media')
          .values({
            job_id: id,
            content_type: media.contentType,
            size: media.bytes.length,
            bytes: media.bytes,
          })
          .execute();
        return true;
      });
    },

    /** Marks a claimed job failed (refund pending); false when this worker no longer holds it. */
    fail(id: string, owner: string, failure: VideoFailure): Promise<boolean> {
      return updateOwned(id, owner, {
        status: 'failed',
        error_code: failure.code,
        error_message: failure.message,
        recommended_model: failure.recommendedModel ?? null,
        finished_at_ms: now(),
        lease_until_ms: null,
      });
    },

    /** Failed jobs whose refund has not been recorded yet (a worker may have died in between). */
    async pendingRefunds(limit = 50): Promise<VideoJob[]> {
      const rows = await db
        .selectFrom('video_jobs')
        .selectAll()
        .where('status', '=', 'failed')
        .where('refunded', '=', 0)
        .orderBy('created_at_ms')
        .limit(limit)
        .execute();
      return rows.map(toJob);
    },

    async markRefunded(id: string): Promise<void> {
      await db.updateTable('video_jobs').set({ refunded: 1 }).where('id', '=', id).execute();
    },

    /** Jobs left `unpaid` for longer than `olderThanMs` (the queuing request died mid-way). */
    async staleUnpaid(olderThanMs: number, limit = 50): Promise<VideoJob[]> {
      const rows = await db
        .selectFrom('video_jobs')
        .selectAll()
        .where('status', '=', 'unpaid')
        .where('created_at_ms', '<=', now() - olderThanMs)
        .limit(limit)
        .execute();
      return rows.map(toJob);
    },

    /** Turns a stale unpaid job into a failed one (refund pending), unless it was queued meanwhile. */
    async failUnpaid(id: string, failure: VideoFailure): Promise<boolean> {
      const result = await db
        .updateTable('video_jobs')
        .set({
          status: 'failed',
          error_code: failure.code,
          error_message: failure.message,
          finished_at_ms: now(),
        })
        .where('id', '=', id)
        .where('status', '=', 'unpaid')
        .executeTakeFirst();
      return Number(result.numUpdatedRows) === 1;
    },

    async getMedia(id: string): Promise<VideoMedia | undefined> {
      const row = await db
        .selectFrom('video_media')
        .select(['content_type', 'bytes'])
        .where('job_id', '=', id)
        .executeTakeFirst();
      return row ? { contentType: row.content_type, bytes: Buffer.from(row.bytes) } : undefined;
    },

    /**
     * Deletes a finished job and its media. False while the job is still queued or running (or its refund is
     * still pending): the caller may retry later.
     */
    delete: deleteFinished,

    /** 80th percentile of the run time of the model's recent finished jobs, in ms; undefined without any. */
    async typicalDurationMs(modelId: string, sample = 50): Promise<number | undefined> {
      const rows = await db
        .selectFrom('video_jobs')
        .select(['created_at_ms', 'finished_at_ms'])
        .where('model_id', '=', modelId)
        .where('status', '=', 'completed')
        .where('finished_at_ms', 'is not', null)
        .orderBy('finished_at_ms', 'desc')
        .limit(sample)
        .execute();
      if (rows.length === 0) return undefined;
      const durations = rows
        .map((r) => toNumber(r.finished_at_ms ?? 0) - toNumber(r.created_at_ms))
        .sort((a, b) => a - b);
      return durations[Math.min(durations.length - 1, Math.ceil(durations.length * 0.8) - 1)];
    },

    /** Deletes finished jobs (and media) past their expiry; returns how many. */
    async pruneExpired(at: number = now()): Promise<number> {
      const due = await db
        .selectFrom('video_jobs')
        .select('id')
        .where('expires_at_ms', '<=', at)
        .where((eb) =>
          eb.or([
            eb('status', '=', 'completed'),
            eb.and([eb('status', '=', 'failed'), eb('refunded', '=', 1)]),
          ]),
        )
        .limit(200)
        .execute();
      let count = 0;
      for (const { id } of due) if (await deleteFinished(id)) count++;
      return count;
    },
  };
}
