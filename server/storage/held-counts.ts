/**
 * Rate-limit counts held in this process, for a database that no other process counts in: SQLite served by one
 * process (`WORKERS=1`, the embedded default; rate-limits.ts `held`). An admission is then decided and counted
 * in memory, at once and exactly (the process is single-threaded: from the check of a request's windows to its
 * count nothing else runs), and the counts reach their rows later, added up per window, every `flushMs` in one
 * short write. The database stays the record: a window not held is read from its row first, a count is held
 * until its row has it, and `flush` writes everything before the database closes.
 *
 * What a crash of the process can lose is the counts of its last `flushMs` (50 ms): after a restart those
 * requests are not in their windows. The same stance as PostgreSQL's admission, whose commit does not wait for
 * its WAL flush (rate-limits.ts, ADMISSION_UNFLUSHED). No money depends on a count.
 *
 * Why: a chat's admission was one statement of three rows with RETURNING, and its tokens another at the
 * capture; held here they cost a map lookup each, and the rows one upsert per window every 50 ms. Chats per
 * second at 16 connections 7,343 -> 8,103 in a `bench:ab` (bench/HISTORY.md, forty-first round).
 */
import { innerMap } from '../objects.ts';
import type { StatementRunner } from './internal.ts';
import { writeBehind } from './write-behind.ts';

/** A window's count: its row's `used` plus what this process counted since (`unwritten`, then `writing`). */
export type HeldCount = {
  readonly bucket: string;
  readonly start: number;
  /** When the window ends (epoch ms): an ended window is let go once its row has its count. */
  readonly endMs: number;
  used: number;
  /** Counted here, not yet in a write (negative when more was taken back than counted since the last). */
  unwritten: number;
  /** In a write not yet committed. */
  writing: number;
};

/** A window asked for: its bucket, start and end. */
export type HeldWindow = { bucket: string; start: number; resetAtMs: number };

export type HeldCountsOptions = {
  /**
   * The window's `used` in its row (0 without one), with `runner` when given: a caller inside a transaction
   * reads on it (the connection is that transaction's until it ends).
   */
  read(bucket: string, start: number, runner?: StatementRunner): Promise<number>;
  /** Adds `cost` (negative: takes some back) to the window's row (creating it) with `runner`. */
  write(runner: StatementRunner, bucket: string, start: number, cost: number): Promise<unknown>;
  /** Runs a flush's writes as one short write (Database.write). */
  commit(fn: (runner: StatementRunner) => Promise<void>): Promise<void>;
  now(): number;
  /** How long a count waits for its row (default FLUSH_MS). */
  flushMs?: number;
  /** Windows held at most; past it, those whose rows have their counts are let go (default CAPACITY). */
  capacity?: number;
};

/** How long a count waits for its row: at most the counts a crash can lose. */
export const FLUSH_MS = 50;
/** Windows held at most (about 150 bytes each). */
export const CAPACITY = 100_000;
/** How often ended windows are looked for. */
const SWEEP_MS = 1_000;

export type HeldCounts = ReturnType<typeof createHeldCounts>;

