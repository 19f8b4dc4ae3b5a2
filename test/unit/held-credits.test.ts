/**
 * The JSON-RPC credit windows held by one process (server/storage/held-credits.ts) against a store of rows in
 * memory (its port: read, write, commit): the window slides minute by minute, exactly, against a reference
 * sum; a clock stepped back counts at the latest minute; changes reach the rows added up per bucket, and a
 * write that fails keeps them for the next; windows are let go when idle or past the capacity, never before
 * their rows have everything, and a window let go is read again as it was.
 */
import { describe, expect, test } from 'vitest';
import { innerMap } from '../../server/objects.ts';
import { createHeldCredits, type HeldCreditsOptions } from '../../server/storage/held-credits.ts';
import type { StatementRunner } from '../../server/storage/internal.ts';

const MINUTE = 60_000;
const DAY = 86_400_000;
const T0 = Date.UTC(2026, 0, 15, 12, 0, 0);
const runner = {} as StatementRunner;

/** The window's figures at `at`, as rpc-credits.ts passes them. */
const frame = (at: number) => {
  const bucketMs = Math.floor(at / MINUTE) * MINUTE;
  return { bucketMs, oldest: bucketMs - DAY + MINUTE };
};

/** Rows by subject and bucket; `failNext` commits that fail; every write and read recorded. */
function rowStore() {
  const rows = new Map<string, Map<number, number>>();
  const log = { reads: 0, commits: 0, writes: [] as Array<[string, number, number]>, failNext: 0 };
  const bucketsOf = (subject: string) => innerMap(rows, subject);
  const port: Pick<HeldCreditsOptions, 'read' | 'write' | 'commit'> = {
    async read(subject, oldest) {
      log.reads++;
      await Promise.resolve();
      return [...bucketsOf(subject)]
        .filter(([bucketMs]) => bucketMs >= oldest)
        .sort((a, b) => a[0] - b[0])
        .map(([bucketMs, credits]) => ({ bucketMs, credits }));
    },
    async write(_runner, subject, bucketMs, credits) {
      log.writes.push([subject, bucketMs, credits]);
    },
    async commit(fn) {
      log.commits++;
      const before = log.writes.length;
      await fn(runner);
      if (log.failNext > 0) {
        log.failNext--;
        log.writes.length = before;
        throw new Error('disk full');
      }
      for (const [subject, bucketMs, credits] of log.writes.slice(before)) {
        const buckets = bucketsOf(subject);
        const next = (buckets.get(bucketMs) ?? 0) + credits;
        if (next < 0) throw new Error('a bucket below zero');
        buckets.set(bucketMs, next);
      }
    },
  };
  return { rows, log, port, bucketsOf };
}

function held(store: ReturnType<typeof rowStore>, clock: { now: number }, capacity?: number) {
  return createHeldCredits({
    ...store.port,
    now: () => clock.now,
    spanMs: DAY - MINUTE,
    // Written only when the test flushes.
    flushMs: 3_600_000,
    ...(capacity === undefined ? {} : { capacity }),
  });
}

