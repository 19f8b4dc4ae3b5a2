/**
 * The captures of reservations held in memory that are asked for in one turn of the event loop are written by
 * one function of the commit group (ledger.ts, `captureHeld`): each account settled and read once, every entry
 * in one statement. What they write and answer must be exactly what the same captures write and answer one
 * after the other: the rows, the entries' amounts and balances in `seq` order, the accounts, the keys' spend,
 * each capture's result. A capture that cannot be written fails alone; a commit that fails fails them all.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { heldReservationsOf } from '../../server/storage/held-reservations.ts';
import { type CaptureResult, createLedger, type Reservation } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { checkInvariants } from '../support/invariants.ts';

const USD = 1_000_000_000n;
const T0 = Date.UTC(2026, 0, 15, 12, 0, 0);
const clock = { now: () => T0 };

let dir: string;
const databases: Database[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'svc-held-captures-'));
});

afterAll(async () => {
  for (const database of databases) await database.close();
  await rm(dir, { recursive: true, force: true });
});

/** A fresh database whose statements are recorded in `statements`. */
async function fresh(name: string) {
  const statements: string[] = [];
  const database = await createDatabase(`sqlite:${join(dir, `${name}.db`)}`, {
    onQuery: (text) => statements.push(text),
  });
  databases.push(database);
  await migrate(database);
  return { database, statements };
}

/** Two funded accounts (the first with a key), and five reservations held in memory: three of A, two of B. */
async function reservedFive(database: Database) {
  const ledger = createLedger(database, { now: clock.now, holdsInMemory: true });
  const accounts = createAccounts(database, clock);
  const a = (await accounts.createApiAccount({ name: 'A' })).id;
  const b = (await accounts.createApiAccount({ name: 'B' })).id;
  await ledger.topUp({ accountId: a, amountNano: 100n * USD });
  await ledger.topUp({ accountId: b, amountNano: 50n * USD });
  const key = (await createApiKeys(database).create({ accountId: a, keyType: 'INFERENCE' })).key.id;
  const owners = [
    [a, key],
    [b, null],
    [a, key],
    [a, null],
    [b, null],
  ] as const;
  const reservations: Reservation[] = [];
  for (const [i, [accountId, apiKeyId]] of owners.entries()) {
    const reserved = await ledger.reserve({
      accountId,
      apiKeyId,
      amountNano: 3n * USD,
      requestId: `request-${i}`,
      modelId: 'llama-3.3-70b',
      ttlMs: 60_000,
    });
    reservations.push(reserved.reservation);
  }
  // Each capture's items differ (one charges nothing, one more than it holds: clamped to the hold).
  const items = reservations.map((_, i) => [
    { sku: 'input_tokens', amountNano: BigInt(i) * 7_000_000n + 1_000n },
    { sku: 'output_tokens', amountNano: i === 3 ? 0n : BigInt(i + 1) * 900_000_001n },
  ]);
  return { ledger, a, b, key, reservations, items };
}

/** What the captures left, with ids replaced by names (the two databases' ids differ). */
async function outcome(
  database: Database,
  names: Map<string, string>,
  results: CaptureResult[],
): Promise<unknown> {
  const name = (id: string | null) => (id === null ? null : (names.get(id) ?? id));
  const entries = await database.db
    .selectFrom('ledger_entries')
    .select([
      'account_id',
      'api_key_id',
      'type',
      'currency',
      'amount_nano',
      'balance_after_nano',
      'sku',
      'request_id',
    ])
    .where('type', '=', 'CHARGE')
    .orderBy('seq')
    .execute();
  const accounts = await database.db
    .selectFrom('accounts')
    .select(['id', 'usd_balance_nano', 'usd_reserved_nano'])
    .orderBy('name')
    .execute();
  const reservations = await database.db
    .selectFrom('reservations')
    .selectAll()
    .orderBy('request_id')
    .execute();
  const spend = await database.db.selectFrom('api_key_spend_days').selectAll().execute();
  return {
    entries: entries.map((e) => ({ ...e, account_id: name(e.account_id), api_key_id: name(e.api_key_id) })),
    accounts: accounts.map((a) => ({ ...a, id: name(a.id) })),
    // Every column but the id (each database made its own).
    reservations: reservations.map(({ id: _, ...r }) => ({
      ...r,
      account_id: name(r.account_id),
      api_key_id: name(r.api_key_id),
    })),
    spend: spend.map((s) => ({ ...s, api_key_id: name(s.api_key_id) })),
    results: results.map((r) => ({
      ...r,
      entries: r.entries.map((e) => ({
        amountNano: e.amountNano,
        balanceAfterNano: e.balanceAfterNano,
        sku: e.sku,
        requestId: e.requestId,
      })),
    })),
  };
}

