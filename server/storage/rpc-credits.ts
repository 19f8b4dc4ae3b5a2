/**
 * The rolling 24-hour credit count of JSON-RPC callers, shared by every server instance through the database.
 * Credits are counted in one-minute buckets; the window is the 1440 most recent buckets (the current one
 * included). A request takes its worst-case credits up front (`takeIn`), and once the real cost is known,
 * `giveBack` returns the difference to the bucket it was taken from. Every bucket's credits are also counted
 * in its hour (`rpc_credit_hours`, written with the bucket), and the window is read as the buckets before its
 * first whole hour plus the hours from then on: at most 60 rows and 24, not 1,440 for a caller busy all day.
 *
 * `takeIn` runs inside the caller's transaction and takes no lock of its own: the caller holds one that every
 * take of the subject holds too. The proxy takes the credits inside the transaction of the request's ledger
 * reservation, after the account row is locked (`SELECT … FOR UPDATE` on PostgreSQL, the database write lock
 * on SQLite), the subject being that account, so concurrent requests on any number of instances never pass
 * the cap together, and the count and the hold are written (or refused) in one round trip.
 *
 * With `held` (SQLite served by one process), the windows are held in this process and written behind
 * (held-credits.ts): `takeIn` and `giveBack` then decide and count in memory whatever becomes of the caller's
 * transaction (a caller whose transaction does not commit gives its take back), and `takeNow` decides at once,
 * with no statement and no transaction, for a subject already held.
 */
import { sql } from 'kysely';
import { type Database, JOIN_SHARED } from './database.ts';
import { InvalidInputError } from './errors.ts';
import { FLUSH_MS } from './held-counts.ts';
import {
  createHeldCredits,
  type HeldCredits,
  type HeldCreditsOptions,
  type HeldTake,
  type HeldWindow,
} from './held-credits.ts';
import {
  changedAny,
  compiledOnce,
  compiledOnceResult,
  DAY_MS,
  type EmbeddedWrite,
  type RepositoryOptions,
  resolveOptions,
  type StatementRunner,
  toNumber,
} from './internal.ts';

const MINUTE_MS = 60_000;
const HOUR_MS = 3_600_000;

export type CreditTakeInput = {
  /** Who is counted (the caller's account). */
  subject: string;
  credits: number;
  /** Credits allowed in any rolling 24 hours. */
  limit: number;
  now?: number;
};

export type CreditTakeResult =
  | {
      allowed: true;
      /** The bucket the credits went to (pass to giveBack). */
      bucketMs: number;
    }
  | {
      allowed: false;
      used: number;
      /** When the oldest counted bucket leaves the window (epoch ms); undefined when nothing is counted. */
      nextReleaseAtMs: number | undefined;
    };

export type CreditGiveBackInput = { subject: string; bucketMs: number; credits: number };

export type RpcCreditsRepository = ReturnType<typeof createRpcCredits>;

export type RpcCreditsOptions = RepositoryOptions & {
  /**
   * Hold the windows in this process and write them behind (held-credits.ts): only for a database no other
   * process counts in (SQLite served by one process). Ignored on PostgreSQL.
   */
  held?: boolean;
  heldCredits?: Pick<HeldCreditsOptions, 'flushMs' | 'capacity'>;
};

function credits(field: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new InvalidInputError(field, `${field} must be a non-negative integer`);
  }
  return value;
}

/**
 * The bucket of `at` and its hour; the oldest bucket of the rolling 24 hours ending with it, and the first
 * hour wholly inside them (every later hour is: none holds a bucket after `at`'s but a clock ahead's).
 */
function windowAt(at: number) {
  const bucketMs = Math.floor(at / MINUTE_MS) * MINUTE_MS;
  const oldest = bucketMs - DAY_MS + MINUTE_MS;
  return {
    bucketMs,
    hourMs: Math.floor(bucketMs / HOUR_MS) * HOUR_MS,
    oldest,
    wholeHours: Math.ceil(oldest / HOUR_MS) * HOUR_MS,
  };
}

/**
 * The subject's credits in the window: its buckets from `oldest` up to the first whole hour, then its hours.
 * The values are placed as parameters (compiledOnce stand-ins), cast for PostgreSQL.
 */
function windowSum(subject: unknown, oldest: unknown, wholeHours: unknown) {
  return sql<string | number | bigint>`((select coalesce(sum(credits), 0) from rpc_credit_usage
      where subject = cast(${subject} as text) and bucket_ms >= cast(${oldest} as bigint)
        and bucket_ms < cast(${wholeHours} as bigint))
    + (select coalesce(sum(credits), 0) from rpc_credit_hours
      where subject = cast(${subject} as text) and hour_ms >= cast(${wholeHours} as bigint)))`;
}

