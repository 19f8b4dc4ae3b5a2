/**
 * Fixed-window rate limits shared by every process through the database, and the log of refused requests.
 *
 * `hit` is ONE statement: an upsert that adds the cost only while the window stays within the limit
 * (`INSERT … ON CONFLICT (bucket, window_start_ms) DO UPDATE SET used = used + cost WHERE used + cost <= limit
 * RETURNING used`). The conflicting row is locked for the update on PostgreSQL and the database is locked for
 * the write on SQLite, so concurrent hits from any number of processes admit exactly `limit` units per window.
 * A refused hit is not counted: a client hammering a limit does not push its own reset further away, and a
 * large request (tokens) that does not fit leaves the room for smaller ones.
 *
 * `admit` does the same for all the windows of one request (e.g. tokens, requests per day and per minute of a
 * key and model) in ONE statement, so an admitted request costs one round trip and one commit: a multi-row
 * upsert whose update of each row is conditional on that row's own limit (`used + excluded.used <= CASE
 * excluded.bucket WHEN … THEN limit … END`). Each row's condition is checked on the locked, latest row, so no
 * window ever admits more than its limit, whatever the number of processes. When some window refuses, the
 * windows that did count this request are uncounted (one conditional-free decrement each): nothing stays
 * counted for a refused request. Until the decrement lands, a concurrent request of the same caller may see
 * those windows one unit fuller than they will be: it can only be refused early, never admitted over a limit.
 *
 * With `held` (SQLite served by one process), `admit`, `add` and `count` count in memory instead, exactly, and
 * write the counts behind (held-counts.ts); a `count` made in a transaction that then does not commit is taken
 * back by its caller (`takeBack`). `hit` (key creation) still counts in the rows as above.
 *
 * On PostgreSQL the admission's own commit does not wait for its WAL to be flushed (`synchronous_commit` off for
 * that transaction alone, set by the statement itself: ADMISSION_UNFLUSHED). It moves no money, and everything
 * else sees the counts at once as ever (the setting changes durability, not visibility or locking). What a
 * crash of the database can lose is the last fraction of a second of counts, and only of requests that wrote
 * nothing durable after them: a request's reservation, committed synchronously next, flushes the WAL up to its
 * own record, its admission's included. A request then waits one WAL flush fewer before its work: measured
 * at about 300 to 400 µs of the adapter's path on the VM of bench/HISTORY.md's twenty-second round.
 */
import { type Selectable, sql } from 'kysely';
import { type Database, JOIN_SHARED } from './database.ts';
import { InvalidInputError } from './errors.ts';
import { createHeldCounts, type HeldCount, type HeldCounts, type HeldCountsOptions } from './held-counts.ts';
import {
  changedAny,
  compiledOnce,
  compiledOnceResult,
  type EmbeddedWrite,
  type RepositoryOptions,
  resolveOptions,
  type StatementRunner,
  toNumber,
} from './internal.ts';
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

/** One window of an admission. */
export type AdmitWindow = {
  bucket: string;
  windowMs: number;
  limit: number;
  /** Units this request takes (default 1). Ignored with `peek`. */
  cost?: number;
  /**
   * Counts nothing and only requires room for one more unit (`used < limit`): the tokens of a request that are
   * counted once it has run, when they are known.
   */
  peek?: boolean;
};

export type AdmitInput = {
  /** Distinct buckets; every one must admit the request, or none counts it. */
  windows: AdmitWindow[];
  now?: number;
  /**
   * On SQLite, while others are writing, count in the next commit group rather than commit alone
   * (Database.write's JOIN_SHARED): for a request whose own transaction (its reservation) follows anyway.
   */
  joinShared?: boolean;
};

