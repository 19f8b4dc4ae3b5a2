/**
 * The money invariants, checked on the database itself after any scenario (one checker for every scale-out and
 * fault test, and for the seeded-fault test that proves it catches a broken ledger):
 * - every account's USD balance equals the sum of its USD ledger entries, and is never negative;
 * - every USD entry's `balance_after` equals the running sum of the account's USD entries up to it;
 * - what was charged never exceeds what was credited (top-ups plus refunds);
 * - the USD held on the account equals the sum of its held reservations, and never exceeds the balance;
 * - the DIEM reserved per day equals the sum of that day's held reservations;
 * - no reservation was charged more than it held;
 * - unless `allowHeld`, no reservation is still held (after the expiry sweep everything is settled).
 *
 * The tables are read as one snapshot (readSnapshot), so a check may run while servers commit.
 */
import { type Kysely, sql } from 'kysely';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import type { Tables } from '../../server/storage/schema.ts';

export type InvariantReport = {
  accounts: number;
  entries: number;
  reservations: Record<'held' | 'captured' | 'released' | 'expired', number>;
  /** Every broken rule, one line each; empty when the ledger is sound. */
  violations: string[];
};

const big = (value: unknown) => (value === null || value === undefined ? 0n : BigInt(value as string));

/**
 * Reads the four tables as one snapshot of the database: in a REPEATABLE READ transaction on PostgreSQL, in a
 * deferred (read) transaction on SQLite, where the database's own `db.transaction()` begins IMMEDIATE, a write
 * that would hold up a running server's captures. Read one by one, a capture committed between two reads shows
 * as a balance that disagrees with its entries.
 */
async function readSnapshot(database: Database, afterFirstRead?: () => Promise<void>) {
  const reads = async (db: Kysely<Tables>) => {
    const accounts = await db
      .selectFrom('accounts')
      .select(['id', 'usd_balance_nano', 'usd_reserved_nano'])
      .execute();
    await afterFirstRead?.();
    const entries = await db
      .selectFrom('ledger_entries')
      .select([
        'seq',
        'account_id',
        'reservation_id',
        'type',
        'currency',
        'amount_nano',
        'balance_after_nano',
      ])
      .orderBy('seq')
      .execute();
    const reservations = await db
      .selectFrom('reservations')
      .select(['id', 'account_id', 'usd_nano', 'diem_nano', 'epoch_day', 'status'])
      .execute();
    const diem = await db
      .selectFrom('diem_usage')
      .select(['account_id', 'epoch_day', 'reserved_nano', 'used_nano'])
      .execute();
    return { accounts, entries, reservations, diem };
  };
  if (database.dialect === 'postgres') {
    return database.db
      .transaction()
      .setIsolationLevel('repeatable read')
      .setAccessMode('read only')
      .execute(reads);
  }
  return database.db.connection().execute(async (connection) => {
    await sql`begin`.execute(connection);
    try {
      return await reads(connection);
    } finally {
      await sql`commit`.execute(connection);
    }
  });
}

/** Checks the invariants on an open database or a `DATABASE_URL`. */
export async function checkInvariants(
  target: Database | string,
  options: {
    allowHeld?: boolean;
    /** Runs after the accounts are read and before the rest is (for the test that the reads are one snapshot). */
    afterFirstRead?: () => Promise<void>;
  } = {},
): Promise<InvariantReport> {
  const database = typeof target === 'string' ? await createDatabase(target) : target;
  try {
    const { accounts, entries, reservations, diem } = await readSnapshot(database, options.afterFirstRead);
    const violations: string[] = [];
    const counts = { held: 0, captured: 0, released: 0, expired: 0 };
    for (const r of reservations) counts[r.status]++;

    for (const account of accounts) {
      const id = account.id;
      const usd = entries.filter((e) => e.account_id === id && e.currency === 'USD');
      let running = 0n;
      for (const entry of usd) {
        running += big(entry.amount_nano);
        if (big(entry.balance_after_nano) !== running) {
          violations.push(
            `account ${id}: entry #${entry.seq} says balance ${entry.balance_after_nano} after it, the entries sum to ${running}`,
          );
        }
      }
      const balance = big(account.usd_balance_nano);
      if (balance !== running)
        violations.push(`account ${id}: balance ${balance} != sum of its USD entries ${running}`);
      if (balance < 0n) violations.push(`account ${id}: negative balance ${balance}`);
      const sum = (type: string) =>
        usd.filter((e) => e.type === type).reduce((total, e) => total + big(e.amount_nano), 0n);
      const credited = sum('TOP_UP') + sum('REFUND');
      const charged = -sum('CHARGE');
      if (charged > credited) violations.push(`account ${id}: charged ${charged} > credited ${credited}`);
      const held = reservations.filter((r) => r.account_id === id && r.status === 'held');
      const heldUsd = held.reduce((total, r) => total + big(r.usd_nano), 0n);
      const reserved = big(account.usd_reserved_nano);
      if (reserved !== heldUsd)
        violations.push(`account ${id}: reserved ${reserved} != held reservations ${heldUsd}`);
      if (reserved > balance) violations.push(`account ${id}: reserved ${reserved} > balance ${balance}`);
    }
    for (const day of diem) {
      const heldDiem = reservations
        .filter(
          (r) =>
            r.account_id === day.account_id &&
            r.status === 'held' &&
            Number(r.epoch_day) === Number(day.epoch_day),
        )
        .reduce((total, r) => total + big(r.diem_nano), 0n);
      if (big(day.reserved_nano) !== heldDiem) {
        violations.push(
          `account ${day.account_id} day ${day.epoch_day}: DIEM reserved ${day.reserved_nano} != held ${heldDiem}`,
        );
      }
      if (big(day.used_nano) < 0n)
        violations.push(`account ${day.account_id}: negative DIEM use ${day.used_nano}`);
    }
    const chargedBy = new Map<string, bigint>();
    for (const entry of entries) {
      if (entry.type !== 'CHARGE' || entry.reservation_id === null) continue;
      chargedBy.set(
        entry.reservation_id,
        (chargedBy.get(entry.reservation_id) ?? 0n) - big(entry.amount_nano),
      );
    }
    for (const r of reservations) {
      const charged = chargedBy.get(r.id) ?? 0n;
      if (charged > big(r.usd_nano) + big(r.diem_nano)) {
        violations.push(
          `reservation ${r.id}: charged ${charged} > held ${big(r.usd_nano) + big(r.diem_nano)}`,
        );
      }
      if (charged > 0n && r.status !== 'captured')
        violations.push(`reservation ${r.id}: charged but ${r.status}`);
      if (r.status === 'held' && !options.allowHeld) violations.push(`reservation ${r.id}: still held`);
    }
    return { accounts: accounts.length, entries: entries.length, reservations: counts, violations };
  } finally {
    if (typeof target === 'string') await database.close();
  }
}

/**
 * `checkInvariants` against server processes still running: a request served alone is answered before its
 * capture commits (Charges.captureDetached), so a reservation can be held for a moment after the last answer.
 * Checks again while the only violations are held reservations, for up to `withinMs`; any other violation is
 * reported at once.
 */
export async function checkSettledInvariants(
  target: Database | string,
  withinMs = 5_000,
): Promise<InvariantReport> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const report = await checkInvariants(target);
    const onlyHeld = report.violations.every((v) => v.endsWith(': still held'));
    if (report.violations.length === 0 || !onlyHeld || Date.now() > deadline) return report;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
