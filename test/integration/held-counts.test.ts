/**
 * Rate-limit counts held by one process (server/storage/held-counts.ts, rate-limits.ts `held`) over a real
 * SQLite file: admissions decided in memory admit exactly the limit however many arrive at once, start from the
 * rows (another process's counts, a restart's), reach the rows behind (by the timer, a flush, the close), and
 * are kept when a write fails; windows are let go only once their rows have their counts.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { createHeldCounts, type HeldCount } from '../../server/storage/held-counts.ts';
import type { StatementRunner } from '../../server/storage/internal.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { createRateLimits } from '../../server/storage/rate-limits.ts';

const T0 = Date.UTC(2026, 0, 15, 12, 0, 30);
const MINUTE = 60_000;
const scratch = mkdtempSync(join(tmpdir(), 'held-counts-'));
let database: Database;

beforeAll(async () => {
  database = await createDatabase(`sqlite:${join(scratch, 'db.sqlite')}`);
  await migrate(database);
});

afterAll(async () => {
  await database?.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** The window's count in its row. */
async function row(bucket: string, at = T0): Promise<number | undefined> {
  const found = await database.db
    .selectFrom('rate_limit_counters')
    .select('used')
    .where('bucket', '=', bucket)
    .where('window_start_ms', '=', Math.floor(at / MINUTE) * MINUTE)
    .executeTakeFirst();
  return found ? Number(found.used) : undefined;
}

const minute = (bucket: string, limit: number) => ({ bucket, windowMs: MINUTE, limit });
const held = (flushMs = 60_000) =>
  createRateLimits(database, { held: true, heldCounts: { flushMs }, now: () => T0 });

describe('rate limits held by the process', () => {
  test('behavior: 60 admissions at once on a window not yet held admit exactly the room its row leaves', async () => {
    // Another process (or this one before a restart) counted 5 in the row.
    await database.db
      .insertInto('rate_limit_counters')
      .values({ bucket: 'c:a:RPM', window_start_ms: Math.floor(T0 / MINUTE) * MINUTE, used: 5 })
      .execute();
    const limits = held();
    expect(limits.holds).toBe(true);
    const results = await Promise.all(
      Array.from({ length: 60 }, () =>
        limits.admit({
          windows: [minute('c:a:RPM', 25), { ...minute('c:a:RPD', 1000), windowMs: 86_400_000 }],
        }),
      ),
    );
    expect(results.filter((r) => r.allowed)).toHaveLength(20);
    expect(Math.max(...results.map((r) => r.windows[0]?.used ?? 0))).toBe(25);
    // Refused: the minute had no room, the day had; neither counted it.
    expect(results.at(-1)?.windows.map((w) => [w.allowed, w.used])).toEqual([
      [false, 25],
      [true, 20],
    ]);
    // Not in the row until written.
    expect(await row('c:a:RPM')).toBe(5);
    await limits.close();
    expect(await row('c:a:RPM')).toBe(25);
    expect(await row('c:a:RPD', Math.floor(T0 / 86_400_000) * 86_400_000)).toBe(20);
  });

  test('behavior: after a close, another repository (a restart) starts from the rows', async () => {
    const first = held();
    await first.admit({ windows: [minute('c:b:RPM', 3)] });
    await first.admit({ windows: [minute('c:b:RPM', 3)] });
    await first.close();
    const second = held();
    expect((await second.admit({ windows: [minute('c:b:RPM', 3)] })).allowed).toBe(true);
    const refused = await second.admit({ windows: [minute('c:b:RPM', 3)] });
    expect(refused.allowed).toBe(false);
    expect(refused.windows[0]).toMatchObject({ used: 3, remaining: 0 });
    expect((await second.peek(minute('c:b:RPM', 3))).used).toBe(3);
    await second.close();
    expect(await row('c:b:RPM')).toBe(3);
  });

  test('behavior: the counts reach their rows by themselves within the flush interval', async () => {
    const limits = held(20);
    await limits.admit({ windows: [minute('c:c:RPM', 10)] });
    await limits.add({ bucket: 'c:c:TPM', windowMs: MINUTE, cost: 40 });
    await vi.waitFor(async () => expect(await row('c:c:TPM')).toBe(40), { timeout: 5_000, interval: 20 });
    expect(await row('c:c:RPM')).toBe(1);
    await limits.close();
  });

  test("behavior: a count added in a transaction reads a window's row on that transaction, and stays counted whatever becomes of it", async () => {
    const limits = held();
    await expect(
      database.transaction(async (trx) => {
        await limits.add({ bucket: 'c:d:TPM', windowMs: MINUTE, cost: 7 }, trx);
        throw new Error('rolled back');
      }),
    ).rejects.toThrow('rolled back');
    expect((await limits.peek(minute('c:d:TPM', 100))).used).toBe(7);
    await limits.close();
    expect(await row('c:d:TPM')).toBe(7);
  });

  test("behavior: `count` decides in memory, on the caller's transaction; `takeBack` gives its room back, before or after its write", async () => {
    const limits = held();
    const input = minute('c:g:RPM', 2);
    // Counted in a transaction that then rolls back: held whatever becomes of it, until taken back.
    await expect(
      database.transaction(async (trx) => {
        expect(await limits.count(input, trx)).toBe(true);
        throw new Error('refused later in the transaction');
      }),
    ).rejects.toThrow('refused later');
    expect((await limits.peek(input)).used).toBe(1);
    await limits.takeBack(input);
    expect((await limits.peek(input)).used).toBe(0);
    // Two fit; the third is refused, with the held figures.
    expect(await limits.count(input)).toBe(true);
    expect(await limits.count(input)).toBe(true);
    expect(await limits.count(input)).toBe(false);
    expect(await limits.refused(input)).toMatchObject({ allowed: false, used: 2, remaining: 0 });
    // Written, then one taken back: the row follows at the next write.
    await limits.flush();
    expect(await row('c:g:RPM')).toBe(2);
    await limits.takeBack(input);
    expect(await limits.count(input)).toBe(true);
    await limits.takeBack(input);
    await limits.close();
    expect(await row('c:g:RPM')).toBe(1);
    // In the rows the count went with its transaction: nothing to take back.
    const rows = createRateLimits(database, { now: () => T0 });
    expect(await rows.count(input)).toBe(true);
    await rows.takeBack(input);
    expect(await row('c:g:RPM')).toBe(2);
    expect(await rows.count(input)).toBe(false);
  });

  test('behavior: a limit of 0 or a cost past the limit refuses without counting; the rows count at once without `held`', async () => {
    const limits = held();
    const none = await limits.admit({ windows: [minute('c:e:RPM', 0)] });
    expect(none.allowed).toBe(false);
    expect(none.windows[0]).toMatchObject({ used: 0, allowed: false });
    const big = await limits.admit({ windows: [{ ...minute('c:e:TPM', 5), cost: 6 }] });
    expect(big.allowed).toBe(false);
    await limits.close();
    expect(await row('c:e:RPM')).toBeUndefined();
    const rows = createRateLimits(database, { now: () => T0 });
    expect(rows.holds).toBe(false);
    await rows.admit({ windows: [minute('c:f:RPM', 5)] });
    expect(await row('c:f:RPM')).toBe(1);
  });
});

