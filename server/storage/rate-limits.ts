/**
 * Fixed-window rate limits shared by every process through the database, and the log of refused requests.
 *
 * `hit` is ONE statement: an upsert that adds the cost only while the window stays within the limit
 * (`INSERT … ON CONFLICT (bucket, window_start_ms) DO UPDATE SET used = used + cost WHERE used + cost <= limit
 * RETURNING used`). The conflicting row is locked for the update on PostgreSQL and the database is locked for
 * the write on SQLite, so concurrent hits from any number of processes admit exactly `limit` units per window.
 * A refused hit is not counted: a client hammering a limit does not push its own reset further away, and a
 * large request (tokens) that does not fit leaves the room for smaller ones.
 */
import type { Selectable } from 'kysely';
import type { Database } from './database.ts';
import { InvalidInputError } from './errors.ts';
import { compiledOnce, type RepositoryOptions, resolveOptions, toNumber } from './internal.ts';
import type { RateLimitEventsTable } from './schema.ts';

export type HitInput = {
  /** What is counted, e.g. `key:<id>:model:<id>:RPM`. */
  bucket: string;
  windowMs: number;
  limit: number;
  /** Units this request takes (1 for requests, the token count for TPM). */
  cost?: number;
  now?: number;
};

export type HitResult = {
  allowed: boolean;
  /** Units counted in the window after this hit (unchanged when refused). */
  used: number;
  remaining: number;
  limit: number;
  /** When the window ends and the count starts again (epoch ms). */
  resetAtMs: number;
};

export type RateLimitType = RateLimitEventsTable['limit_type'];

export type RateLimitEvent = {
  id: string;
  accountId: string;
  apiKeyId: string | null;
  modelId: string | null;
  tier: string | null;
  limitType: RateLimitType;
  createdAtMs: number;
};

export type LogEventInput = {
  accountId: string;
  apiKeyId?: string | null;
  modelId?: string | null;
  tier?: string | null;
  limitType: RateLimitType;
  now?: number;
};

export type RateLimitsRepository = ReturnType<typeof createRateLimits>;

function toEvent(row: Selectable<RateLimitEventsTable>): RateLimitEvent {
  return {
    id: row.id,
    accountId: row.account_id,
    apiKeyId: row.api_key_id,
    modelId: row.model_id,
    tier: row.tier,
    limitType: row.limit_type,
    createdAtMs: toNumber(row.created_at_ms),
  };
}

function positiveInteger(field: string, value: number, allowZero = false): number {
  if (!Number.isSafeInteger(value) || value < (allowZero ? 0 : 1)) {
    throw new InvalidInputError(
      field,
      `${field} must be a ${allowZero ? 'non-negative' : 'positive'} integer`,
    );
  }
  return value;
}

/** The rate-limit repository. */
export function createRateLimits(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now, randomId } = resolveOptions(options);

  function windowOf(windowMs: number, at: number) {
    const start = Math.floor(at / windowMs) * windowMs;
    return { start, resetAtMs: start + windowMs };
  }

  const selectUsed = compiledOnce((bucket: string, windowStart: number) =>
    db
      .selectFrom('rate_limit_counters')
      .select('used')
      .where('bucket', '=', bucket)
      .where('window_start_ms', '=', windowStart),
  );
  const countHit = compiledOnce((bucket: string, windowStart: number, cost: number, limit: number) =>
    db
      .insertInto('rate_limit_counters')
      .values({ bucket, window_start_ms: windowStart, used: cost })
      .onConflict((oc) =>
        oc
          .columns(['bucket', 'window_start_ms'])
          .doUpdateSet((eb) => ({ used: eb('rate_limit_counters.used', '+', cost) }))
          .where((eb) => eb(eb('rate_limit_counters.used', '+', cost), '<=', limit)),
      )
      .returning('used'),
  );

  async function current(bucket: string, windowStart: number): Promise<number> {
    const [row] = await selectUsed(db, bucket, windowStart);
    return row ? toNumber(row.used) : 0;
  }

  return {
    /** Counts `cost` units against the bucket's current window if they fit under `limit` (see the module comment). */
    async hit(input: HitInput): Promise<HitResult> {
      const windowMs = positiveInteger('windowMs', input.windowMs);
      const limit = positiveInteger('limit', input.limit, true);
      const cost = positiveInteger('cost', input.cost ?? 1, true);
      const { start, resetAtMs } = windowOf(windowMs, input.now ?? now());
      const result = (used: number, allowed: boolean): HitResult => ({
        allowed,
        used,
        remaining: Math.max(0, limit - used),
        limit,
        resetAtMs,
      });
      // Nothing can fit: answer without writing (an insert would count the first hit unconditionally).
      if (cost > limit) return result(await current(input.bucket, start), false);
      const [row] = await countHit(db, input.bucket, start, cost, limit);
      if (row) return result(toNumber(row.used), true);
      return result(await current(input.bucket, start), false);
    },

    /** The bucket's current window without counting anything (for `x-ratelimit-*` headers and status pages). */
    async peek(input: Omit<HitInput, 'cost'>): Promise<HitResult> {
      const windowMs = positiveInteger('windowMs', input.windowMs);
      const limit = positiveInteger('limit', input.limit, true);
      const { start, resetAtMs } = windowOf(windowMs, input.now ?? now());
      const used = await current(input.bucket, start);
      return { allowed: used < limit, used, remaining: Math.max(0, limit - used), limit, resetAtMs };
    },

    /** Deletes counters of windows that started before `beforeMs`; returns how many. */
    async prune(beforeMs: number): Promise<number> {
      const result = await db
        .deleteFrom('rate_limit_counters')
        .where('window_start_ms', '<', beforeMs)
        .executeTakeFirst();
      return Number(result.numDeletedRows);
    },

    /** Records a refused request for `GET /api_keys/rate_limits/log`. */
    async logEvent(input: LogEventInput): Promise<RateLimitEvent> {
      const row = await db
        .insertInto('rate_limit_events')
        .values({
          id: randomId(),
          account_id: input.accountId,
          api_key_id: input.apiKeyId ?? null,
          model_id: input.modelId ?? null,
          tier: input.tier ?? null,
          limit_type: input.limitType,
          created_at_ms: input.now ?? now(),
        })
        .returningAll()
        .executeTakeFirstOrThrow();
      return toEvent(row);
    },

    /** The account's refused requests, newest first. */
    async listEvents(accountId: string, limit = 50): Promise<RateLimitEvent[]> {
      positiveInteger('limit', limit);
      const rows = await db
        .selectFrom('rate_limit_events')
        .selectAll()
        .where('account_id', '=', accountId)
        .orderBy('created_at_ms', 'desc')
        .orderBy('seq', 'desc')
        .limit(limit)
        .execute();
      return rows.map(toEvent);
    },

    /** Deletes events older than `beforeMs`; returns how many. */
    async pruneEvents(beforeMs: number): Promise<number> {
      const result = await db
        .deleteFrom('rate_limit_events')
        .where('created_at_ms', '<', beforeMs)
        .executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
