/**
 * Reservations held in memory (SQLite, one process: LedgerOptions.holdsInMemory, held-reservations.ts): a hold
 * writes no row and leaves the account's reserved sum alone, yet every reader of the process counts it (the
 * balance, the next reservation in memory or in the rows, a key's spend limit, the metrics' totals); its row is
 * written once, settled, by the capture, the release or the expiry; a hold whose transaction does not commit,
 * or whose capture fails, is not lost nor kept by mistake; and nothing is overspent by a burst.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, expect, test } from 'vitest';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import {
  InsufficientBalanceError,
  KeySpendLimitError,
  NotFoundError,
  ReservationStateError,
} from '../../server/storage/errors.ts';
import { heldReservationsOf } from '../../server/storage/held-reservations.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { checkInvariants } from '../support/invariants.ts';

const USD = 1_000_000_000n;
const T0 = Date.UTC(2026, 0, 15, 12, 0, 0);

let dir: string;
let database: Database;
let nowMs = T0;
const clock = { now: () => nowMs };

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'svc-held-'));
  database = await createDatabase(`sqlite:${join(dir, 'held.db')}`);
  await migrate(database);
});

beforeEach(() => {
  nowMs = T0;
});

afterAll(async () => {
  await database?.close();
  await rm(dir, { recursive: true, force: true });
});

const ledgerOf = () => createLedger(database, { now: clock.now, holdsInMemory: true });

async function funded(usd: bigint, diemStake = 0n) {
  const accounts = createAccounts(database, clock);
  const account = await accounts.createApiAccount({ name: 'held' });
  await ledgerOf().topUp({ accountId: account.id, amountNano: usd });
  if (diemStake > 0n) await accounts.setDiemStake(account.id, diemStake);
  return account.id;
}

/** The reservation's row (its times as numbers), or undefined. */
const rowOf = async (id: string) => {
  const row = await database.db
    .selectFrom('reservations')
    .selectAll()
    .where('id', '=', id)
    .executeTakeFirst();
  return (
    row && {
      status: row.status,
      usd_nano: row.usd_nano,
      created_at_ms: Number(row.created_at_ms),
      settled_at_ms: row.settled_at_ms === null ? null : Number(row.settled_at_ms),
    }
  );
};
const reservedColumn = async (accountId: string) =>
  (
    await database.db
      .selectFrom('accounts')
      .select('usd_reserved_nano')
      .where('id', '=', accountId)
      .executeTakeFirstOrThrow()
  ).usd_reserved_nano;

test('behavior: a hold writes nothing, is counted by every reader, and its row is written settled by the capture', async () => {
  const ledger = ledgerOf();
  const accountId = await funded(10n * USD);
  const { reservation } = await ledger.reserve({
    accountId,
    amountNano: 4n * USD,
    requestId: 'r1',
    ttlMs: 60_000,
  });
  expect(await rowOf(reservation.id)).toBeUndefined();
  expect(await reservedColumn(accountId)).toBe(0n);
  expect(await ledger.getBalance(accountId)).toMatchObject({
    usdNano: 10n * USD,
    usdReservedNano: 4n * USD,
    usdAvailableNano: 6n * USD,
  });
  expect(await ledger.getReservation(reservation.id)).toEqual(reservation);
  expect((await ledger.totals()).usdReservedNano).toBeGreaterThanOrEqual(4n * USD);
  // Another ledger of the process (no holds of its own) counts it too.
  await expect(
    createLedger(database, clock).reserve({
      accountId,
      amountNano: 7n * USD,
      requestId: 'r2',
      ttlMs: 60_000,
    }),
  ).rejects.toBeInstanceOf(InsufficientBalanceError);

  nowMs = T0 + 500;
  const captured = await ledger.captureWith(reservation, { items: [{ sku: 'unit', amountNano: USD }] });
  expect(captured.entries.map((e) => [e.amountNano, e.balanceAfterNano, e.reservationId])).toEqual([
    [-USD, 9n * USD, reservation.id],
  ]);
  expect(await rowOf(reservation.id)).toMatchObject({
    status: 'captured',
    usd_nano: 4n * USD,
    settled_at_ms: T0 + 500,
    created_at_ms: reservation.createdAtMs,
  });
  expect(await ledger.getBalance(accountId)).toMatchObject({ usdNano: 9n * USD, usdReservedNano: 0n });
  expect(heldReservationsOf(database).get(reservation.id)).toBeUndefined();
  // Settled once: a second capture is refused as a captured row's is.
  await expect(ledger.captureWith(reservation, { items: [] })).rejects.toBeInstanceOf(ReservationStateError);
  await expect(ledger.capture(reservation.id, { items: [] })).rejects.toBeInstanceOf(ReservationStateError);
  expect((await ledger.release(reservation.id)).released).toBe(false);
});