describe('held credit windows', () => {
  test('behavior: over 30 hours of takes and give-backs the window is the sum of the last 1,440 minutes, and the rows end the same', async () => {
    const store = rowStore();
    const clock = { now: T0 };
    const credits = held(store, clock);
    // Another process's rows before this one started: some in the window, one out of it.
    store.bucketsOf('a').set(T0 - 2 * DAY, 500);
    store.bucketsOf('a').set(T0 - 3 * 3_600_000, 40);
    store.bucketsOf('a').set(T0 - 5 * MINUTE, 7);
    const reference = new Map<number, number>([
      [T0 - 3 * 3_600_000, 40],
      [T0 - 5 * MINUTE, 7],
    ]);
    const sumAt = (at: number) => {
      const { oldest } = frame(at);
      let sum = 0;
      for (const [bucketMs, amount] of reference) if (bucketMs >= oldest) sum += amount;
      return sum;
    };
    const firstAt = (at: number) => {
      const { oldest } = frame(at);
      const inWindow = [...reference.keys()].filter((b) => b >= oldest).sort((x, y) => x - y);
      return inWindow[0];
    };
    let refused = 0;
    for (let i = 0; i < 400; i++) {
      clock.now = T0 + i * 4.5 * MINUTE + (i % 7) * 1_000;
      const { bucketMs, oldest } = frame(clock.now);
      const window = await credits.window('a', bucketMs);
      const amount = 1 + ((i * 11) % 29);
      const limit = 3_000;
      const used = sumAt(clock.now);
      const take = credits.take(window, bucketMs, amount, limit);
      if (used + amount > limit) {
        refused++;
        expect(take).toEqual({ taken: false, used, first: firstAt(clock.now) });
        continue;
      }
      expect(take).toEqual({ taken: true, bucketMs });
      reference.set(bucketMs, (reference.get(bucketMs) ?? 0) + amount);
      expect(window.total).toBe(sumAt(clock.now));
      // A read of the window from a later minute's oldest on; none from before what it holds.
      expect(credits.usedFrom('a', oldest + 90 * MINUTE)).toBe(sumAt(clock.now + 90 * MINUTE));
      expect(credits.usedFrom('a', oldest - MINUTE)).toBeUndefined();
      // Some of it given back, as a call that cost less than its worst case; more than the bucket holds is not.
      if (i % 3 === 0) {
        credits.giveBack(window, bucketMs, 1);
        reference.set(bucketMs, (reference.get(bucketMs) ?? 0) - 1);
      }
      credits.giveBack(window, bucketMs, 10_000);
      if (i % 50 === 0) await credits.flush();
    }
    expect(refused).toBeGreaterThan(20);
    expect(refused).toBeLessThan(300);
    await credits.flush();
    // Every bucket of the window in the rows as held; none written before the window (nothing changed there).
    const { oldest } = frame(clock.now);
    const rows = new Map([...store.bucketsOf('a')].filter(([bucketMs]) => bucketMs >= oldest));
    const expected = new Map([...reference].filter(([bucketMs]) => bucketMs >= oldest));
    expect(rows).toEqual(expected);
    expect(store.bucketsOf('a').get(T0 - 2 * DAY)).toBe(500);
    expect(store.log.reads).toBe(1);
    // A fresh process reading the rows has the same window.
    const restarted = held(store, clock);
    const again = await restarted.window('a', frame(clock.now).bucketMs);
    expect(again.total).toBe(sumAt(clock.now));
  });

  test('behavior: changes reach the rows added up per bucket; a failed write keeps them for the next flush', async () => {
    const store = rowStore();
    const clock = { now: T0 };
    const credits = held(store, clock);
    const { bucketMs } = frame(clock.now);
    const window = await credits.window('b', bucketMs);
    for (let i = 0; i < 10; i++) credits.take(window, bucketMs, 20, 1_000);
    credits.giveBack(window, bucketMs, 15);
    // A take and its give-back that cancel out write a zero: the bucket's row is made, as the rows' own would be.
    clock.now += MINUTE;
    const next = frame(clock.now);
    credits.take(window, next.bucketMs, 5, 1_000);
    credits.giveBack(window, next.bucketMs, 5);
    store.log.failNext = 1;
    await credits.flush();
    expect(store.bucketsOf('b').size).toBe(0);
    expect(window.unwritten).toEqual(
      new Map([
        [bucketMs, 185],
        [next.bucketMs, 0],
      ]),
    );
    credits.take(window, next.bucketMs, 3, 1_000);
    await credits.flush();
    expect(store.log.writes.map(([, b, c]) => [b, c])).toEqual([
      [bucketMs, 185],
      [next.bucketMs, 3],
    ]);
    expect(store.bucketsOf('b')).toEqual(
      new Map([
        [bucketMs, 185],
        [next.bucketMs, 3],
      ]),
    );
    expect(window.unwritten.size).toBe(0);
    expect(window.writing).toBe(0);
  });

  test('behavior: a clock stepped back counts at the latest minute; the window forgets nothing it let go', async () => {
    const store = rowStore();
    const clock = { now: T0 };
    const credits = held(store, clock);
    const late = frame(T0 + DAY);
    const window = await credits.window('c', frame(T0).bucketMs);
    expect(credits.take(window, frame(T0).bucketMs, 60, 100)).toEqual({
      taken: true,
      bucketMs: T0,
    });
    // A day later the first take has left the window.
    expect(credits.take(window, late.bucketMs, 90, 100)).toEqual({
      taken: true,
      bucketMs: late.bucketMs,
    });
    // Back two minutes: counted at the latest minute, against the window as it is there.
    const back = frame(T0 + DAY - 2 * MINUTE);
    expect(credits.take(window, back.bucketMs, 10, 100)).toEqual({
      taken: true,
      bucketMs: late.bucketMs,
    });
    expect(credits.take(window, back.bucketMs, 1, 100)).toEqual({
      taken: false,
      used: 100,
      first: late.bucketMs,
    });
  });

  test('behavior: rows of a clock that ran ahead stay in order behind the takes before them', async () => {
    const store = rowStore();
    const clock = { now: T0 };
    const credits = held(store, clock);
    store.bucketsOf('d').set(T0 + 10 * MINUTE, 30);
    const window = await credits.window('d', frame(T0).bucketMs);
    credits.take(window, T0, 20, 100);
    expect([...window.buckets.keys()]).toEqual([T0, T0 + 10 * MINUTE]);
    // A day on, the take's minute leaves the window and the one ahead stays.
    const later = frame(T0 + DAY + 5 * MINUTE);
    expect(credits.take(window, later.bucketMs, 0, 100)).toEqual({
      taken: true,
      bucketMs: later.bucketMs,
    });
    expect(window.total).toBe(30);
  });

  test('behavior: idle windows are let go once written, past the capacity the least recently used, and read again as they were', async () => {
    const store = rowStore();
    const clock = { now: T0 };
    const credits = held(store, clock, 3);
    const { bucketMs } = frame(clock.now);
    const take = async (subject: string, amount: number, at = clock.now) => {
      const f = frame(at);
      const window = await credits.window(subject, f.bucketMs);
      return credits.take(window, f.bucketMs, amount, 1_000);
    };
    await take('e1', 10);
    await take('e2', 20);
    await take('e3', 30);
    clock.now += 2_000;
    await take('e4', 40);
    // Over the capacity, but nothing written yet: all kept.
    expect(credits.size()).toEqual({ windows: 4, buckets: 4 });
    // Over the capacity at the flush, but its sweep runs before its writes: all kept.
    await credits.flush();
    expect(credits.size()).toEqual({ windows: 4, buckets: 4 });
    // Written now: the next sweep lets go the least recently used one (not e4, used in the last second).
    await credits.flush();
    expect(credits.size()).toEqual({ windows: 3, buckets: 3 });
    expect(credits.lookup('e1')).toBeUndefined();
    // Read again from its rows as it was.
    const reads = store.log.reads;
    expect(await take('e1', 5)).toEqual({ taken: true, bucketMs: frame(clock.now).bucketMs });
    expect(store.log.reads).toBe(reads + 1);
    expect(credits.lookup('e1')?.total).toBe(15);
    // Ten idle minutes later, every written window goes at the next sweep, the unwritten one stays.
    clock.now += 10 * 60_000;
    await take('e2', 1);
    await credits.flush();
    clock.now += 10 * 60_000;
    await take('e3', 1);
    expect(credits.lookup('e3')?.unwritten.size).toBe(1);
    clock.now += 10 * 60_000;
    store.log.failNext = 1;
    await credits.flush();
    expect(credits.lookup('e3')).toBeDefined();
    expect(credits.size().windows).toBe(1);
    await credits.flush();
    clock.now += 10 * 60_000;
    await credits.flush();
    expect(credits.size()).toEqual({ windows: 0, buckets: 0 });
    expect(store.bucketsOf('e3').get(bucketMs)).toBe(30);
  });

  test('behavior: calls that read a window at once share the first read; none of their takes is lost', async () => {
    const store = rowStore();
    const clock = { now: T0 };
    const credits = held(store, clock);
    store.bucketsOf('f').set(T0 - MINUTE, 30);
    const { bucketMs } = frame(clock.now);
    const results = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const window = await credits.window('f', bucketMs);
        return credits.take(window, bucketMs, 7, 100);
      }),
    );
    expect(results.filter((r) => r.taken)).toHaveLength(10);
    expect(credits.lookup('f')?.total).toBe(100);
    await credits.close();
    expect(store.bucketsOf('f').get(bucketMs)).toBe(70);
  });
});
