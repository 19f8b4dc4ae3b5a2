/**
 * JSON-RPC credits held by one process (rpc-credits.ts `held`, held-credits.ts) over a real SQLite file: the
 * same answers as the rows-only repository for the same takes and give-backs, and the same rows once written;
 * a window read on the caller's transaction; a take that stays counted whatever becomes of that transaction
 * until given back; `takeNow` deciding with no statement once the window is held; the writes behind (by the
 * timer, a flush, the close) and a restart that starts from them; and the ledger's hold made with no
 * transaction when the caller's part is decided at once (ReserveWithin.now).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, test, vi } from 'vitest';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { InsufficientBalanceError } from '../../server/storage/errors.ts';
import { createLedger, type ReserveWithin } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { createRpcCredits } from '../../server/storage/rpc-credits.ts';

const USD = 1_000_000_000n;
const T0 = Date.UTC(2026, 0, 15, 12, 0, 30);
const MINUTE = 60_000;
const HOUR = 3_600_000;
const DAY = 24 * HOUR;

let dir: string;
let database: Database;
let nowMs = T0;
const clock = { now: () => nowMs };
/** The statements sent, in order. */
const sent: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'svc-held-credits-'));
  database = await createDatabase(`sqlite:${join(dir, 'db.sqlite')}`, { onQuery: (text) => sent.push(text) });
  await migrate(database);
});

beforeEach(() => {
  nowMs = T0;
});

afterAll(async () => {
  await database?.close();
  await rm(dir, { recursive: true, force: true });
});

const heldCredits = (flushMs = 3_600_000) =>
  createRpcCredits(database, { now: clock.now, held: true, heldCredits: { flushMs } });

/** The subject's rows: buckets and hours, by their start. */
async function rowsOf(subject: string) {
  const { db } = database;
  const buckets = await db
    .selectFrom('rpc_credit_usage')
    .select(['bucket_ms', 'credits'])
    .where('subject', '=', subject)
    .orderBy('bucket_ms')
    .execute();
  const hours = await db
    .selectFrom('rpc_credit_hours')
    .select(['hour_ms', 'credits'])
    .where('subject', '=', subject)
    .orderBy('hour_ms')
    .execute();
  return {
    buckets: buckets.map((row) => [Number(row.bucket_ms), Number(row.credits)]),
    hours: hours.map((row) => [Number(row.hour_ms), Number(row.credits)]),
  };
}

describe('JSON-RPC credits held by the process', () => {
  test('behavior: the same answers as the rows for 30 hours of takes and give-backs, and the same rows once written', async () => {
    const rows = createRpcCredits(database, clock);
    const held = heldCredits();
    expect([rows.holds, held.holds]).toEqual([false, true]);
    // Another process's takes before this one started, read by both.
    for (const subject of ['rows-a', 'held-a']) {
      await database.transaction((trx) =>
        rows.takeIn(trx, { subject, credits: 250, limit: 1_000, now: T0 - 5 * HOUR }),
      );
    }
    let refused = 0;
    for (let i = 0; i < 420; i++) {
      nowMs = T0 + i * 4.3 * MINUTE;
      const take = { credits: 1 + ((i * 13) % 37), limit: 1_000 };
      const expected = await database.transaction((trx) => rows.takeIn(trx, { subject: 'rows-a', ...take }));
      // Held: on a transaction, on no transaction, or at once.
      const got =
        i % 3 === 0
          ? await database.transaction((trx) => held.takeIn(trx, { subject: 'held-a', ...take }))
          : i % 3 === 1
            ? await held.takeIn(database.db, { subject: 'held-a', ...take })
            : held.takeNow({ subject: 'held-a', ...take });
      expect(got, `take ${i}`).toEqual(expected);
      if (!expected.allowed) {
        refused++;
        continue;
      }
      // What a call did not spend, given back; more than its bucket holds changes nothing on either.
      const back = { bucketMs: expected.bucketMs, credits: i % 4 === 0 ? 2_000 : take.credits >> 1 };
      await rows.giveBack({ subject: 'rows-a', ...back });
      await held.giveBack({ subject: 'held-a', ...back });
      if (i % 37 === 0) await held.flush();
    }
    expect(refused).toBeGreaterThan(20);
    expect(refused).toBeLessThan(300);
    for (let probe = nowMs - 2 * DAY; probe < nowMs + 2 * DAY; probe += 97 * MINUTE) {
      expect(await held.used('held-a', probe)).toBe(await rows.used('rows-a', probe));
    }
    await held.close();
    expect(await rowsOf('held-a')).toEqual(await rowsOf('rows-a'));
  });

  test('behavior: a window is read on the caller transaction; the take stays counted whatever becomes of it, until given back', async () => {
    const held = heldCredits();
    const input = { subject: 'held-b', credits: 60, limit: 100 };
    expect(held.holdsNow('held-b')).toBe(false);
    expect(held.takeNow(input)).toBeUndefined();
    const rolledBack = new Error('rolled back');
    let bucketMs = 0;
    await expect(
      database.transaction(async (trx) => {
        const taken = await held.takeIn(trx, input);
        if (!taken.allowed) throw new Error('refused');
        bucketMs = taken.bucketMs;
        throw rolledBack;
      }),
    ).rejects.toBe(rolledBack);
    expect(held.holdsNow('held-b')).toBe(true);
    // Still counted: the next 60 do not fit.
    expect(held.takeNow(input)).toEqual({ allowed: false, used: 60, nextReleaseAtMs: bucketMs + DAY });
    await held.flush();
    expect((await rowsOf('held-b')).buckets).toEqual([[bucketMs, 60]]);
    // Given back after its take was written: the rows' take is undone (an update, as the rows' own give-back).
    await held.giveBack({ subject: 'held-b', bucketMs, credits: 60 });
    await held.flush();
    expect(await rowsOf('held-b')).toEqual({
      buckets: [[bucketMs, 0]],
      hours: [[Math.floor(T0 / HOUR) * HOUR, 0]],
    });
    expect(held.takeNow(input)).toEqual({ allowed: true, bucketMs });
    expect(await held.used('held-b')).toBe(60);
    await held.close();
  });

  test('behavior: a held take and a read of the window send no statement; the writes come behind, by the timer, and a restart reads them', async () => {
    const held = heldCredits(20);
    await held.takeIn(database.db, { subject: 'held-c', credits: 5, limit: 100 });
    sent.length = 0;
    for (let i = 0; i < 10; i++) {
      expect(held.takeNow({ subject: 'held-c', credits: 5, limit: 100 })).toMatchObject({ allowed: true });
    }
    // Read from memory, what is not yet written included: still no statement.
    expect(await held.used('held-c')).toBe(55);
    expect(sent).toEqual([]);
    // Within the flush interval, added up: one write of the bucket and one of its hour.
    await vi.waitFor(async () => expect((await rowsOf('held-c')).buckets).toEqual([[T0 - 30_000, 55]]), {
      timeout: 5_000,
      interval: 20,
    });
    expect((await rowsOf('held-c')).hours).toEqual([[Math.floor(T0 / HOUR) * HOUR, 55]]);
    expect(
      sent.filter((text) => /rpc_credit_(usage|hours)/.test(text) && /^\s*insert/i.test(text)),
    ).toHaveLength(2);
    await held.close();
    const restarted = heldCredits();
    expect(await restarted.takeIn(database.db, { subject: 'held-c', credits: 46, limit: 100 })).toMatchObject(
      { allowed: false, used: 55 },
    );
    expect(restarted.takeNow({ subject: 'held-c', credits: 45, limit: 100 })).toMatchObject({
      allowed: true,
    });
    await restarted.close();
    expect((await rowsOf('held-c')).buckets).toEqual([[T0 - 30_000, 100]]);
  });
});