test('behavior: released and expired holds write their rows so; what settles first wins, once', async () => {
  const ledger = ledgerOf();
  const accountId = await funded(10n * USD);
  const reserve = (requestId: string, ttlMs = 60_000) =>
    ledger.reserve({ accountId, amountNano: 3n * USD, requestId, ttlMs });
  const released = (await reserve('released')).reservation;
  // A release racing a capture: one of them settles it, the other is told it was settled.
  const [capture, release] = await Promise.allSettled([
    ledger.capture(released.id, { items: [{ sku: 'unit', amountNano: USD }] }),
    ledger.release(released.id),
  ]);
  expect(capture.status).toBe('fulfilled');
  expect(release).toMatchObject({ status: 'fulfilled', value: { released: false } });

  const dropped = (await reserve('dropped')).reservation;
  expect(await ledger.release(dropped.id)).toMatchObject({
    released: true,
    reservation: { status: 'released' },
  });
  expect(await rowOf(dropped.id)).toMatchObject({ status: 'released', settled_at_ms: T0 });
  await expect(ledger.capture(dropped.id, { items: [] })).rejects.toBeInstanceOf(ReservationStateError);

  const stale = (await reserve('stale', 1_000)).reservation;
  const fresh = (await reserve('fresh', 120_000)).reservation;
  expect(await ledger.expireReservations(T0 + 1_000)).toBe(1);
  expect(await rowOf(stale.id)).toMatchObject({ status: 'expired', settled_at_ms: T0 + 1_000 });
  expect(await ledger.getReservation(fresh.id)).toMatchObject({ status: 'held' });
  expect(await ledger.getBalance(accountId)).toMatchObject({ usdNano: 9n * USD, usdReservedNano: 3n * USD });
  await ledger.release(fresh.id);
  await expect(ledger.getReservation('nope')).rejects.toBeInstanceOf(NotFoundError);
  expect((await checkInvariants(database)).violations).toEqual([]);
});

test('behavior: a burst never holds more than the balance, holds in memory and in rows (DIEM) together', async () => {
  const ledger = ledgerOf();
  const X = 1_234_567n;
  const accountId = await funded(50n * X, 10n * X);
  // The DIEM allowance (10·X) is drawn first, in rows; then USD, in memory: 60 of 120 fit.
  const results = await Promise.allSettled(
    Array.from({ length: 120 }, (_, i) =>
      ledger.reserve({ accountId, amountNano: X, requestId: `b${i}`, ttlMs: 60_000 }),
    ),
  );
  const held = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.reservation] : []));
  expect(held).toHaveLength(60);
  expect(held.filter((r) => r.diemNano > 0n)).toHaveLength(10);
  expect(
    results.filter((r) => r.status === 'rejected' && r.reason instanceof InsufficientBalanceError),
  ).toHaveLength(60);
  expect(await reservedColumn(accountId)).toBe(0n);
  expect(await ledger.getBalance(accountId)).toMatchObject({
    usdReservedNano: 50n * X,
    usdAvailableNano: 0n,
  });
  await Promise.all(
    held.map((r, i) => ledger.captureWith(r, { items: [{ sku: 'unit', amountNano: X - BigInt(i % 3) }] })),
  );
  const report = await checkInvariants(database);
  expect(report.violations).toEqual([]);
  expect(await ledger.getBalance(accountId)).toMatchObject({ usdReservedNano: 0n });
});

