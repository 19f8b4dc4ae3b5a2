/**
 * The invariant checker (`test/support/invariants.ts`) is not a test that cannot fail: a seeded fault, a
 * non-atomic ledger that decides on a balance it read without the account lock and then writes absolute
 * values, is injected through the charges port (`createCharges({ ledger })`) on a real PostgreSQL. The same
 * concurrent spending that the real ledger survives exactly (the scale-out tests run it over three server
 * processes) then overspends, and the checker reports it.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { createCharges } from '../../server/domains/billing/charges.ts';
import type { Principal } from '../../server/http/auth.ts';
import { ApiError } from '../../server/http/errors.ts';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { InsufficientBalanceError } from '../../server/storage/errors.ts';
import { createLedger, type LedgerRepository } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { checkInvariants } from '../support/invariants.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

const NANO = 1_000_000_000n;
const PARTIES = 20;
const PRICE = NANO / 10n; // 0.10 USD per request; the account holds 1.00 USD: 10 requests fit.

const postgres = postgresPerFile();
const opened: Database[] = [];

afterAll(async () => {
  for (const database of opened) await database.close();
});

/** Waits until `parties` callers arrived (or a safety timeout passed, so a refused caller cannot wedge it). */
function barrier(parties: number) {
  let arrived = 0;
  let open = () => {};
  const gate = new Promise<void>((resolve) => {
    open = resolve;
    setTimeout(resolve, 5_000).unref();
  });
  return async () => {
    arrived++;
    if (arrived >= parties) open();
    await gate;
  };
}

/**
 * THE SEEDED FAULT: reserve and capture read the account outside any transaction and without its row lock,
 * wait for the other requests to read too, then write the values computed from that stale read.
 */
function nonAtomicLedger(database: Database, real: LedgerRepository): LedgerRepository {
  const { db } = database;
  const afterReserveRead = barrier(PARTIES);
  const afterCaptureRead = barrier(PARTIES);
  const readAccount = (id: string) =>
    db.selectFrom('accounts').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  return {
    ...real,
    async reserve(input) {
      const account = await readAccount(input.accountId);
      await afterReserveRead();
      const available = account.usd_balance_nano - account.usd_reserved_nano;
      if (available < input.amountNano) {
        throw new InsufficientBalanceError({
          requiredNano: input.amountNano,
          usdAvailableNano: available,
          diemAvailableNano: 0n,
        });
      }
      const at = Date.now();
      await db
        .insertInto('reservations')
        .values({
          id: randomUUID(),
          account_id: input.accountId,
          api_key_id: null,
          request_id: input.requestId,
          model_id: null,
          usd_nano: input.amountNano,
          diem_nano: 0n,
          epoch_day: Math.floor(at / 86_400_000),
          status: 'held',
          created_at_ms: at,
          expires_at_ms: at + input.ttlMs,
          settled_at_ms: null,
        })
        .execute();
      await db
        .updateTable('accounts')
        .set({ usd_reserved_nano: account.usd_reserved_nano + input.amountNano })
        .where('id', '=', input.accountId)
        .execute();
      const row = await db
        .selectFrom('reservations')
        .selectAll()
        .where('request_id', '=', input.requestId)
        .executeTakeFirstOrThrow();
      return {
        reservation: await real.getReservation(row.id),
        before: { usdNano: account.usd_balance_nano, diemNano: 0n },
        availableNano: available - input.amountNano,
      };
    },
    async capture(reservationId, input) {
      const reservation = await real.getReservation(reservationId);
      const account = await readAccount(reservation.accountId);
      await afterCaptureRead();
      const amount = input.items.reduce((sum, item) => sum + item.amountNano, 0n);
      const balanceAfter = account.usd_balance_nano - amount;
      const at = Date.now();
      await db
        .insertInto('ledger_entries')
        .values({
          id: randomUUID(),
          account_id: reservation.accountId,
          reservation_id: reservationId,
          type: 'CHARGE',
          currency: 'USD',
          amount_nano: -amount,
          balance_after_nano: balanceAfter,
          request_id: reservation.requestId,
          sku: 'seeded',
          created_at_ms: at,
        })
        .execute();
      await db
        .updateTable('accounts')
        .set({
          usd_balance_nano: balanceAfter,
          usd_reserved_nano: account.usd_reserved_nano - reservation.usdNano,
        })
        .where('id', '=', reservation.accountId)
        .execute();
      await db
        .updateTable('reservations')
        .set({ status: 'captured', settled_at_ms: at })
        .where('id', '=', reservationId)
        .execute();
      return { entries: [], usdNano: amount, diemNano: 0n, requestedNano: amount, clamped: false };
    },
  };
}