describe('a hold made with the caller part decided at once (ReserveWithin.now)', () => {
  const ledgerOf = () => createLedger(database, { now: clock.now, holdsInMemory: true });
  const funded = async (usd: bigint) => {
    const account = await createAccounts(database, clock).createApiAccount({ name: 'held-credits' });
    await ledgerOf().topUp({ accountId: account.id, amountNano: usd });
    return account.id;
  };
  const input = (accountId: string, amountNano: bigint, requestId: string) => ({
    accountId,
    amountNano,
    requestId,
    modelId: 'base-mainnet',
    ttlMs: 60_000,
  });
  /** A caller part counting into `counted`: at once when `atOnce`, else in the transaction. */
  const part = (counted: string[], atOnce: boolean): ReserveWithin<string> =>
    Object.assign(
      async () => {
        counted.push('in the transaction');
        return 'in the transaction';
      },
      {
        now: () => {
          if (!atOnce) return undefined;
          counted.push('at once');
          return 'at once';
        },
      },
    );

  test('behavior: decided at once, the hold is made with no transaction; not decided, the transaction runs the part', async () => {
    const ledger = ledgerOf();
    const accountId = await funded(USD);
    const counted: string[] = [];
    sent.length = 0;
    const atOnce = await ledger.reserveWith(input(accountId, 700n, 'now-1'), part(counted, true));
    expect(atOnce.within).toBe('at once');
    expect(sent.some((text) => /^\s*begin/i.test(text))).toBe(false);
    expect(atOnce.reservation).toMatchObject({ usdNano: 700n, status: 'held' });
    expect((await ledger.getBalance(accountId)).usdReservedNano).toBe(700n);
    sent.length = 0;
    const inTransaction = await ledger.reserveWith(input(accountId, 300n, 'now-2'), part(counted, false));
    expect(inTransaction.within).toBe('in the transaction');
    expect(sent.some((text) => /^\s*begin/i.test(text))).toBe(true);
    expect(counted).toEqual(['at once', 'in the transaction']);
    expect((await ledger.getBalance(accountId)).usdReservedNano).toBe(1_000n);
  });

  test('behavior: the part runs before the balance check, which then refuses the hold; what it throws refuses it first', async () => {
    const ledger = ledgerOf();
    const accountId = await funded(1_000n);
    const counted: string[] = [];
    await expect(
      ledger.reserveWith(input(accountId, 1_001n, 'poor'), part(counted, true)),
    ).rejects.toBeInstanceOf(InsufficientBalanceError);
    expect(counted).toEqual(['at once']);
    const refusal = new Error('capped');
    await expect(
      ledger.reserveWith(
        input(accountId, 1n, 'capped'),
        Object.assign(async () => 'never', {
          now: () => {
            throw refusal;
          },
        }),
      ),
    ).rejects.toBe(refusal);
    expect((await ledger.getBalance(accountId)).usdReservedNano).toBe(0n);
  });
});
