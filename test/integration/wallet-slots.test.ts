/**
 * Wallet request slots (server/storage/wallet-slots.ts) on SQLite and on a real PostgreSQL: at most `max` live
 * slots per account however many requests ask at once (on PostgreSQL also when they all queue behind another
 * process's lock of the account and are let go together), freed slots and expired ones do not count, an
 * unknown account is refused, the account's balance (DIEM of the day included) is read with the slot for the
 * wallet's admission minimum; on PostgreSQL a slot is taken in one round trip, and taking and freeing one
 * commit without waiting for the WAL flush.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CompiledQuery, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  createAccounts,
  createDatabase,
  createLedger,
  type Database,
  migrate,
} from '../../server/storage/index.ts';
import { createWalletSlots, type TakeSlotInput } from '../../server/storage/wallet-slots.ts';
import { holdAccountLock, type StartedPostgres, startPostgres } from '../support/postgres.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-slots-'));
let postgres: StartedPostgres | undefined;

afterAll(async () => {
  await postgres?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

const engines: Array<[string, () => Promise<string>]> = [
  ['sqlite', async () => `sqlite:${join(scratch, 'slots.sqlite')}`],
  [
    'postgres',
    async () => {
      postgres ??= await startPostgres();
      return postgres.createDatabase('wallet_slots');
    },
  ],
];

const T0 = Date.UTC(2026, 10, 27, 12);

describe.each(engines)('wallet request slots on %s', (engine, url) => {
  let database: Database;
  let databaseUrl: string;
  let clock = T0;
  const slots = () => createWalletSlots(database, { now: () => clock });
  /** A slot's id, or undefined when `max` are live (the balance `take` reads with it is tested below). */
  const acquire = async (input: TakeSlotInput) => (await slots().take(input)).id;
  const newWallet = async () => {
    const address = `0x${randomBytes(20).toString('hex')}`;
    return (await createAccounts(database).findOrCreateWalletAccount(address)).account.id;
  };

  beforeAll(async () => {
    databaseUrl = await url();
    database = await createDatabase(databaseUrl, { poolMax: 12 });
    await migrate(database);
  }, 120_000);

  afterAll(async () => {
    await database?.close();
  });

  test('behavior: of 12 requests at once, 5 take a slot; a freed slot and an expired one come back', async () => {
    const accountId = await newWallet();
    const taken = await Promise.all(
      Array.from({ length: 12 }, () => acquire({ accountId, max: 5, leaseMs: 60_000 })),
    );
    const ids = taken.filter((id) => id !== undefined);
    expect(ids).toHaveLength(5);
    expect(new Set(ids).size).toBe(5);
    expect(await acquire({ accountId, max: 5, leaseMs: 60_000 })).toBeUndefined();
    // Freed (twice: idempotent), one comes back, once.
    await slots().release(ids[0] as string);
    await slots().release(ids[0] as string);
    expect(await acquire({ accountId, max: 5, leaseMs: 60_000 })).toEqual(expect.any(String));
    expect(await acquire({ accountId, max: 5, leaseMs: 60_000 })).toBeUndefined();
    // Past their lease, slots of a crashed process no longer count.
    clock += 60_000;
    expect(await acquire({ accountId, max: 5, leaseMs: 60_000 })).toEqual(expect.any(String));
    clock = T0;
  });

  test('behavior: take reads the account’s balance with the slot (DIEM of the day included), also when none is free', async () => {
    const accountId = await newWallet();
    const ledger = createLedger(database, { now: () => clock });
    await ledger.topUp({ accountId, amountNano: 3_000_000_000n });
    await createAccounts(database).setDiemStake(accountId, 500_000_000n);
    // 0.5 of the hold from today's DIEM allowance, 0.2 from USD credit.
    await ledger.reserve({ accountId, amountNano: 700_000_000n, requestId: 'req-take', ttlMs: 60_000 });
    const expected = await ledger.getBalance(accountId, clock);
    expect(expected).toMatchObject({
      usdReservedNano: 200_000_000n,
      diemReservedTodayNano: 500_000_000n,
      usdAvailableNano: 2_800_000_000n,
      diemAvailableNano: 0n,
    });
    const taken = await slots().take({ accountId, max: 1, leaseMs: 60_000 });
    expect(taken).toEqual({ id: expect.any(String), balance: expected });
    expect(await slots().take({ accountId, max: 1, leaseMs: 60_000 })).toEqual({
      id: undefined,
      balance: expected,
    });
    // The next UTC day has its own DIEM allowance; the day's counters are read for the slot's own time.
    clock += 24 * 60 * 60 * 1000;
    const nextDay = await slots().take({ accountId, max: 1, leaseMs: 60_000 });
    expect(nextDay.balance).toEqual(await ledger.getBalance(accountId, clock));
    expect(nextDay.balance.diemAvailableNano).toBe(500_000_000n);
    clock = T0;
  });

  test('behavior: an unknown account is refused, and nothing is written for it', async () => {
    await expect(acquire({ accountId: 'no-such-account', max: 5, leaseMs: 60_000 })).rejects.toThrow(
      /account/,
    );
    const rows = await database.db
      .selectFrom('wallet_request_slots')
      .select('id')
      .where('account_id', '=', 'no-such-account')
      .execute();
    expect(rows).toEqual([]);
  });

  test.runIf(engine === 'postgres')(
    'behavior: requests queued behind another process’s lock of the account, let go together, take at most 5',
    async () => {
      const accountId = await newWallet();
      // The other process holds the account's lock and takes two slots under it.
      const elsewhere = await createDatabase(databaseUrl, { poolMax: 2 });
      try {
        const holder = await holdAccountLock(elsewhere, accountId, async (trx) => {
          for (const id of ['held-1', 'held-2']) {
            await trx
              .insertInto('wallet_request_slots')
              .values({ id: `${id}-${accountId}`, account_id: accountId, expires_at_ms: T0 + 60_000 })
              .execute();
          }
        });
        const waiting = Array.from({ length: 10 }, () => acquire({ accountId, max: 5, leaseMs: 60_000 }));
        await holder.waitForWaiter();
        await holder.release();
        // Each waiter counts after the lock is granted: it sees the two slots committed meanwhile.
        expect((await Promise.all(waiting)).filter((id) => id !== undefined)).toHaveLength(3);
      } finally {
        await elsewhere.close();
      }
    },
  );

  test.runIf(engine === 'postgres')(
    'behavior: a slot is taken in one round trip and taken and freed without waiting for the WAL flush',
    async () => {
      const accountId = await newWallet();
      // Statements as text (no prepared ones), to read and run again what is sent.
      const texts: string[] = [];
      const textual = await createDatabase(databaseUrl, {
        preparedStatements: false,
        onQuery: (text) => texts.push(text),
      });
      try {
        const { id } = await createWalletSlots(textual).take({ accountId, max: 5, leaseMs: 60_000 });
        expect(id).toEqual(expect.any(String));
        // One query: the lock, then the statement that counts and inserts.
        const [taking, ...afterTaking] = texts.splice(0);
        expect(afterTaking).toEqual([]);
        expect(taking).toMatch(/^select 1 from accounts where id = '[^']+' for update;\nwith live as/);
        await createWalletSlots(textual).release(id as string);
        const [freeing, ...afterFreeing] = texts.splice(0);
        expect(afterFreeing).toEqual([]);
        expect(freeing).toMatch(
          /^delete from "wallet_request_slots" where "id" = \$1 returning set_config\('synchronous_commit', 'off', true\)/,
        );
        // Each turns the setting off for its own transaction only: the statements run again in a transaction
        // of the test's, on one connection, then the setting outside it.
        const show = sql<{ synchronous_commit: string }>`show synchronous_commit`;
        const statement = (taking as string).slice((taking as string).indexOf(';\n') + 2);
        // A slot to free (the statement frees by id: freeing none calls nothing in its RETURNING).
        const other = await acquire({ accountId, max: 5, leaseMs: 60_000 });
        await database.db.connection().execute(async (connection) => {
          for (const query of [CompiledQuery.raw(statement), CompiledQuery.raw(freeing as string, [other])]) {
            await connection.transaction().execute(async (trx) => {
              expect((await show.execute(trx)).rows[0]?.synchronous_commit).toBe('on');
              await trx.executeQuery(query);
              expect((await show.execute(trx)).rows[0]?.synchronous_commit).toBe('off');
            });
            expect((await show.execute(connection)).rows[0]?.synchronous_commit).toBe('on');
          }
        });
      } finally {
        await textual.close();
      }
    },
  );
});