/** A held take's answer in the repository's terms. */
function takeResult(take: HeldTake): CreditTakeResult {
  if (take.taken) return { allowed: true, bucketMs: take.bucketMs };
  return {
    allowed: false,
    used: take.used,
    nextReleaseAtMs: take.first === undefined ? undefined : take.first + DAY_MS,
  };
}

export function createRpcCredits(database: Database, options: RpcCreditsOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);
  // The statements of every take and give-back, compiled once (see compiledOnce).
  const selectUsage = compiledOnce((subject: string, oldest: number, wholeHours: number) =>
    db.selectNoFrom([
      windowSum(subject, oldest, wholeHours).as('used'),
      sql<string | number | bigint | null>`(select min(bucket_ms) from rpc_credit_usage
        where subject = cast(${subject} as text) and bucket_ms >= cast(${oldest} as bigint))`.as('first'),
    ]),
  );
  const addUsage = compiledOnce((subject: string, bucketMs: number, amount: number) =>
    db
      .insertInto('rpc_credit_usage')
      .values({ subject, bucket_ms: bucketMs, credits: amount })
      .onConflict((oc) =>
        oc
          .columns(['subject', 'bucket_ms'])
          .doUpdateSet((eb) => ({ credits: eb('rpc_credit_usage.credits', '+', amount) })),
      ),
  );
  const addHour = compiledOnce((subject: string, hourMs: number, amount: number) =>
    db
      .insertInto('rpc_credit_hours')
      .values({ subject, hour_ms: hourMs, credits: amount })
      .onConflict((oc) =>
        oc
          .columns(['subject', 'hour_ms'])
          .doUpdateSet((eb) => ({ credits: eb('rpc_credit_hours.credits', '+', amount) })),
      ),
  );
  // A take in one statement: the bucket's upsert, guarded by the window's sum (refused: it changes nothing); the
  // minute's first take (see addToBucketIfRoom). Neither it nor the give-back reads anything back: on SQLite a
  // RETURNING statement runs through an ephemeral table, a B-tree with a page cache of its own opened and closed
  // on every run (about 5 µs here: bench/HISTORY.md, thirty-first round); what the statement changed says
  // whether it wrote.
  const addUsageIfRoom = compiledOnceResult(
    (subject: string, bucketMs: number, amount: number, oldest: number, wholeHours: number, room: number) =>
      db
        .insertInto('rpc_credit_usage')
        .columns(['subject', 'bucket_ms', 'credits'])
        .expression(
          db
            .selectNoFrom((eb) => [
              eb.cast<string>(eb.val(subject), 'text').as('subject'),
              eb.cast<number>(eb.val(bucketMs), 'bigint').as('bucket_ms'),
              eb.cast<number>(eb.val(amount), 'bigint').as('credits'),
            ])
            .where((eb) => eb(windowSum(subject, oldest, wholeHours), '<=', room)),
        )
        .onConflict((oc) =>
          oc.columns(['subject', 'bucket_ms']).doUpdateSet((eb) => ({
            credits: eb('rpc_credit_usage.credits', '+', eb.ref('excluded.credits')),
          })),
        ),
  );
  // A take into a bucket already there (every take of a minute but its first): an update guarded by the same
  // sum. SQLite runs the upsert above, an INSERT whose SELECT reads its own table, through a temporary table it
  // fills first (an ephemeral B-tree per call); this update needs none (bench/HISTORY.md, thirty-seventh round).
  const addToBucketIfRoom = compiledOnceResult(
    (amount: number, subject: string, bucketMs: number, oldest: number, wholeHours: number, room: number) =>
      db
        .updateTable('rpc_credit_usage')
        .set((eb) => ({ credits: eb('credits', '+', amount) }))
        .where('subject', '=', subject)
        .where('bucket_ms', '=', bucketMs)
        .where((eb) => eb(windowSum(subject, oldest, wholeHours), '<=', room)),
  );
  const subtractUsage = compiledOnceResult(
    (amount: number, subject: string, bucketMs: number, atLeast: number) =>
      db
        .updateTable('rpc_credit_usage')
        .set((eb) => ({ credits: eb('credits', '-', amount) }))
        .where('subject', '=', subject)
        .where('bucket_ms', '=', bucketMs)
        .where('credits', '>=', atLeast),
  );
  const subtractHour = compiledOnce((amount: number, subject: string, hourMs: number, atLeast: number) =>
    db
      .updateTable('rpc_credit_hours')
      .set((eb) => ({ credits: eb('credits', '-', amount) }))
      .where('subject', '=', subject)
      .where('hour_ms', '=', hourMs)
      .where('credits', '>=', atLeast),
  );

  const selectBuckets = compiledOnce((subject: string, oldest: number) =>
    db
      .selectFrom('rpc_credit_usage')
      .select(['bucket_ms', 'credits'])
      .where('subject', '=', subject)
      .where('bucket_ms', '>=', oldest)
      .orderBy('bucket_ms'),
  );
  const held =
    options.held === true && database.dialect === 'sqlite'
      ? createHeldCredits({
          read: async (subject, oldest, runner = db) =>
            (await selectBuckets(runner, subject, oldest)).map((row) => ({
              bucketMs: toNumber(row.bucket_ms),
              credits: toNumber(row.credits),
            })),
          write: async (runner, subject, bucketMs, amount) => {
            const hourMs = Math.floor(bucketMs / HOUR_MS) * HOUR_MS;
            if (amount >= 0) {
              await addUsage(runner, subject, bucketMs, amount);
              await addHour(runner, subject, hourMs, amount);
            } else if (changedAny(await subtractUsage(runner, -amount, subject, bucketMs, -amount))) {
              // More given back than taken since the last write: the rows have the take. (An upsert of a
              // negative row would fail its CHECK before its conflict is seen.)
              await subtractHour(runner, -amount, subject, hourMs, -amount);
            }
          },
          commit: (fn) => database.write(fn, JOIN_SHARED),
          now,
          // The window's oldest minute before its latest (windowAt).
          spanMs: DAY_MS - MINUTE_MS,
          flushMs: FLUSH_MS,
          ...options.heldCredits,
        })
      : undefined;

  /** A take of `amount` within `limit` decided on the subject's held window, at the minute of `input.now`. */
  function takeHeld(
    windows: HeldCredits,
    window: HeldWindow,
    input: CreditTakeInput,
    amount: number,
    limit: number,
  ): CreditTakeResult {
    return takeResult(windows.take(window, windowAt(input.now ?? now()).bucketMs, amount, limit));
  }

  return {
    /**
     * Counts `credits` for the subject if the rolling 24-hour total stays within `limit`, inside the caller's
     * transaction `trx`, which must hold the lock that serialises the subject's takes (see the module comment).
     * Held (`holds`), counted in this process whatever becomes of that transaction (a window not held yet is
     * read on it): a caller whose transaction does not commit gives the take back (`giveBack`).
     */
    async takeIn(trx: StatementRunner, input: CreditTakeInput): Promise<CreditTakeResult> {
      const amount = credits('credits', input.credits);
      const limit = credits('limit', input.limit);
      const { bucketMs, hourMs, oldest, wholeHours } = windowAt(input.now ?? now());
      if (held) return takeHeld(held, await held.window(input.subject, bucketMs, trx), input, amount, limit);
      if (amount > 0 && amount <= limit) {
        const room = limit - amount;
        // The bucket's update when it is there, else its upsert (which refuses again what the update refused).
        const added =
          changedAny(
            await addToBucketIfRoom(trx, amount, input.subject, bucketMs, oldest, wholeHours, room),
          ) ||
          changedAny(await addUsageIfRoom(trx, input.subject, bucketMs, amount, oldest, wholeHours, room));
        if (added) {
          await addHour(trx, input.subject, hourMs, amount);
          return { allowed: true, bucketMs };
        }
      }
      // Refused (or nothing to take): the figures of the answer.
      const [row] = await selectUsage(trx, input.subject, oldest, wholeHours);
      const used = toNumber(row?.used ?? 0);
      if (used + amount > limit) {
        const first = row?.first;
        return {
          allowed: false,
          used,
          nextReleaseAtMs: first === null || first === undefined ? undefined : toNumber(first) + DAY_MS,
        };
      }
      if (amount > 0) {
        await addUsage(trx, input.subject, bucketMs, amount);
        await addHour(trx, input.subject, hourMs, amount);
      }
      return { allowed: true, bucketMs };
    },

    /**
     * `takeIn` decided at once, with no statement, for a subject whose window is held; undefined when it is
     * not (or nothing is held: `takeIn`), having done nothing.
     */
    takeNow(input: CreditTakeInput): CreditTakeResult | undefined {
      const window = held?.lookup(input.subject);
      if (!held || !window) return undefined;
      return takeHeld(held, window, input, credits('credits', input.credits), credits('limit', input.limit));
    },

    /**
     * `takeIn` as writes embedded in the reservation's statement (PostgreSQL; see EmbeddedWrite), with the
     * bucket it takes from: the bucket's upsert when the window's sum leaves room, returning a row when taken,
     * then its hour's, guarded by it. Sound only where that statement runs after the subject's lock is taken,
     * in a statement of its own (its snapshot then holds every take that held the lock before:
     * LedgerRepository.reserveWith). Undefined on SQLite and for what is not the common take (nothing to take,
     * or more than the limit): `takeIn` decides.
     */
    takeAlong(input: CreditTakeInput): { writes: EmbeddedWrite[]; bucketMs: number } | undefined {
      if (database.dialect !== 'postgres') return undefined;
      const amount = credits('credits', input.credits);
      const limit = credits('limit', input.limit);
      if (amount === 0 || amount > limit) return undefined;
      const { bucketMs, hourMs, oldest, wholeHours } = windowAt(input.now ?? now());
      const bucket: EmbeddedWrite = (guard) => sql`insert into rpc_credit_usage (subject, bucket_ms, credits)
        select cast(${input.subject} as text), cast(${bucketMs} as bigint), cast(${amount} as bigint)
        from ${guard}
        where ${windowSum(input.subject, oldest, wholeHours)} <= cast(${limit - amount} as bigint)
        on conflict (subject, bucket_ms) do update set credits = rpc_credit_usage.credits + excluded.credits
        returning credits`;
      const hour: EmbeddedWrite = (guard) => sql`insert into rpc_credit_hours (subject, hour_ms, credits)
        select cast(${input.subject} as text), cast(${hourMs} as bigint), cast(${amount} as bigint)
        from ${guard}
        on conflict (subject, hour_ms) do update set credits = rpc_credit_hours.credits + excluded.credits
        returning credits`;
      return { writes: [bucket, hour], bucketMs };
    },

    /**
     * Returns credits taken but not spent (the worst case was more than the real cost) to their bucket and its
     * hour: on their own or in the caller's transaction `runner`. Held, at once, whatever becomes of that
     * transaction.
     */
    async giveBack(input: CreditGiveBackInput, runner: StatementRunner = db): Promise<void> {
      const amount = credits('credits', input.credits);
      if (amount === 0) return;
      if (held) {
        const window = await held.window(input.subject, windowAt(now()).bucketMs, runner);
        held.giveBack(window, input.bucketMs, amount);
        return;
      }
      const returned = await subtractUsage(runner, amount, input.subject, input.bucketMs, amount);
      // Only what the bucket still held (it may have been pruned): the hour holds at least as much.
      if (changedAny(returned)) {
        await subtractHour(
          runner,
          amount,
          input.subject,
          Math.floor(input.bucketMs / HOUR_MS) * HOUR_MS,
          amount,
        );
      }
    },

    /** The subject's credits in the current rolling 24 hours. */
    async used(subject: string, at: number = now()): Promise<number> {
      const { oldest, wholeHours } = windowAt(at);
      if (held) {
        // Held with every bucket from `oldest` on: from memory, what is not yet written included; otherwise
        // (not held, or `at` before what the window still holds) from the rows once they have everything.
        const counted = held.usedFrom(subject, oldest);
        if (counted !== undefined) return counted;
        await held.flush();
      }
      const [row] = await selectUsage(db, subject, oldest, wholeHours);
      return toNumber(row?.used ?? 0);
    },

    /** Whether the windows are held in this process (RpcCreditsOptions.held). */
    holds: held !== undefined,

    /** Whether the subject's window is held now (`takeNow` decides for it). */
    holdsNow: (subject: string): boolean => held?.lookup(subject) !== undefined,

    /** Writes what is held to the rows; resolves once committed. */
    flush(): Promise<void> {
      return held?.flush() ?? Promise.resolve();
    },

    /** Writes what is held, before the database closes; nothing held is written after it. */
    close(): Promise<void> {
      return held?.close() ?? Promise.resolve();
    },

    /** Deletes buckets that started before `beforeMs`, and hours that ended by then; returns how many buckets. */
    async prune(beforeMs: number): Promise<number> {
      // Neither is read once out of the window: no transaction needed between them.
      await db
        .deleteFrom('rpc_credit_hours')
        .where('hour_ms', '<=', beforeMs - HOUR_MS)
        .execute();
      const result = await db
        .deleteFrom('rpc_credit_usage')
        .where('bucket_ms', '<', beforeMs)
        .executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