describe('createHeldCounts', () => {
  /** Held counts over a map of rows, whose writes fail while `failing`. */
  function overRows() {
    const rows = new Map<string, number>();
    const state = { failing: false, reads: 0, now: T0 };
    const counts = createHeldCounts({
      read: async (bucket, start) => {
        state.reads++;
        return rows.get(`${start}:${bucket}`) ?? 0;
      },
      write: async (_runner, bucket, start, cost) => {
        rows.set(`${start}:${bucket}`, (rows.get(`${start}:${bucket}`) ?? 0) + cost);
      },
      commit: async (fn) => {
        if (state.failing) throw new Error('disk I/O error');
        await fn({} as StatementRunner);
      },
      now: () => state.now,
      flushMs: 60_000,
      capacity: 2,
    });
    return { rows, state, counts };
  }
  const START = Math.floor(T0 / MINUTE) * MINUTE;
  const window = (bucket: string) => ({ bucket, start: START, resetAtMs: START + MINUTE });

  test('behavior: a failed write keeps the counts, and the next flush writes them once', async () => {
    const { rows, state, counts } = overRows();
    const [a] = await counts.counts([window('a')]);
    counts.add(a as NonNullable<typeof a>, 3);
    state.failing = true;
    await counts.flush();
    expect(rows.get(`${START}:a`)).toBeUndefined();
    expect(a?.used).toBe(3);
    counts.add(a as NonNullable<typeof a>, 2);
    state.failing = false;
    await counts.flush();
    expect(rows.get(`${START}:a`)).toBe(5);
    await counts.flush();
    expect(rows.get(`${START}:a`)).toBe(5);
    await counts.close();
  });

  test('behavior: a count taken back is written as counts are, its window held until then; one taken back before its write is not written', async () => {
    const { rows, state, counts } = overRows();
    const [a] = (await counts.counts([window('a')])) as [HeldCount];
    counts.add(a, 2);
    await counts.flush();
    expect(rows.get(`${START}:a`)).toBe(2);
    counts.add(a, -1);
    // The window ended, but what was taken back is not in its row yet: kept through a failed write.
    state.now = T0 + 10 * MINUTE;
    state.failing = true;
    await counts.flush();
    expect(counts.size()).toBe(1);
    state.failing = false;
    await counts.flush();
    expect(rows.get(`${START}:a`)).toBe(1);
    state.now += 1_000;
    await counts.flush();
    expect(counts.size()).toBe(0);
    // Counted and taken back between two writes: nothing to write.
    const [b] = (await counts.counts([window('b')])) as [HeldCount];
    counts.add(b, 1);
    counts.add(b, -1);
    await counts.flush();
    expect(rows.has(`${START}:b`)).toBe(false);
    await counts.close();
  });

  test('behavior: windows past the capacity, or ended, are let go once written, and read again from their rows', async () => {
    const { rows, state, counts } = overRows();
    for (const bucket of ['a', 'b', 'c']) {
      const [count] = await counts.counts([window(bucket)]);
      counts.add(count as NonNullable<typeof count>, 1);
    }
    expect(counts.size()).toBe(3);
    // Past the capacity, but nothing written yet: all kept.
    state.failing = true;
    await counts.flush();
    expect(counts.size()).toBe(3);
    state.failing = false;
    await counts.flush();
    await counts.flush();
    expect(counts.size()).toBe(2);
    expect([rows.get(`${START}:a`), rows.get(`${START}:b`), rows.get(`${START}:c`)]).toEqual([1, 1, 1]);
    // A window let go is read from its row: its count goes on from there.
    const reads = state.reads;
    const again = await counts.counts([window('a'), window('b'), window('c')]);
    expect(state.reads).toBeGreaterThan(reads);
    expect(again.map((count) => count.used)).toEqual([1, 1, 1]);
    // Ended windows go at the next sweep once written.
    state.now = T0 + 10 * MINUTE;
    await counts.flush();
    expect(counts.size()).toBe(0);
    await counts.close();
  });
});