test('behavior: captures asked for in one turn write and answer exactly what they would one after the other, in one function', async () => {
  const apart = await fresh('apart');
  const one = await reservedFive(apart.database);
  const apartResults: CaptureResult[] = [];
  for (const [i, reservation] of one.reservations.entries())
    apartResults.push(await one.ledger.captureWith(reservation, { items: one.items[i] ?? [] }));

  const together = await fresh('together');
  const all = await reservedFive(together.database);
  const from = together.statements.length;
  const togetherResults = await Promise.all(
    all.reservations.map((reservation, i) =>
      all.ledger.captureWith(reservation, { items: all.items[i] ?? [] }),
    ),
  );
  const written = together.statements.slice(from);

  const namesOf = (run: { a: string; b: string; key: string }) =>
    new Map([
      [run.a, 'A'],
      [run.b, 'B'],
      [run.key, 'key'],
    ]);
  expect(await outcome(together.database, namesOf(all), togetherResults)).toEqual(
    await outcome(apart.database, namesOf(one), apartResults),
  );
  // The balances recorded run on from capture to capture of each account, as one after the other.
  expect(apartResults.map((r) => r.entries.length)).toEqual([2, 2, 2, 1, 2]);

  // One function of one group: the five rows in one statement, each account settled and read once, the nine
  // entries in one statement, the key's spend in one; no savepoint (the group's only function).
  const count = (pattern: RegExp) => written.filter((text) => pattern.test(text)).length;
  expect(count(/^insert into "reservations"/)).toBe(1);
  expect(count(/^update "accounts"/)).toBe(2);
  expect(count(/^select "usd_balance_nano", "diem_stake_nano" from "accounts"/)).toBe(2);
  expect(count(/^insert into "ledger_entries"/)).toBe(1);
  expect(count(/^insert into "api_key_spend_days"/)).toBe(1);
  expect(count(/savepoint/i)).toBe(0);
  expect(count(/^commit/i)).toBe(1);
  expect(heldReservationsOf(together.database).usdOf(all.a)).toBe(0n);
  expect((await checkInvariants(together.database)).violations).toEqual([]);
});

test('behavior: a capture of the turn that cannot be written fails alone; the others are written', async () => {
  const { database } = await fresh('isolated');
  const { ledger, reservations, items, a, b } = await reservedFive(database);
  const held = heldReservationsOf(database);
  const refused = new Error('the caller refused');
  const outcomes = await Promise.allSettled(
    reservations.map((reservation, i) =>
      ledger.captureWith(
        reservation,
        { items: items[i] ?? [] },
        i === 2
          ? async () => {
              throw refused;
            }
          : undefined,
      ),
    ),
  );
  expect(outcomes.map((o) => o.status)).toEqual([
    'fulfilled',
    'fulfilled',
    'rejected',
    'fulfilled',
    'fulfilled',
  ]);
  expect((outcomes[2] as PromiseRejectedResult).reason).toBe(refused);
  // The failed one is still held, its row unwritten, nothing charged for it.
  const failed = reservations[2] as Reservation;
  expect(held.get(failed.id)).toEqual(failed);
  expect(held.usdOf(a)).toBe(3n * USD);
  expect(held.usdOf(b)).toBe(0n);
  const rows = await database.db.selectFrom('reservations').select(['id', 'status']).execute();
  expect(rows.map((r) => r.id).sort()).toEqual(
    reservations
      .filter((_, i) => i !== 2)
      .map((r) => r.id)
      .sort(),
  );
  const charged = await database.db
    .selectFrom('ledger_entries')
    .select('request_id')
    .where('type', '=', 'CHARGE')
    .execute();
  expect(new Set(charged.map((e) => e.request_id))).toEqual(
    new Set(['request-0', 'request-1', 'request-3', 'request-4']),
  );
  expect((await checkInvariants(database, { allowHeld: true })).violations).toEqual([]);
  // Captured later, alone, it is written as any other.
  await expect(ledger.captureWith(failed, { items: items[2] ?? [] })).resolves.toMatchObject({
    usdNano: expect.any(BigInt),
  });
  expect(held.usdOf(a)).toBe(0n);
  expect((await checkInvariants(database)).violations).toEqual([]);
});