test("behavior: a key's spend limit counts its holds in memory", async () => {
  const ledger = ledgerOf();
  const accountId = await funded(10n * USD);
  const { key } = await createApiKeys(database, clock).create({ accountId, keyType: 'INFERENCE' });
  const first = await ledger.reserve({
    accountId,
    apiKeyId: key.id,
    amountNano: 3n * USD,
    requestId: 'k1',
    ttlMs: 60_000,
  });
  expect(await ledger.keySpend(key.id, { sinceMs: 0, includeHeld: true })).toEqual({
    usdNano: 3n * USD,
    diemNano: 0n,
  });
  await database.db
    .updateTable('api_keys')
    .set({ limit_usd_nano: 4n * USD })
    .where('id', '=', key.id)
    .execute();
  await expect(
    ledger.reserve({
      accountId,
      apiKeyId: key.id,
      amountNano: 2n * USD,
      requestId: 'k2',
      ttlMs: 60_000,
      keySpendLimited: true,
    }),
  ).rejects.toBeInstanceOf(KeySpendLimitError);
  await ledger.release(first.reservation.id);
  await ledger.reserve({
    accountId,
    apiKeyId: key.id,
    amountNano: 2n * USD,
    requestId: 'k3',
    ttlMs: 60_000,
    keySpendLimited: true,
  });
});

test('behavior: a hold whose transaction does not commit is let go; a capture that fails keeps it held', async () => {
  // The same database whose next transaction fails on demand after its function ran (as a failed commit group
  // fails each of its transactions): rolled back, nothing of it kept.
  let failNext = false;
  const failing: Database = Object.assign(Object.create(database) as Database, {
    transaction: ((fn, options) =>
      database.transaction(async (trx) => {
        const result = await fn(trx);
        if (failNext) {
          failNext = false;
          throw new Error('the commit failed');
        }
        return result;
      }, options)) as Database['transaction'],
  });
  const ledger = createLedger(failing, { now: clock.now, holdsInMemory: true });
  const held = heldReservationsOf(failing);
  const accountId = await funded(10n * USD);
  // A reservation with the caller's statements (the JSON-RPC caps') is made in a transaction, which fails.
  failNext = true;
  const within = async () => 'admitted';
  await expect(
    ledger.reserveWith({ accountId, amountNano: 6n * USD, requestId: 'f1', ttlMs: 60_000 }, within),
  ).rejects.toThrow('the commit failed');
  expect(held.usdOf(accountId)).toBe(0n);
  const { reservation } = await ledger.reserve({
    accountId,
    amountNano: 6n * USD,
    requestId: 'f2',
    ttlMs: 60_000,
  });
  expect(held.usdOf(accountId)).toBe(6n * USD);
  // The capture's transaction writes its row and entries, then fails: still held, nothing charged.
  failNext = true;
  await expect(
    ledger.captureWith(reservation, { items: [{ sku: 'unit', amountNano: USD }] }),
  ).rejects.toThrow('the commit failed');
  expect(held.get(reservation.id)).toEqual(reservation);
  expect(await rowOf(reservation.id)).toBeUndefined();
  expect(await ledger.getBalance(accountId)).toMatchObject({ usdNano: 10n * USD, usdReservedNano: 6n * USD });
  // Figures other than the held ones are refused, and it stays held.
  await expect(
    ledger.captureWith({ ...reservation, usdNano: reservation.usdNano + 1n }, { items: [] }),
  ).rejects.toThrow('does not match');
  expect(held.usdOf(accountId)).toBe(6n * USD);
  expect(await ledger.release(reservation.id)).toMatchObject({ released: true });
  expect(held.usdOf(accountId)).toBe(0n);
});

test('behavior: a reservation made at once reads only what is committed: with a transaction open it waits for it', async () => {
  const ledger = ledgerOf();
  const accountId = await funded(USD);
  // A transaction that credits the account, then fails while it is still open.
  let fail!: () => void;
  const failing = new Promise<void>((resolve) => {
    fail = resolve;
  });
  const credit = database.transaction(async (trx) => {
    await trx
      .updateTable('accounts')
      .set((eb) => ({ usd_balance_nano: eb('usd_balance_nano', '+', 10n * USD) }))
      .where('id', '=', accountId)
      .execute();
    await failing;
    throw new Error('undone');
  });
  await new Promise((resolve) => setTimeout(resolve, 20));
  const reserving = ledger.reserve({ accountId, amountNano: 5n * USD, requestId: 'u1', ttlMs: 60_000 });
  fail();
  await expect(credit).rejects.toThrow('undone');
  // Not the credit that was never committed: what the account has.
  await expect(reserving).rejects.toBeInstanceOf(InsufficientBalanceError);
  // Nothing open: at once, no transaction.
  const { reservation } = await ledger.reserve({
    accountId,
    amountNano: USD,
    requestId: 'u2',
    ttlMs: 60_000,
  });
  expect(heldReservationsOf(database).get(reservation.id)).toEqual(reservation);
  await ledger.release(reservation.id);
});
