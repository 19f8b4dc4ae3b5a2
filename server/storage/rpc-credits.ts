/**
 * The rolling 24-hour credit count of JSON-RPC callers, shared by every server instance through the database.
 * Credits are counted in one-minute buckets; the window is the 1440 most recent buckets (the current one
 * included). A request takes its worst-case credits up front (`take`), inside one transaction that holds a
 * per-caller lock row (`SELECT … FOR UPDATE` on PostgreSQL, the database write lock on SQLite), so concurrent
 * requests on any number of instances never pass the cap together; once the real cost is known, `giveBack`
 * returns the difference to the bucket it was taken from.
 */
import { sql } from 'kysely';
import type { Database } from './database.ts';
import { InvalidInputError } from './errors.ts';
import { compiledOnce, DAY_MS, type RepositoryOptions, resolveOptions, toNumber } from './internal.ts';

const MINUTE_MS = 60_000;

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
      allowed: true /** The bucket the credits went to (pass to giveBack). */;
      bucketMs: number;
      used: number;
    }
  | {
      allowed: false;
      used: number;
      /** When the oldest counted bucket leaves the window (epoch ms); undefined when nothing is counted. */
      nextReleaseAtMs: number | undefined;
    };

export type RpcCreditsRepository = ReturnType<typeof createRpcCredits>;

function credits(field: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new InvalidInputError(field, `${field} must be a non-negative integer`);
  }
  return value;
}

export function createRpcCredits(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);
  const postgres = database.dialect === 'postgres';
  // The statements of every take, compiled once (see compiledOnce).
  const ensureSubject = compiledOnce((subject: string) =>
    db
      .insertInto('rpc_credit_subjects')
      .values({ subject })
      .onConflict((oc) => oc.column('subject').doNothing()),
  );
  const lockSubject = compiledOnce((subject: string) =>
    db.selectFrom('rpc_credit_subjects').select('subject').where('subject', '=', subject).forUpdate(),
  );
  const selectUsage = compiledOnce((subject: string, oldest: number) =>
    db
      .selectFrom('rpc_credit_usage')
      .select([
        sql<string | number | bigint>`coalesce(sum(credits), 0)`.as('used'),
        sql<string | number | bigint | null>`min(bucket_ms)`.as('first'),
      ])
      .where('subject', '=', subject)
      .where('bucket_ms', '>=', oldest),
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

  return {
    /** Counts `credits` for the subject if the rolling 24-hour total stays within `limit`. */
    async take(input: CreditTakeInput): Promise<CreditTakeResult> {
      const amount = credits('credits', input.credits);
      const limit = credits('limit', input.limit);
      const at = input.now ?? now();
      const bucketMs = Math.floor(at / MINUTE_MS) * MINUTE_MS;
      const oldest = bucketMs - DAY_MS + MINUTE_MS;
      return db.transaction().execute(async (trx) => {
        await ensureSubject(trx, input.subject);
        if (postgres) await lockSubject(trx, input.subject);
        const [row] = await selectUsage(trx, input.subject, oldest);
        const used = toNumber(row?.used ?? 0);
        if (used + amount > limit) {
          const first = row?.first;
          return {
            allowed: false as const,
            used,
            nextReleaseAtMs: first === null || first === undefined ? undefined : toNumber(first) + DAY_MS,
          };
        }
        if (amount > 0) {
          await addUsage(trx, input.subject, bucketMs, amount);
        }
        return { allowed: true as const, bucketMs, used: used + amount };
      });
    },

    /** Returns credits taken but not spent (the worst case was more than the real cost). */
    async giveBack(input: { subject: string; bucketMs: number; credits: number }): Promise<void> {
      const amount = credits('credits', input.credits);
      if (amount === 0) return;
      await db
        .updateTable('rpc_credit_usage')
        .set((eb) => ({ credits: eb('credits', '-', amount) }))
        .where('subject', '=', input.subject)
        .where('bucket_ms', '=', input.bucketMs)
        .where('credits', '>=', amount)
        .execute();
    },

    /** The subject's credits in the current rolling 24 hours. */
    async used(subject: string, at: number = now()): Promise<number> {
      const oldest = Math.floor(at / MINUTE_MS) * MINUTE_MS - DAY_MS + MINUTE_MS;
      const row = await db
        .selectFrom('rpc_credit_usage')
        .select(sql<string | number | bigint>`coalesce(sum(credits), 0)`.as('used'))
        .where('subject', '=', subject)
        .where('bucket_ms', '>=', oldest)
        .executeTakeFirst();
      return toNumber(row?.used ?? 0);
    },

    /** Deletes buckets that started before `beforeMs`; returns how many. */
    async prune(beforeMs: number): Promise<number> {
      const result = await db
        .deleteFrom('rpc_credit_usage')
        .where('bucket_ms', '<', beforeMs)
        .executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
