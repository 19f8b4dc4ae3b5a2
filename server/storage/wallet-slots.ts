/**
 * Request slots of wallet accounts: how many paid requests a wallet has in flight, capped across every
 * server process. Taking a slot locks the account row (PostgreSQL `FOR UPDATE`; SQLite's BEGIN IMMEDIATE takes
 * the write lock), counts the live slots and inserts one, so concurrent requests cannot both take the last
 * slot. A slot outlives a crashed process only until its lease expires.
 */
import type { Database } from './database.ts';
import { NotFoundError } from './errors.ts';
import { EAGER } from './group-commit.ts';
import { type RepositoryOptions, resolveOptions, toNumber } from './internal.ts';

export type WalletSlotsRepository = ReturnType<typeof createWalletSlots>;

export function createWalletSlots(database: Database, options: RepositoryOptions = {}) {
  const { db, dialect } = database;
  const { now, randomId } = resolveOptions(options);
  return {
    /** Takes a slot; returns its id, or `undefined` when `max` slots are already live. */
    async acquire(input: { accountId: string; max: number; leaseMs: number }): Promise<string | undefined> {
      const at = now();
      // Eager (group-commit.ts): the request waits on its slot before its work.
      return database.transaction(async (trx) => {
        let lock = trx.selectFrom('accounts').select('id').where('id', '=', input.accountId);
        if (dialect === 'postgres') lock = lock.forUpdate();
        if (!(await lock.executeTakeFirst())) throw new NotFoundError('account', input.accountId);
        const { n } = await trx
          .selectFrom('wallet_request_slots')
          .select((eb) => eb.fn.countAll<number | bigint>().as('n'))
          .where('account_id', '=', input.accountId)
          .where('expires_at_ms', '>', at)
          .executeTakeFirstOrThrow();
        if (toNumber(n) >= input.max) return undefined;
        const id = randomId();
        await trx
          .insertInto('wallet_request_slots')
          .values({ id, account_id: input.accountId, expires_at_ms: at + input.leaseMs })
          .execute();
        return id;
      }, EAGER);
    },

    /** Frees a slot (idempotent). */
    async release(id: string): Promise<void> {
      await db.deleteFrom('wallet_request_slots').where('id', '=', id).execute();
    },

    /** Drops slots whose lease has passed; returns how many. */
    async prune(at: number = now()): Promise<number> {
      const result = await db
        .deleteFrom('wallet_request_slots')
        .where('expires_at_ms', '<=', at)
        .executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
