/**
 * The ledger's one-transaction variants (`reserveWith`, `captureWith`) and the JSON-RPC credit count that runs
 * inside them, on both engines: the same holds, splits and entries as `reserve` and `capture`; the caller's
 * statements are written or undone together with the ledger's; a capture whose reservation is not held (or
 * whose figures are not the stored ones) changes nothing; and on PostgreSQL, takes from two connection pools
 * (two server processes) never pass the credit cap together, also when the per-minute count and the take are
 * writes of the reservation's one round trip (ReserveWithin.embedded).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { type AccountsRepository, createAccounts } from '../../server/storage/accounts.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { ReservationStateError, StorageError } from '../../server/storage/errors.ts';
import { createLedger, type LedgerRepository, type ReserveWithin } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { createRateLimits, type RateLimitsRepository } from '../../server/storage/rate-limits.ts';
import { createRpcCredits, type RpcCreditsRepository } from '../../server/storage/rpc-credits.ts';
import { holdAccountLock, type StartedPostgres, startPostgres } from '../support/postgres.ts';
import { sqliteOpcodes } from '../support/sqlite-program.ts';

const USD = 1_000_000_000n;
const T0 = Date.UTC(2026, 0, 15, 12, 0, 30);
const HOUR = 3_600_000;
const DAY = 24 * HOUR;

let postgres: StartedPostgres | undefined;

const engines: Array<[string, () => Promise<{ url: string; cleanup(): Promise<void> }>]> = [
  [
    'sqlite',
    async () => {
      const dir = await mkdtemp(join(tmpdir(), 'svc-ledger-with-'));
      return {
        url: `sqlite:${join(dir, 'db.sqlite')}`,
        cleanup: () => rm(dir, { recursive: true, force: true }),
      };
    },
  ],
  [
    'postgres',
    async () => {
      postgres ??= await startPostgres();
      return { url: await postgres.createDatabase(`ledger_with_${process.pid}`), cleanup: async () => {} };
    },
  ],
];

afterAll(async () => {
  await postgres?.stop();
});

describe.each(engines)('reserveWith / captureWith on %s', (engine, open) => {
  let cleanup: () => Promise<void>;
  let database: Database;
  /** A second pool on the same database: another server process (PostgreSQL only). */
  let other: Database | undefined;
  let nowMs = T0;
  const clock = { now: () => nowMs };
  let accounts: AccountsRepository;
  let ledger: LedgerRepository;
  let credits: RpcCreditsRepository;
  let limits: RateLimitsRepository;
  /** The statements sent through `database`, in order. */
  const sent: string[] = [];

  beforeAll(async () => {
    const opened = await open();
    cleanup = opened.cleanup;
    database = await createDatabase(opened.url, { poolMax: 12, onQuery: (text) => sent.push(text) });
    await migrate(database);
    if (engine === 'postgres') other = await createDatabase(opened.url, { poolMax: 10 });
    accounts = createAccounts(database, clock);
    ledger = createLedger(database, clock);
    credits = createRpcCredits(database, clock);
    limits = createRateLimits(database, clock);
  });

  afterAll(async () => {
    await other?.close();
    await database?.close();
    await cleanup?.();
  });

  beforeEach(() => {
    nowMs = T0;
  });

  async function fundedAccount(usd: bigint, diemStake = 0n) {
    const account = await accounts.createApiAccount({ name: 'test' });
    await ledger.topUp({ accountId: account.id, amountNano: usd });
    if (diemStake > 0n) await accounts.setDiemStake(account.id, diemStake);
    return account;
  }

  /** The account's figures and its rows, to compare before and after something that must change nothing. */
  async function snapshot(accountId: string) {
    const { db } = database;
    return {
      account: await db.selectFrom('accounts').selectAll().where('id', '=', accountId).executeTakeFirst(),
      reservations: await db
        .selectFrom('reservations')
        .selectAll()
        .where('account_id', '=', accountId)
        .execute(),
      entries: await db
        .selectFrom('ledger_entries')
        .selectAll()
        .where('account_id', '=', accountId)
        .execute(),
      diem: await db.selectFrom('diem_usage').selectAll().where('account_id', '=', accountId).execute(),
      credits: await credits.used(accountId, nowMs),
      minute: (await limits.peek(minuteOf(accountId, 1_000))).used,
    };
  }

  const minuteOf = (accountId: string, limit: number) => ({
    bucket: `rpc:${accountId}:RPM`,
    windowMs: 60_000,
    limit,
    now: nowMs,
  });

  /**
   * What the JSON-RPC proxy admits a call with (rpc/service.ts): the count in the caller's minute, then the
   * credit take; on PostgreSQL also as the writes of the reservation's one round trip.
   */
  function admission(
    accountId: string,
    take: { credits: number; limit: number; minuteLimit?: number },
    repositories: { credits: RpcCreditsRepository; limits: RateLimitsRepository } = { credits, limits },
  ): ReserveWithin<number> {
    const minute = minuteOf(accountId, take.minuteLimit ?? 1_000);
    const input = { subject: accountId, credits: take.credits, limit: take.limit };
    const within = async (trx: Parameters<ReserveWithin<number>>[0]) => {
      if (!(await repositories.limits.count(minute, trx))) throw new Error('minute');
      const taken = await repositories.credits.takeIn(trx, input);
      if (!taken.allowed) throw new Error('capped');
      return taken.bucketMs;
    };
    const counted = repositories.limits.hitAlong(minute);
    const taken = repositories.credits.takeAlong(input);
    return counted && taken
      ? Object.assign(within, { embedded: { writes: [counted, ...taken.writes], result: taken.bucketMs } })
      : within;
  }

  const reserveInput = (accountId: string, amountNano: bigint, requestId: string) => ({
    accountId,
    amountNano,
    requestId,
    modelId: 'base-mainnet',
    ttlMs: 60_000,
  });

  test('behavior: the same DIEM-first split and entries as reserve + capture, with the caller statements in both', async () => {
    const account = await fundedAccount(5n * USD, USD);
    const { reservation, within } = await ledger.reserveWith(
      reserveInput(account.id, 1_500_000_000n, 'with-1'),
      (trx) => credits.takeIn(trx, { subject: account.id, credits: 40, limit: 100 }),
    );
    expect(within).toEqual({ allowed: true, bucketMs: Date.UTC(2026, 0, 15, 12, 0, 0) });
    expect(reservation).toMatchObject({ diemNano: USD, usdNano: 500_000_000n, status: 'held' });
    expect(await credits.used(account.id, nowMs)).toBe(40);

    const captured = await ledger.captureWith(
      reservation,
      {
        items: [
          { sku: 'in', amountNano: 800_000_000n, units: 8, unitPriceNano: 100_000_000n },
          { sku: 'out', amountNano: 400_000_000n },
        ],
      },
      (trx) =>
        credits.giveBack(
          { subject: account.id, bucketMs: within.allowed ? within.bucketMs : 0, credits: 15 },
          trx,
        ),
    );
    expect(captured).toMatchObject({ diemNano: USD, usdNano: 200_000_000n, requestedNano: 1_200_000_000n });
    expect(captured.clamped).toBe(false);
    expect(
      captured.entries.map((e) => [
        e.sku,
        e.currency,
        e.amountNano,
        e.balanceAfterNano,
        e.units,
        e.requestId,
      ]),
    ).toEqual([
      ['in', 'DIEM', -800_000_000n, 200_000_000n, '8', 'with-1'],
      ['out', 'DIEM', -200_000_000n, 0n, null, 'with-1'],
      ['out', 'USD', -200_000_000n, 5n * USD - 200_000_000n, null, 'with-1'],
    ]);
    expect(await ledger.getBalance(account.id)).toMatchObject({
      usdNano: 5n * USD - 200_000_000n,
      usdReservedNano: 0n,
      diemUsedTodayNano: USD,
      diemReservedTodayNano: 0n,
    });
    expect((await ledger.getReservation(reservation.id)).status).toBe('captured');
    expect(await credits.used(account.id, nowMs)).toBe(25);
  });

  test('behavior: a capture is capped at the reservation (USD only), the rest released', async () => {
    const account = await fundedAccount(2n * USD);
    const { reservation } = await ledger.reserveWith(reserveInput(account.id, 300n, 'clamp'), async () => 0);
    expect(await ledger.getBalance(account.id)).toMatchObject({ usdReservedNano: 300n });
    const captured = await ledger.captureWith(reservation, { items: [{ sku: 'x', amountNano: 1_000n }] });
    expect(captured).toMatchObject({ usdNano: 300n, diemNano: 0n, requestedNano: 1_000n, clamped: true });
    expect(captured.entries.map((e) => [e.amountNano, e.balanceAfterNano])).toEqual([
      [-300n, 2n * USD - 300n],
    ]);
    expect(await ledger.getBalance(account.id)).toMatchObject({
      usdNano: 2n * USD - 300n,
      usdReservedNano: 0n,
    });
  });

  test('behavior: a reservation drawn on DIEM alone is captured under the account lock, the rest released', async () => {
    const account = await fundedAccount(USD, USD);
    const { reservation } = await ledger.reserveWith(
      reserveInput(account.id, 600n, 'diem-only'),
      async () => 0,
    );
    expect(reservation).toMatchObject({ diemNano: 600n, usdNano: 0n });
    const captured = await ledger.captureWith(reservation, { items: [{ sku: 'x', amountNano: 250n }] });
    expect(captured.entries.map((e) => [e.currency, e.amountNano, e.balanceAfterNano])).toEqual([
      ['DIEM', -250n, USD - 250n],
    ]);
    expect(await ledger.getBalance(account.id)).toMatchObject({
      usdNano: USD,
      usdReservedNano: 0n,
      diemUsedTodayNano: 250n,
      diemReservedTodayNano: 0n,
    });
    await expect(
      ledger.captureWith(reservation, { items: [{ sku: 'x', amountNano: 1n }] }),
    ).rejects.toBeInstanceOf(ReservationStateError);
  });

  test('behavior: what the caller statements throw refuses the reservation and undoes their writes', async () => {
    const account = await fundedAccount(USD);
    const before = await snapshot(account.id);
    const refusal = new Error('over the cap');
    await expect(
      ledger.reserveWith(reserveInput(account.id, 100n, 'refused'), async (trx) => {
        await credits.takeIn(trx, { subject: account.id, credits: 50, limit: 100 });
        throw refusal;
      }),
    ).rejects.toBe(refusal);
    expect(await snapshot(account.id)).toEqual(before);

    // A balance refusal after the take undoes the take as well.
    await expect(
      ledger.reserveWith(reserveInput(account.id, 2n * USD, 'poor'), (trx) =>
        credits.takeIn(trx, { subject: account.id, credits: 50, limit: 100 }),
      ),
    ).rejects.toMatchObject({ name: 'InsufficientBalanceError' });
    expect(await snapshot(account.id)).toEqual(before);
  });

  test('behavior: the credit take refuses what would pass the rolling 24-hour cap, and says when credits free up', async () => {
    const account = await fundedAccount(USD);
    const first = await ledger.reserveWith(reserveInput(account.id, 1n, 'c1'), (trx) =>
      credits.takeIn(trx, { subject: account.id, credits: 70, limit: 100 }),
    );
    expect(first.within.allowed).toBe(true);
    nowMs += 60_000;
    const second = await ledger.reserveWith(reserveInput(account.id, 1n, 'c2'), (trx) =>
      credits.takeIn(trx, { subject: account.id, credits: 31, limit: 100 }),
    );
    expect(second.within).toEqual({
      allowed: false,
      used: 70,
      nextReleaseAtMs: Date.UTC(2026, 0, 15, 12, 0, 0) + 86_400_000,
    });
    const third = await ledger.reserveWith(reserveInput(account.id, 1n, 'c3'), (trx) =>
      credits.takeIn(trx, { subject: account.id, credits: 30, limit: 100 }),
    );
    expect(third.within.allowed).toBe(true);
    expect(await credits.used(account.id, nowMs)).toBe(100);
    // A day after the first take its bucket has left the window.
    nowMs = Date.UTC(2026, 0, 16, 12, 0, 30);
    expect(await credits.used(account.id, nowMs)).toBe(30);
  });

  test('behavior: the credit take and its give-back write without reading anything back (no RETURNING)', async () => {
    // On SQLite a RETURNING statement runs through an ephemeral table of its own; what a statement changed
    // tells these whether they wrote. Run as the proxy's SQLite path runs them (PostgreSQL embeds the take in
    // the reservation's round trip instead: ReserveWithin.embedded).
    const account = await fundedAccount(USD);
    const take = (amount: number) =>
      database.transaction((trx) =>
        credits.takeIn(trx, { subject: account.id, credits: amount, limit: 100 }),
      );
    sent.length = 0;
    const taken = await take(70);
    if (!taken.allowed) throw new Error('the take was refused');
    expect(await take(31)).toMatchObject({ allowed: false, used: 70 });
    // Given back: what the bucket holds; more than it holds changes neither it nor its hour.
    await credits.giveBack({ subject: account.id, bucketMs: taken.bucketMs, credits: 20 });
    expect(await credits.used(account.id, nowMs)).toBe(50);
    await credits.giveBack({ subject: account.id, bucketMs: taken.bucketMs, credits: 51 });
    expect(await credits.used(account.id, nowMs)).toBe(50);
    const hours = await database.db
      .selectFrom('rpc_credit_hours')
      .select('credits')
      .where('subject', '=', account.id)
      .execute();
    expect(hours.map((row) => Number(row.credits))).toEqual([50]);
    const writesOf = (texts: string[]) =>
      texts.filter((text) => /^(insert|update)\b.*"rpc_credit_(usage|hours)"/is.test(text.trim()));
    const writes = writesOf(sent);
    // The first take: its bucket's update (none there yet), its upsert and its hour; the refused take's update
    // and upsert; the give-backs' buckets and the first one's hour.
    expect(writes).toHaveLength(8);
    for (const text of writes) expect(text).not.toMatch(/\breturning\b/i);

    // A take into the minute's bucket, there now: its update and its hour, without the upsert, whose SELECT
    // reads its own table (SQLite fills a temporary table with it first, an ephemeral B-tree per take).
    sent.length = 0;
    expect(await take(10)).toMatchObject({ allowed: true });
    const next = writesOf(sent);
    expect(next.map((text) => text.trim().split(/\s+/, 3).join(' '))).toEqual([
      'update "rpc_credit_usage" set',
      'insert into "rpc_credit_hours"',
    ]);
    expect(await credits.used(account.id, nowMs)).toBe(60);
    if (engine === 'sqlite') {
      expect(await sqliteOpcodes(database.db, next[0] ?? '')).not.toContain('OpenEphemeral');
    }
  });

  test('behavior: a capture of a reservation no longer held changes nothing, its caller statements included', async () => {
    const account = await fundedAccount(USD);
    const { reservation, within } = await ledger.reserveWith(reserveInput(account.id, 500n, 'gone'), (trx) =>
      credits.takeIn(trx, { subject: account.id, credits: 20, limit: 100 }),
    );
    await ledger.release(reservation.id);
    const before = await snapshot(account.id);
    await expect(
      ledger.captureWith(reservation, { items: [{ sku: 'x', amountNano: 100n }] }, (trx) =>
        credits.giveBack(
          { subject: account.id, bucketMs: within.allowed ? within.bucketMs : 0, credits: 20 },
          trx,
        ),
      ),
    ).rejects.toBeInstanceOf(ReservationStateError);
    expect(await snapshot(account.id)).toEqual(before);
    expect(before.credits).toBe(20);
  });

  test('behavior: a reservation whose figures are not the stored ones is refused, nothing changed', async () => {
    const account = await fundedAccount(USD);
    const { reservation } = await ledger.reserveWith(reserveInput(account.id, 500n, 'forged'), async () => 0);
    const before = await snapshot(account.id);
    const forged = { ...reservation, usdNano: 100n };
    const error = await ledger
      .captureWith(forged, { items: [{ sku: 'x', amountNano: 4_000n }] })
      .catch((e) => e);
    expect(error).toBeInstanceOf(StorageError);
    expect(await snapshot(account.id)).toEqual(before);
    expect((await ledger.getReservation(reservation.id)).status).toBe('held');
  });

  test('behavior: concurrent takes from two processes admit exactly what fits the credit cap', async () => {
    const account = await fundedAccount(USD);
    const otherLedger = other ? createLedger(other, clock) : ledger;
    const otherCredits = other ? createRpcCredits(other, clock) : credits;
    const attempts = Array.from({ length: 24 }, (_, i) => {
      const [l, c] = i % 2 ? [otherLedger, otherCredits] : [ledger, credits];
      return l.reserveWith(reserveInput(account.id, 10n, `race-${i}`), async (trx) => {
        const taken = await c.takeIn(trx, { subject: account.id, credits: 7, limit: 50 });
        if (!taken.allowed) throw new Error('capped');
        return taken;
      });
    });
    const results = await Promise.allSettled(attempts);
    const admitted = results.filter((r) => r.status === 'fulfilled').length;
    const refused = results.filter(
      (r) => r.status === 'rejected' && String(r.reason).includes('capped'),
    ).length;
    expect([admitted, refused]).toEqual([7, 17]);
    expect(await credits.used(account.id, nowMs)).toBe(49);
    expect(await ledger.getBalance(account.id)).toMatchObject({ usdReservedNano: 70n });
  });
  test('behavior: the minute count and the credit take with the hold: one round trip on PostgreSQL, the same rows', async () => {
    // The connection's first such reservation prepares the statement after the lock (see scriptThenPrepared).
    const warm = await fundedAccount(USD);
    await ledger.reserveWith(
      reserveInput(warm.id, 700n, 'warm'),
      admission(warm.id, { credits: 30, limit: 100 }),
    );
    const account = await fundedAccount(USD);
    sent.length = 0;
    const { reservation, within } = await ledger.reserveWith(
      // Text written into the script as literals: quotes, a backslash, a placeholder's look, beyond ASCII.
      { ...reserveInput(account.id, 700n, 'embedded'), modelId: "base'main\\net $1 ünï" },
      admission(account.id, { credits: 30, limit: 100 }),
    );
    expect(within).toBe(Date.UTC(2026, 0, 15, 12, 0, 0));
    // PostgreSQL: the script (the lock, then one statement); SQLite: the transaction, statement by statement
    // (begin, the account, the minute, the credits' bucket (the update that finds none yet, then the upsert)
    // and its hour, the reservation, the hold, commit).
    expect(sent.length).toBe(engine === 'postgres' ? 1 : 9);
    expect(await ledger.getReservation(reservation.id)).toEqual(reservation);
    expect(reservation).toMatchObject({
      usdNano: 700n,
      diemNano: 0n,
      status: 'held',
      modelId: "base'main\\net $1 ünï",
    });
    const after = await snapshot(account.id);
    expect([after.credits, after.minute, after.account?.usd_reserved_nano]).toEqual([30, 1, 700n]);
  });

  test('behavior: a refusal after a write of the round trip undoes it, and the transaction says which refused', async () => {
    const account = await fundedAccount(1_000n);
    await ledger.reserveWith(
      reserveInput(account.id, 10n, 'first'),
      admission(account.id, { credits: 60, limit: 100 }),
    );
    const before = await snapshot(account.id);
    // The minute counts, then the credit cap refuses.
    await expect(
      ledger.reserveWith(
        reserveInput(account.id, 10n, 'capped'),
        admission(account.id, { credits: 41, limit: 100 }),
      ),
    ).rejects.toThrow('capped');
    expect(await snapshot(account.id)).toEqual(before);
    // Both count, then the balance refuses.
    await expect(
      ledger.reserveWith(
        reserveInput(account.id, 991n, 'poor'),
        admission(account.id, { credits: 40, limit: 100 }),
      ),
    ).rejects.toMatchObject({ name: 'InsufficientBalanceError' });
    expect(await snapshot(account.id)).toEqual(before);
    // The minute refuses first.
    await expect(
      ledger.reserveWith(
        reserveInput(account.id, 10n, 'minute'),
        admission(account.id, { credits: 1, limit: 100, minuteLimit: 1 }),
      ),
    ).rejects.toThrow('minute');
    expect(await snapshot(account.id)).toEqual(before);
  });

  // PostgreSQL: the round trip's credit take decides on a day of buckets that no update of its statement
  // locks. It must read the takes of whoever held the account's lock before it: here a writer that took 60 of
  // 100 credits commits while the round trip waits for the lock, and the round trip's 50 no longer fit.
  test.skipIf(engine !== 'postgres')(
    'behavior: a round trip waiting for the account lock sees the take of the writer it waited for',
    async () => {
      const account = await fundedAccount(USD);
      const writer = await holdAccountLock(other as Database, account.id, (trx) =>
        createRpcCredits(other as Database, clock).takeIn(trx, {
          subject: account.id,
          credits: 60,
          limit: 100,
        }),
      );
      const waiting = ledger
        .reserveWith(
          reserveInput(account.id, 10n, 'behind'),
          admission(account.id, { credits: 50, limit: 100 }),
        )
        .then(
          () => 'reserved',
          (error: unknown) => error,
        );
      await writer.waitForWaiter();
      await writer.release();
      expect(String(await waiting)).toContain('capped');
      const after = await snapshot(account.id);
      expect([after.credits, after.minute, after.reservations]).toEqual([60, 0, []]);
    },
  );

  test('behavior: concurrent round trips from two processes admit exactly what fits the credit cap', async () => {
    const account = await fundedAccount(USD);
    const otherLedger = other ? createLedger(other, clock) : ledger;
    const otherRepositories = other
      ? { credits: createRpcCredits(other, clock), limits: createRateLimits(other, clock) }
      : { credits, limits };
    const results = await Promise.allSettled(
      Array.from({ length: 24 }, (_, i) =>
        (i % 2 ? otherLedger : ledger).reserveWith(
          reserveInput(account.id, 10n, `trip-${i}`),
          admission(account.id, { credits: 7, limit: 50 }, i % 2 ? otherRepositories : undefined),
        ),
      ),
    );
    const admitted = results.filter((r) => r.status === 'fulfilled').length;
    const refused = results.filter(
      (r) => r.status === 'rejected' && String(r.reason).includes('capped'),
    ).length;
    expect([admitted, refused]).toEqual([7, 17]);
    const after = await snapshot(account.id);
    expect([after.credits, after.minute, after.account?.usd_reserved_nano]).toEqual([49, 7, 70n]);
    await expectHoursOfBuckets(account.id);
  });

  /** Each hour of rpc_credit_hours is the sum of the subject's buckets in it: what the window's reads rely on. */
  async function expectHoursOfBuckets(subject: string) {
    const { db } = database;
    const buckets = await db
      .selectFrom('rpc_credit_usage')
      .select(['bucket_ms', 'credits'])
      .where('subject', '=', subject)
      .execute();
    const sums = new Map<number, number>();
    for (const b of buckets) {
      const hour = Math.floor(Number(b.bucket_ms) / HOUR) * HOUR;
      sums.set(hour, (sums.get(hour) ?? 0) + Number(b.credits));
    }
    const hours = await db
      .selectFrom('rpc_credit_hours')
      .select(['hour_ms', 'credits'])
      .where('subject', '=', subject)
      .execute();
    expect(new Map(hours.map((h) => [Number(h.hour_ms), Number(h.credits)]))).toEqual(sums);
  }

  test('behavior: the rolling 24 hours, read as the buckets before the first whole hour and then hours, are exact', async () => {
    const subject = `window-${engine}`;
    const take = (amount: number, limit: number, at: number) =>
      database.transaction((trx) => credits.takeIn(trx, { subject, credits: amount, limit, now: at }));
    // A take every 7 minutes for 30 hours (sizes 1 to 13), some given back once their minute has passed.
    const taken: Array<[bucketMs: number, credits: number]> = [];
    let at = T0 - 3 * HOUR + 17_000;
    for (let i = 0; i < 260; i++) {
      const amount = 1 + ((i * 7) % 13);
      expect((await take(amount, 1_000_000, at)).allowed).toBe(true);
      taken.push([Math.floor(at / 60_000) * 60_000, amount]);
      at += 7 * 60_000;
    }
    for (const i of [5, 100, 250]) {
      const row = taken[i] as [number, number];
      await credits.giveBack({ subject, bucketMs: row[0], credits: 1 });
      row[1] -= 1;
    }
    await expectHoursOfBuckets(subject);
    // At every 37th minute and then some, from before the first take to past the last one's day: what the
    // buckets of the 1,440 minutes from the probe's back (and any after it) add up to.
    const reference = (probe: number) => {
      const oldest = Math.floor(probe / 60_000) * 60_000 - DAY + 60_000;
      return taken.reduce((sum, [bucketMs, amount]) => (bucketMs >= oldest ? sum + amount : sum), 0);
    };
    for (let probe = T0 - 4 * HOUR; probe < at + 25 * HOUR; probe += 37 * 60_000 + 13_000) {
      expect(await credits.used(subject, probe), new Date(probe).toISOString()).toBe(reference(probe));
    }
    // The cap at the last take's minute: exactly what is left fits, one credit more does not.
    const used = reference(at);
    const first = taken.find(([bucketMs]) => bucketMs >= Math.floor(at / 60_000) * 60_000 - DAY + 60_000);
    expect(await take(6, used + 5, at)).toEqual({
      allowed: false,
      used,
      nextReleaseAtMs: (first?.[0] ?? 0) + DAY,
    });
    expect(await take(5, used + 5, at)).toMatchObject({ allowed: true });
    taken.push([Math.floor(at / 60_000) * 60_000, 5]);
    // Pruning what the window no longer reads leaves it as it was.
    expect(await credits.prune(at - DAY)).toBeGreaterThan(0);
    expect(await credits.used(subject, at)).toBe(reference(at));
    const hoursLeft = await database.db
      .selectFrom('rpc_credit_hours')
      .select((eb) => eb.fn.min('hour_ms').as('first'))
      .where('subject', '=', subject)
      .executeTakeFirst();
    expect(Number(hoursLeft?.first)).toBeGreaterThan(at - DAY - HOUR);
  });
});