export function createHeldCounts(options: HeldCountsOptions) {
  const flushMs = options.flushMs ?? FLUSH_MS;
  const capacity = options.capacity ?? CAPACITY;
  // By bucket, then by window start: a lookup makes no key string and, given the same bucket string as before
  // (the rate limiter's are made once per caller and model), hashes nothing (V8 keeps a string's hash).
  const held = new Map<string, Map<number, HeldCount>>();
  /** Windows held (over every bucket). */
  let size = 0;
  const dirty = new Set<HeldCount>();
  let sweptAt = options.now();

  const find = (bucket: string, start: number) => held.get(bucket)?.get(start);
  function keep(count: HeldCount) {
    innerMap(held, count.bucket).set(count.start, count);
    size++;
  }

  // Not zero either way: a count taken back (`add` of a negative cost) is written too.
  const pending = (count: HeldCount) => count.unwritten !== 0 || count.writing !== 0;

  /**
   * Lets go of the windows that ended, and past the capacity those of the buckets held longest, whose rows
   * have their counts: a window let go is read from its row again. Only here, in a timer's turn: a read of a
   * row and the window's count made from it happen in one turn (promises only), so no window is let go
   * between them.
   */
  function sweep(at: number) {
    let over = size - capacity;
    if (over <= 0 && at - sweptAt < SWEEP_MS) return;
    sweptAt = at;
    for (const [bucket, windows] of held) {
      for (const [start, count] of windows) {
        if (pending(count)) continue;
        if (count.endMs <= at || over > 0) {
          windows.delete(start);
          size--;
          over--;
        }
      }
      if (windows.size === 0) held.delete(bucket);
    }
  }

  /** A flush's batch: the windows with counts to write, and each one's amount. */
  type Batch = { counts: HeldCount[]; amounts: number[] };

  // Every count not yet written, one upsert per window, in one short write.
  const behind = writeBehind<Batch>({
    flushMs,
    take() {
      sweep(options.now());
      // A window whose counts were all taken back before a write has nothing to write.
      const counts: HeldCount[] = [];
      for (const count of dirty) if (count.unwritten !== 0) counts.push(count);
      dirty.clear();
      if (counts.length === 0) return undefined;
      const amounts = counts.map((count) => {
        const amount = count.unwritten;
        count.unwritten = 0;
        count.writing += amount;
        return amount;
      });
      return { counts, amounts };
    },
    write: ({ counts, amounts }) =>
      options.commit(async (runner) => {
        for (let i = 0; i < counts.length; i++) {
          const count = counts[i] as HeldCount;
          await options.write(runner, count.bucket, count.start, amounts[i] as number);
        }
      }),
    written({ counts, amounts }) {
      for (let i = 0; i < counts.length; i++) (counts[i] as HeldCount).writing -= amounts[i] as number;
    },
    failed({ counts, amounts }) {
      // Not written: counted still, and tried again with the next flush.
      for (let i = 0; i < counts.length; i++) {
        const count = counts[i] as HeldCount;
        count.writing -= amounts[i] as number;
        count.unwritten += amounts[i] as number;
        dirty.add(count);
      }
    },
  });

  /** The windows' counts, in their order, when all are held (the usual case: no promise). */
  function lookup(windows: readonly HeldWindow[]): HeldCount[] | undefined {
    const found: HeldCount[] = [];
    for (const window of windows) {
      const count = find(window.bucket, window.start);
      if (!count) return undefined;
      found.push(count);
    }
    return found;
  }

  return {
    lookup,

    /**
     * The windows' counts, in their order; a window not held is read from its row (with `runner`: see
     * `read`) and held from then on. Each count stays held until the caller's turn ends: check and count them
     * without awaiting anything between.
     */
    async counts(windows: readonly HeldWindow[], runner?: StatementRunner): Promise<HeldCount[]> {
      for (;;) {
        const found = lookup(windows);
        if (found) return found;
        const missing = windows.find((window) => !find(window.bucket, window.start)) as HeldWindow;
        const used = await options.read(missing.bucket, missing.start, runner);
        // Another request may have read it meanwhile (and counted in it): that one stays.
        if (!find(missing.bucket, missing.start))
          keep({
            bucket: missing.bucket,
            start: missing.start,
            endMs: missing.resetAtMs,
            used,
            unwritten: 0,
            writing: 0,
          });
      }
    },

    /**
     * Counts `cost` in the window (from `counts`), to be written with the next flush; a negative cost takes
     * back a count (rate-limits.ts `takeBack`), written the same way.
     */
    add(count: HeldCount, cost: number) {
      if (cost === 0) return;
      count.used += cost;
      count.unwritten += cost;
      dirty.add(count);
      behind.schedule();
    },

    /** Writes every count not yet written; resolves once committed. */
    flush: behind.flush,

    /** Writes what is held, and stops writing by itself (the database is closing). */
    close: behind.close,

    /** Windows held (for tests). */
    size: () => size,
  };
}