/** PARTIES concurrent requests of PRICE each against one account holding 1.00 USD. */
async function spendConcurrently(name: string, seeded: boolean) {
  const database = await createDatabase(await postgres().createDatabase(name), { poolMax: PARTIES + 2 });
  opened.push(database);
  await migrate(database);
  const real = createLedger(database);
  const account = await createAccounts(database).createApiAccount({ name });
  await real.topUp({ accountId: account.id, amountNano: NANO });
  const charges = createCharges({
    ledger: seeded ? nonAtomicLedger(database, real) : real,
    reservationTtlMs: 60_000,
  });
  const principal: Principal = { kind: 'wallet', accountId: account.id, walletAddress: '0xseeded' };
  const outcomes = await Promise.all(
    Array.from({ length: PARTIES }, async (_, i) => {
      try {
        const reservation = await charges.reserve(principal, { amountNano: PRICE, requestId: `r-${i}` });
        await charges.capture(reservation, [{ sku: 'test', amountNano: PRICE }]);
        return 'charged' as const;
      } catch (error) {
        if (error instanceof ApiError && error.status === 402) return 'refused' as const;
        throw error;
      }
    }),
  );
  return { outcomes, report: await checkInvariants(database) };
}

describe('seeded fault: a non-atomic charge', () => {
  test('behavior: the real ledger admits exactly what the balance covers; the checker finds nothing', async () => {
    const { outcomes, report } = await spendConcurrently('atomic', false);
    expect(outcomes.filter((o) => o === 'charged')).toHaveLength(10);
    expect(outcomes.filter((o) => o === 'refused')).toHaveLength(10);
    expect(report.violations).toEqual([]);
    expect(report.reservations.captured).toBe(10);
  });

  test('behavior: the non-atomic variant overspends and the invariant checker reports it', async () => {
    const { outcomes, report } = await spendConcurrently('seeded', true);
    expect(outcomes.filter((o) => o === 'charged').length).toBeGreaterThan(10);
    expect(report.violations.length).toBeGreaterThan(0);
    expect(report.violations.join('\n')).toMatch(/!= sum of its USD entries/);
    expect(report.violations.join('\n')).toMatch(/charged \d+ > credited/);
  });
});

/**
 * A check against running servers reads while captures commit. Read table by table, a capture committed
 * between the accounts and the entries shows as a balance that disagrees with its entries and a reservation
 * sum that disagrees with the account (seen once in CI on the scale-out test). The checker reads one
 * snapshot: the capture is seen wholly or not at all.
 */
describe('the checker reads one snapshot', () => {
  async function captureBetweenReads(open: () => Promise<[Database, Database]>) {
    const [checked, serving] = await open();
    const ledger = createLedger(serving);
    const account = await createAccounts(serving).createApiAccount({ name: 'snapshot' });
    await ledger.topUp({ accountId: account.id, amountNano: NANO });
    const reservation = await ledger.reserve({
      accountId: account.id,
      amountNano: PRICE,
      requestId: 'between-reads',
      ttlMs: 60_000,
    });
    let captured = false;
    const report = await checkInvariants(checked, {
      allowHeld: true,
      afterFirstRead: async () => {
        await ledger.capture(reservation.reservation.id, { items: [{ sku: 'test', amountNano: PRICE }] });
        captured = true;
      },
    });
    expect(captured).toBe(true);
    expect(report.violations).toEqual([]);
    // The snapshot is from before the capture; a check after it sees the capture, sound as well.
    expect(report.reservations).toMatchObject({ held: 1, captured: 0 });
    const after = await checkInvariants(checked);
    expect(after.violations).toEqual([]);
    expect(after.reservations).toMatchObject({ held: 0, captured: 1 });
  }

  test('behavior: PostgreSQL, a capture committed between two reads', async () => {
    await captureBetweenReads(async () => {
      const url = await postgres().createDatabase('snapshot');
      const checked = await createDatabase(url);
      const serving = await createDatabase(url);
      opened.push(checked, serving);
      await migrate(serving);
      return [checked, serving];
    });
  });

  test('behavior: SQLite, a capture committed by another connection between two reads', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'snapshot-'));
    try {
      await captureBetweenReads(async () => {
        const file = `sqlite:${join(dir, 'ledger.db')}`;
        const serving = await createDatabase(file);
        await migrate(serving);
        const checked = await createDatabase(file);
        opened.push(checked, serving);
        return [checked, serving];
      });
    } finally {
      for (const database of opened.splice(-2)) await database.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
