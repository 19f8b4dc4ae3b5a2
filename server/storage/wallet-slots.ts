/**
 * Request slots of wallet accounts: how many paid requests a wallet has in flight, capped across every
 * server process. Taking a slot locks the account row (PostgreSQL `FOR UPDATE`; SQLite's BEGIN IMMEDIATE takes
 * the write lock), counts the live slots and inserts one, so concurrent requests cannot both take the last
 * slot. A slot outlives a crashed process only until its lease expires.
 *
 * On PostgreSQL a slot is taken in one round trip (the script of the lock, then one statement that counts and
 * inserts: it starts after the lock is granted, so in READ COMMITTED it sees every slot committed before), and
 * neither taking nor freeing one waits for its WAL to be flushed (`synchronous_commit` off for that
 * transaction alone, as the rate-limit admission does). A slot moves no money; what a crash of the database
 * could lose is the last fraction of a second of slots: a slot taken but lost lets its wallet run one more
 * request for as long as that request lasts, a freed slot that comes back holds one of the wallet's five until
 * its lease ends. A request's reservation, committed synchronously after its slot, flushes the slot's record
 * with its own. This saves a request four round trips and a WAL flush before its work, and the release
 * one flush after it.
 *
 * `take` also reads the account's balance under the same lock (PostgreSQL: in the same statement; SQLite: the
 * statement that takes the write lock), for the wallet's admission minimum, which so costs no round trip of
 * its own.
 */
import { sql } from 'kysely';
import type { Database } from './database.ts';
import { NotFoundError } from './errors.ts';
import { EAGER } from './group-commit.ts';
import { heldUsdOf } from './held-reservations.ts';
import {
  compiledOnce,
  epochDayOf,
  type RepositoryOptions,
  resolveOptions,
  scriptThenPrepared,
  toNumber,
  withLiterals,
} from './internal.ts';
import { type Balance, type BalanceRow, balanceOfRow, balanceQuery } from './ledger.ts';

/** `set_config(…, true)`: `synchronous_commit` off for the rest of the statement's transaction (PostgreSQL). */
const UNFLUSHED = sql<string>`set_config('synchronous_commit', 'off', true)`;

export type WalletSlotsRepository = ReturnType<typeof createWalletSlots>;

/** What `take` asks for: a slot of `accountId` unless `max` are live, held for `leaseMs`. */
export type TakeSlotInput = { accountId: string; max: number; leaseMs: number };

/** A slot taken (`id`; `undefined` when `max` were already live) and the account's balance read with it. */
export type TakenSlot = { id: string | undefined; balance: Balance };

export function createWalletSlots(database: Database, options: RepositoryOptions = {}) {
  const { db, dialect } = database;
  const { now, randomId } = resolveOptions(options);
  // PostgreSQL: its commit does not wait for the flush (see the top).
  const free = compiledOnce((id: string) => {
    const freed = db.deleteFrom('wallet_request_slots').where('id', '=', id);
    return dialect === 'postgres' ? freed.returning(UNFLUSHED.as('unflushed')) : freed;
  });

  // SQLite: the statements of `take` (the balance's first: it takes the write lock).
  const selectBalance = compiledOnce(balanceQuery(db));
  const countLive = compiledOnce((accountId: string, at: number) =>
    db
      .selectFrom('wallet_request_slots')
      .select((eb) => eb.fn.countAll<number | bigint>().as('n'))
      .where('account_id', '=', accountId)
      .where('expires_at_ms', '>', at),
  );
  const insertSlot = compiledOnce((id: string, accountId: string, expiresAtMs: number) =>
    db.insertInto('wallet_request_slots').values({ id, account_id: accountId, expires_at_ms: expiresAtMs }),
  );

  /** PostgreSQL: `take` in one round trip, committed without waiting for the flush (see the top). */
  async function takeAtOnce(input: TakeSlotInput, at: number): Promise<TakenSlot> {
    const id = randomId();
    const account = input.accountId;
    const lock = sql`select 1 from accounts where id = ${account} for update`;
    const take = sql<BalanceRow & { found: boolean; id: string | null; unflushed: string }>`with live as (
        select count(*) as n from wallet_request_slots
        where account_id = ${account} and expires_at_ms > cast(${at} as bigint)),
      taken as (insert into wallet_request_slots (id, account_id, expires_at_ms)
        select ${id}, ${account}, cast(${at + input.leaseMs} as bigint) from live
        where live.n < cast(${input.max} as bigint) and exists (select 1 from accounts where id = ${account})
        returning id)
      select a.id is not null as found, (select id from taken) as id, a.usd_balance_nano, a.usd_reserved_nano,
        a.diem_stake_nano, d.used_nano, d.reserved_nano, ${UNFLUSHED} as unflushed
      from (select 1) as one
        left join accounts a on a.id = ${account}
        left join diem_usage d on d.account_id = ${account} and d.epoch_day = cast(${epochDayOf(at)} as integer)`;
    const [row] = await scriptThenPrepared(database, withLiterals(lock.compile(db)), take.compile(db));
    if (!row?.found) throw new NotFoundError('account', input.accountId);
    return { id: row.id ?? undefined, balance: balanceOfRow(row) };
  }

  /**
   * Takes a slot unless `max` are live, and reads the account's balance under the same lock: the balance as
   * the slot's transaction found it, whether or not a slot was taken.
   */
  async function take(input: TakeSlotInput): Promise<TakenSlot> {
    const at = now();
    if (dialect === 'postgres') return takeAtOnce(input, at);
    // Eager (group-commit.ts): the request waits on its slot before its work.
    return database.transaction(async (trx) => {
      // The first statement of the transaction: SQLite's write lock is already held (BEGIN IMMEDIATE).
      const [row] = await selectBalance(trx, epochDayOf(at), input.accountId);
      if (!row) throw new NotFoundError('account', input.accountId);
      const balance = balanceOfRow(row, heldUsdOf(database, input.accountId));
      const [live] = await countLive(trx, input.accountId, at);
      if (toNumber(live?.n ?? 0) >= input.max) return { id: undefined, balance };
      const id = randomId();
      await insertSlot(trx, id, input.accountId, at + input.leaseMs);
      return { id, balance };
    }, EAGER);
  }

  return {
    take,

    /**
     * Frees a slot (idempotent). A short write (`Database.write`): on SQLite it joins the commit group under
     * way, when there is one (the captures of the requests answered with it, say), instead of committing alone.
     */
    async release(id: string): Promise<void> {
      await database.write((runner) => free(runner, id));
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