export type AdmitResult = {
  /** True when every window admitted the request (and all of them counted it). */
  allowed: boolean;
  /**
   * Per window, in the input's order: `allowed` says whether that window had room; `used` is the count after
   * this admission (when refused: without this request, in any window).
   */
  windows: HitResult[];
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

export type RateLimitsOptions = RepositoryOptions & {
  /**
   * On SQLite, when no other process counts in the file (one server process, `WORKERS=1`): the counts of
   * `admit`, `add` and `count` are held in this process and written to their rows every 50 ms
   * (held-counts.ts); a `count` whose transaction does not commit is taken back (`takeBack`). `hit` still
   * counts in the rows: a bucket is counted through the one or the others, never both.
   */
  held?: boolean;
  /** Held counts' settings (tests). */
  heldCounts?: Pick<HeldCountsOptions, 'flushMs' | 'capacity'>;
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

/**
 * On PostgreSQL, a column of the admission's RETURNING that turns `synchronous_commit` off for the rest of its
 * transaction (`set_config(…, true)`: local to it), which is the statement alone: its commit then returns
 * without waiting for the WAL flush. It runs for each row the statement counted; a statement that counted
 * none (a refusal) commits as before.
 */
const ADMISSION_UNFLUSHED = sql<string>`set_config('synchronous_commit', 'off', true)`.as('unflushed');

/** A window's figures as every answer gives them (`hit`, `admit`, `peek`). */
const hitResult = (
  { limit, resetAtMs }: { limit: number; resetAtMs: number },
  used: number,
  allowed: boolean,
): HitResult => ({
  allowed,
  used,
  remaining: Math.max(0, limit - used),
  limit,
  resetAtMs,
});

/** A window of an admission, checked and placed in time. */
type PlannedWindow = {
  bucket: string;
  start: number;
  resetAtMs: number;
  limit: number;
  cost: number;
  /** The most units the window may hold after this request (a peek's: one fewer than its limit). */
  cap: number;
};

/**
 * An admission decided on the counts held in memory (`counts`, one per window): counted in all of them or in
 * none. Synchronous from the decision to the counts added: no other admission runs in between.
 */
function countHeld(held: HeldCounts, windows: PlannedWindow[], counts: HeldCount[]): AdmitResult {
  let allowed = true;
  for (let i = 0; i < windows.length; i++) {
    const window = windows[i] as PlannedWindow;
    if ((counts[i] as HeldCount).used + window.cost > window.cap) allowed = false;
  }
  const results: HitResult[] = [];
  for (let i = 0; i < windows.length; i++) {
    const window = windows[i] as PlannedWindow;
    const count = counts[i] as HeldCount;
    if (allowed) held.add(count, window.cost);
    // Refused, each window says whether it had room; its count is without this request.
    results.push(hitResult(window, count.used, allowed || count.used + window.cost <= window.cap));
  }
  return { allowed, windows: results };
}

/** The rate-limit repository. */
export function createRateLimits(database: Database, options: RateLimitsOptions = {}) {
  const { db } = database;
  const { now, randomId } = resolveOptions(options);

  function windowOf(windowMs: number, at: number) {
    const start = Math.floor(at / windowMs) * windowMs;
    return { start, resetAtMs: start + windowMs };
  }

  /** An admission's windows checked (bad or repeated windows throw) and placed at its time. */
  function plannedWindows(input: AdmitInput): PlannedWindow[] {
    const at = input.now ?? now();
    const windows = input.windows.map((window) => {
      const windowMs = positiveInteger('windowMs', window.windowMs);
      const limit = positiveInteger('limit', window.limit, true);
      const cost = window.peek ? 0 : positiveInteger('cost', window.cost ?? 1, true);
      const { start, resetAtMs } = windowOf(windowMs, at);
      // A peek needs room for one unit; a hit, room for its cost.
      return { bucket: window.bucket, start, resetAtMs, limit, cost, cap: window.peek ? limit - 1 : limit };
    });
    // Distinct, by comparison (a few windows: no set of them made and hashed per admission).
    for (let i = 1; i < windows.length; i++) {
      const bucket = windows[i]?.bucket;
      for (let j = 0; j < i; j++)
        if (windows[j]?.bucket === bucket)
          throw new InvalidInputError('windows', 'windows must name distinct buckets');
    }
    return windows;
  }

  const selectUsed = compiledOnce((bucket: string, windowStart: number) =>
    db
      .selectFrom('rate_limit_counters')
      .select('used')
      .where('bucket', '=', bucket)
      .where('window_start_ms', '=', windowStart),
  );
  /** A count's checked cost and its window (`add`'s, which has no limit). */
  function planCount(input: Omit<HitInput, 'limit'>) {
    const windowMs = positiveInteger('windowMs', input.windowMs);
    const cost = positiveInteger('cost', input.cost ?? 1, true);
    return { cost, ...windowOf(windowMs, input.now ?? now()) };
  }
  /** A hit's checked figures and its window. */
  function planHit(input: HitInput) {
    const { cost, start, resetAtMs } = planCount(input);
    return { limit: positiveInteger('limit', input.limit, true), cost, start, resetAtMs };
  }

  /** The hit's upsert: counted when the window has room (see the module comment). */
  const upsertHit = (bucket: string, windowStart: number, cost: number, limit: number) =>
    db
      .insertInto('rate_limit_counters')
      .values({ bucket, window_start_ms: windowStart, used: cost })
      .onConflict((oc) =>
        oc
          .columns(['bucket', 'window_start_ms'])
          .doUpdateSet((eb) => ({ used: eb('rate_limit_counters.used', '+', cost) }))
          .where((eb) => eb(eb('rate_limit_counters.used', '+', cost), '<=', limit)),
      );
  const countHit = compiledOnce((bucket: string, windowStart: number, cost: number, limit: number) =>
    upsertHit(bucket, windowStart, cost, limit).returning('used'),
  );
  // The same without RETURNING: what it changed says whether it counted. SQLite runs a RETURNING statement
  // through an ephemeral table, a B-tree with a page cache of its own opened and closed on every run (about
  // 5 µs here: bench/HISTORY.md, thirty-first round).
  const countHitQuietly = compiledOnceResult(upsertHit);

  async function current(bucket: string, windowStart: number, runner: StatementRunner = db): Promise<number> {
    const [row] = await selectUsed(runner, bucket, windowStart);
    return row ? toNumber(row.used) : 0;
  }

  const held =
    options.held === true && database.dialect === 'sqlite'
      ? createHeldCounts({
          read: (bucket, start, runner) => current(bucket, start, runner),
          // Whatever the limit: the counts were checked when they were made.
          write: (runner, bucket, start, cost) =>
            countHitQuietly(runner, bucket, start, cost, Number.MAX_SAFE_INTEGER),
          commit: (fn) => database.write(fn, JOIN_SHARED),
          now,
          ...options.heldCounts,
        })
      : undefined;

  /** A held window's count: looked up, or read from its row on `runner`. */
  async function heldCount(
    counts: HeldCounts,
    bucket: string,
    { start, resetAtMs }: { start: number; resetAtMs: number },
    runner?: StatementRunner,
  ): Promise<HeldCount> {
    const window = { bucket, start, resetAtMs };
    const [count] = counts.lookup([window]) ?? (await counts.counts([window], runner));
    return count as HeldCount;
  }

  type HitPlan = ReturnType<typeof planHit>;

  /** A hit counted in a held window when it has room (the cost within the limit); whether it was. */
  function countIn(counts: HeldCounts, count: HeldCount, plan: HitPlan): boolean {
    if (plan.cost > plan.limit || count.used + plan.cost > plan.limit) return false;
    counts.add(count, plan.cost);
    return true;
  }
  /** A refused hit's figures: the window as it is, this hit not counted. */
  const refusal = async (bucket: string, plan: HitPlan, runner: StatementRunner): Promise<HitResult> =>
    hitResult(plan, await current(bucket, plan.start, runner), false);

  /**
   * The admission statement for `count` windows (one compiled statement per count): the values are, per
   * window, bucket, window start, cost and cap (the most `used` may reach with the cost counted). Run on its
   * own only (its own transaction): on PostgreSQL it makes that transaction's commit asynchronous (see the
   * module comment), which must not reach a caller's transaction.
   */
  const countAllOf = new Map<number, ReturnType<typeof buildCountAll>>();
  function buildCountAll(count: number) {
    return compiledOnce((...values: (string | number)[]) => {
      const windows = Array.from({ length: count }, (_, i) => ({
        bucket: values[4 * i] as string,
        window_start_ms: values[4 * i + 1] as number,
        used: values[4 * i + 2] as number,
        cap: values[4 * i + 3] as number,
      }));
      return db
        .insertInto('rate_limit_counters')
        .values(windows.map(({ cap: _, ...row }) => row))
        .onConflict((oc) =>
          oc
            .columns(['bucket', 'window_start_ms'])
            .doUpdateSet((eb) => ({ used: eb('rate_limit_counters.used', '+', eb.ref('excluded.used')) }))
            .where((eb) => {
              // PostgreSQL types a CASE of parameters as text: the caps are cast to the column's type.
              let cap = eb
                .case('excluded.bucket')
                .when(windows[0]?.bucket as string)
                .then(eb.cast<number>(eb.val(windows[0]?.cap), 'bigint'));
              for (const window of windows.slice(1))
                cap = cap.when(window.bucket).then(eb.cast<number>(eb.val(window.cap), 'bigint'));
              return eb(eb('rate_limit_counters.used', '+', eb.ref('excluded.used')), '<=', cap.end());
            }),
        )
        .returning(
          database.dialect === 'postgres' ? ['bucket', 'used', ADMISSION_UNFLUSHED] : ['bucket', 'used'],
        );
    });
  }
  const countAll = (count: number) => {
    let statement = countAllOf.get(count);
    if (!statement) {
      statement = buildCountAll(count);
      countAllOf.set(count, statement);
    }
    return statement;
  };
  const uncount = compiledOnce((bucket: string, windowStart: number, cost: number) =>
    db
      .updateTable('rate_limit_counters')
      .set((eb) => ({ used: eb('used', '-', cost) }))
      .where('bucket', '=', bucket)
      .where('window_start_ms', '=', windowStart)
      .returning('used'),
  );

  return {
    /**
     * Counts `cost` units against the bucket's current window if they fit under `limit` (see the module
     * comment): on its own, or as a statement of the caller's transaction `runner` (committed with it).
     */
    async hit(input: HitInput, runner: StatementRunner = db): Promise<HitResult> {
      const plan = planHit(input);
      // Nothing can fit: answer without writing (an insert would count the first hit unconditionally).
      if (plan.cost > plan.limit) return refusal(input.bucket, plan, runner);
      const [row] = await countHit(runner, input.bucket, plan.start, plan.cost, plan.limit);
      if (row) return hitResult(plan, toNumber(row.used), true);
      return refusal(input.bucket, plan, runner);
    },

    /**
     * `hit` answering only whether it counted, for callers that need no figures when it does (it reads
     * nothing back). A refusal's figures, for its answer: `refused`. In the rows, the count goes with
     * `runner`'s transaction; held (`holds`), it is made in this process at once, checked and counted with
     * nothing awaited in between, whatever becomes of that transaction: a caller whose transaction does not
     * commit takes it back (`takeBack`).
     */
    async count(input: HitInput, runner: StatementRunner = db): Promise<boolean> {
      const plan = planHit(input);
      const { limit, cost, start } = plan;
      if (cost > limit) return false;
      if (!held) return changedAny(await countHitQuietly(runner, input.bucket, start, cost, limit));
      return countIn(held, await heldCount(held, input.bucket, plan, runner), plan);
    },

    /**
     * `count` decided at once on a window held in this process: counted when it has room, with the window's
     * figures either way (a refusal's as `refused` gives them); undefined when counts are not held or this
     * window is not yet (then `count`), having done nothing.
     */
    countNow(input: HitInput): HitResult | undefined {
      if (!held) return undefined;
      const plan = planHit(input);
      const [count] =
        held.lookup([{ bucket: input.bucket, start: plan.start, resetAtMs: plan.resetAtMs }]) ?? [];
      if (!count) return undefined;
      return hitResult(plan, count.used, countIn(held, count, plan));
    },

    /**
     * Takes back what `count` counted for a request whose transaction did not commit (with the same
     * `input`, its `now` included). Held counts only: in the rows the count went with that transaction.
     */
    async takeBack(input: HitInput): Promise<void> {
      if (!held) return;
      const plan = planHit(input);
      held.add(await heldCount(held, input.bucket, plan), -plan.cost);
    },

    /** What `hit` answers for a refusal of `input` (after `count` refused it, with the same `now`). */
    async refused(input: HitInput, runner: StatementRunner = db): Promise<HitResult> {
      const plan = planHit(input);
      if (!held) return refusal(input.bucket, plan, runner);
      return hitResult(plan, (await heldCount(held, input.bucket, plan, runner)).used, false);
    },

    /**
     * `hit` as a write embedded in another repository's statement (PostgreSQL; see EmbeddedWrite): counted
     * when the guard has its row, with the same condition as `hit`, returning a row when counted; undefined on
     * SQLite and when `hit` would write nothing.
     * What it does not give back are the figures of a refusal (`X-RateLimit-*`): for counts that need no answer
     * (tokens after the work is done) or whose refusal the caller works out by running `hit` (see
     * LedgerRepository.reserveWith).
     */
    hitAlong(input: HitInput): EmbeddedWrite | undefined {
      // SQLite's writes cannot be CTEs, nor do its statements cost round trips: callers run `hit`.
      if (database.dialect !== 'postgres') return undefined;
      const { limit, cost, start } = planHit(input);
      if (cost > limit) return undefined;
      return (guard) => sql`insert into rate_limit_counters (bucket, window_start_ms, used)
        select cast(${input.bucket} as text), cast(${start} as bigint), cast(${cost} as bigint) from ${guard}
        on conflict (bucket, window_start_ms) do update set used = rate_limit_counters.used + excluded.used
        where rate_limit_counters.used + excluded.used <= cast(${limit} as bigint)
        returning used`;
    },

    /**
     * `admit`'s answer at once when it needs neither a statement nor a wait: the counts held in memory and
     * every window's already there (one SQLite process, after the caller's first request in the window).
     * Undefined otherwise: the caller then awaits `admit`. Throws as `admit` rejects on a bad window.
     */
    admitNow(input: AdmitInput): AdmitResult | undefined {
      if (!held) return undefined;
      const windows = plannedWindows(input);
      const counts = held.lookup(windows);
      return counts ? countHeld(held, windows, counts) : undefined;
    },

    /**
     * Counts one request in all its windows at once, or in none (see the module comment): one statement
     * when every window admits it.
     */
    async admit(input: AdmitInput): Promise<AdmitResult> {
      const windows = plannedWindows(input);
      if (held) return countHeld(held, windows, held.lookup(windows) ?? (await held.counts(windows)));
      // Nothing can fit in some window: answer without writing (an insert would count unconditionally).
      if (windows.some((w) => w.cost > w.cap)) {
        const results = [];
        for (const window of windows) {
          const used = await current(window.bucket, window.start);
          results.push(hitResult(window, used, used + window.cost <= window.cap));
        }
        return { allowed: false, windows: results };
      }
      if (windows.length === 0) return { allowed: true, windows: [] };
      // Rows in one order (by bucket) for every admission: concurrent statements lock them in the same order.
      const ordered = [...windows].sort((a, b) => (a.bucket < b.bucket ? -1 : a.bucket > b.bucket ? 1 : 0));
      // On SQLite in the commit group under way, if any: under load its commit is shared.
      // A loop, not `flatMap`: V8 11 builds a `flatMap`'s result one runtime call per element.
      const values: Array<string | number> = [];
      for (const w of ordered) values.push(w.bucket, w.start, w.cost, w.cap);
      const rows = await database.write(
        (runner) => countAll(ordered.length)(runner, ...values),
        input.joinShared ? JOIN_SHARED : undefined,
      );
      const counted = new Map(rows.map((row) => [row.bucket, toNumber(row.used)]));
      if (counted.size === windows.length)
        return { allowed: true, windows: windows.map((w) => hitResult(w, counted.get(w.bucket) ?? 0, true)) };
      // Refused: take the request out of the windows that counted it, one row at a time (no lock waits on
      // a second row while one is held).
      const results = [];
      for (const window of windows) {
        const used = counted.get(window.bucket);
        if (used === undefined) {
          results.push(hitResult(window, await current(window.bucket, window.start), false));
        } else if (window.cost === 0) {
          results.push(hitResult(window, used, true));
        } else {
          const [row] = await uncount(db, window.bucket, window.start, window.cost);
          results.push(hitResult(window, row ? toNumber(row.used) : used - window.cost, true));
        }
      }
      return { allowed: false, windows: results };
    },

    /** The bucket's current window without counting anything (for `x-ratelimit-*` headers and status pages). */
    async peek(input: Omit<HitInput, 'cost'>): Promise<HitResult> {
      const windowMs = positiveInteger('windowMs', input.windowMs);
      const limit = positiveInteger('limit', input.limit, true);
      const { start, resetAtMs } = windowOf(windowMs, input.now ?? now());
      const used = held
        ? (await heldCount(held, input.bucket, { start, resetAtMs })).used
        : await current(input.bucket, start);
      return hitResult({ limit, resetAtMs }, used, used < limit);
    },

    /**
     * Counts units already used, whatever the limit (a finished request's tokens): held in this process when
     * counts are held (whatever becomes of `runner`'s transaction: the work was done), otherwise as `count`
     * does, in `runner`'s transaction.
     */
    async add(input: Omit<HitInput, 'limit'>, runner: StatementRunner = db): Promise<void> {
      const { cost, start, resetAtMs } = planCount(input);
      if (!held) {
        await countHitQuietly(runner, input.bucket, start, cost, Number.MAX_SAFE_INTEGER);
        return;
      }
      held.add(await heldCount(held, input.bucket, { start, resetAtMs }, runner), cost);
    },

    /** Whether this repository holds the counts of `admit`, `add` and `count` (RateLimitsOptions.held). */
    holds: held !== undefined,

    /** Writes the counts held in this process to their rows; resolves once committed. */
    flush(): Promise<void> {
      return held?.flush() ?? Promise.resolve();
    },

    /** Writes what is held, before the database closes; nothing held is written after it. */
    close(): Promise<void> {
      return held?.close() ?? Promise.resolve();
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
