/**
 * JSON-RPC credits held in this process, for a database that no other process counts in: SQLite served by one
 * process (`WORKERS=1`, the embedded default), as held-counts.ts holds the rate limits' counts. A caller's
 * rolling 24 hours (rpc-credits.ts) are then its minute buckets in memory with their sum, read from the rows
 * once, when the caller is first seen; a take is decided and counted at once and exactly (the process is
 * single-threaded: from the check of the sum to the count nothing else runs), a give-back likewise, and what
 * changed reaches the rows later, added up per bucket, every `flushMs` in one short write (the bucket's row and
 * its hour's, rpc-credits.ts). The database stays the record: a caller not held is read from its rows first, a
 * change is held until its rows have it, and `flush` writes everything before the database closes.
 *
 * What a crash of the process can lose is the changes of its last `flushMs` (50 ms): after a restart those
 * calls' credits are not in the window. The same stance as the rate limits' counts; no money depends on a
 * credit count (the ledger's reservation and capture are written as ever).
 *
 * A held window never goes back in time: a take whose clock reads a minute before the latest one it was
 * counted at is counted at that latest minute, so that the window never needs a bucket it has already let go.
 *
 * Why: the proxy's credit take was two statements in the reservation's transaction (its bucket, its hour),
 * which kept every JSON-RPC call's hold in a transaction of its own; held here, the take costs a map lookup
 * and the hold is made in memory as a chat's (ledger.ts `holdNow`; bench/HISTORY.md, fifty-first round).
 */
import type { StatementRunner } from './internal.ts';
import { writeBehind } from './write-behind.ts';

/** A caller's window as held: every bucket of the span ending with `current`, oldest first, and their sum. */
export type HeldWindow = {
  readonly subject: string;
  /** Credits by minute bucket (its start, epoch ms), in ascending order. */
  readonly buckets: Map<number, number>;
  /** The sum of `buckets`. */
  total: number;
  /** The latest minute a take was counted at: every bucket from `current - spanMs` on is in `buckets`. */
  current: number;
  /** Changes made here and not yet in a write, by bucket (negative: more given back than taken since). */
  readonly unwritten: Map<number, number>;
  /** Writes of this window's changes not yet committed. */
  writing: number;
  /** When it was last used (for letting idle windows go). */
  usedAt: number;
};

export type HeldCreditsOptions = {
  /** The subject's buckets from `oldest` on, in ascending order of their start; on `runner` when given. */
  read(
    subject: string,
    oldest: number,
    runner?: StatementRunner,
  ): Promise<Array<{ bucketMs: number; credits: number }>>;
  /** Adds `credits` (negative: gives back) to the bucket's row and its hour's, with `runner`. */
  write(runner: StatementRunner, subject: string, bucketMs: number, credits: number): Promise<unknown>;
  /** Runs a flush's writes as one short write (Database.write). */
  commit(fn: (runner: StatementRunner) => Promise<void>): Promise<void>;
  now(): number;
  /** The window's length before its latest minute: its oldest bucket starts `spanMs` before that minute's. */
  spanMs: number;
  /** How long a change waits for its rows. */
  flushMs: number;
  /** Buckets held at most, over every window; past it, idle windows whose rows have everything are let go. */
  capacity?: number;
};

/** Where a take was counted (its bucket), or why not (the window's sum, its oldest bucket). */
export type HeldTake =
  | { taken: true; bucketMs: number }
  | { taken: false; used: number; first: number | undefined };

/** Buckets held at most (about 60 bytes each: a caller busy every minute of the day holds 1,440). */
export const CAPACITY = 200_000;
/** A window not used for this long is let go once its rows have everything. */
const IDLE_MS = 10 * 60_000;
/** How often idle windows are looked for. */
const SWEEP_MS = 1_000;

export type HeldCredits = ReturnType<typeof createHeldCredits>;

export function createHeldCredits(options: HeldCreditsOptions) {
  const capacity = options.capacity ?? CAPACITY;
  const held = new Map<string, HeldWindow>();
  /** Buckets held, over every window. */
  let size = 0;
  const dirty = new Set<HeldWindow>();
  let sweptAt = options.now();

  const pending = (window: HeldWindow) => window.unwritten.size > 0 || window.writing > 0;

  const { spanMs } = options;

  /** Moves the window on to minute `current`: the buckets that left it dropped from it and from its sum. */
  function slide(window: HeldWindow, current: number) {
    window.current = current;
    const oldest = current - spanMs;
    for (const [bucketMs, credits] of window.buckets) {
      if (bucketMs >= oldest) break;
      window.buckets.delete(bucketMs);
      window.total -= credits;
      size--;
    }
  }

  /** Adds `credits` (negative: gives back) to the window's bucket, kept in ascending order, and to its writes. */
  function change(window: HeldWindow, bucketMs: number, credits: number) {
    const { buckets } = window;
    const had = buckets.get(bucketMs);
    if (had === undefined) {
      let last: number | undefined;
      for (const key of buckets.keys()) last = key;
      buckets.set(bucketMs, credits);
      size++;
      // Before a bucket already there (rows of a clock that ran ahead): put back in order.
      if (last !== undefined && last > bucketMs) {
        const sorted = [...buckets].sort((a, b) => a[0] - b[0]);
        buckets.clear();
        for (const [key, value] of sorted) buckets.set(key, value);
      }
    } else buckets.set(bucketMs, had + credits);
    window.total += credits;
    // Kept at zero too: the bucket's row is made as the rows' own take and give-back make it (its start is
    // the window's first, which says when credits free up).
    window.unwritten.set(bucketMs, (window.unwritten.get(bucketMs) ?? 0) + credits);
    dirty.add(window);
    behind.schedule();
  }

  /**
   * Lets go of the windows whose rows have everything and that were not used for IDLE_MS, and past the
   * capacity the others whose rows have everything and were not used in the last SWEEP_MS, least recently
   * used first: a window let go is read from its rows again. None read in the last SWEEP_MS (its `usedAt`
   * is its read's), so a window is not let go between its read and the take or give-back it was read for.
   */
  function sweep(at: number) {
    const over = size > capacity;
    if (!over && at - sweptAt < SWEEP_MS) return;
    sweptAt = at;
    for (const [subject, window] of held) {
      if (!pending(window) && at - window.usedAt >= IDLE_MS) letGo(subject, window);
    }
    if (size <= capacity) return;
    // Not one used in the last SWEEP_MS: a window just read may not have been used yet.
    const idle = [...held.values()]
      .filter((window) => !pending(window) && at - window.usedAt >= SWEEP_MS)
      .sort((a, b) => a.usedAt - b.usedAt);
    for (const window of idle) {
      if (size <= capacity) break;
      letGo(window.subject, window);
    }
  }

  function letGo(subject: string, window: HeldWindow) {
    held.delete(subject);
    size -= window.buckets.size;
  }

  /** A flush's batch: each window with its changes, by bucket. */
  type Batch = Array<{ window: HeldWindow; changes: Array<[number, number]> }>;

  // Every change not yet written, one per bucket, in one short write.
  const behind = writeBehind<Batch>({
    flushMs: options.flushMs,
    take() {
      sweep(options.now());
      const batch: Batch = [];
      for (const window of dirty) {
        if (window.unwritten.size === 0) continue;
        batch.push({ window, changes: [...window.unwritten] });
        window.unwritten.clear();
        window.writing++;
      }
      dirty.clear();
      return batch.length === 0 ? undefined : batch;
    },
    write: (batch) =>
      options.commit(async (runner) => {
        for (const { window, changes } of batch) {
          for (const [bucketMs, credits] of changes) {
            await options.write(runner, window.subject, bucketMs, credits);
          }
        }
      }),
    written(batch) {
      for (const { window } of batch) window.writing--;
    },
    failed(batch) {
      // Not written: held still, and tried again with the next flush.
      for (const { window, changes } of batch) {
        window.writing--;
        for (const [bucketMs, credits] of changes) {
          window.unwritten.set(bucketMs, (window.unwritten.get(bucketMs) ?? 0) + credits);
        }
        dirty.add(window);
      }
    },
  });

  /** The subject's window, when held. */
  const lookup = (subject: string): HeldWindow | undefined => held.get(subject);

  return {
    lookup,

    /**
     * The subject's window: held, or read from its rows as it stands at minute `current` (with `runner`: a
     * caller inside a transaction reads on it) and held from then on. Use it when it is given: it may be let
     * go later.
     */
    async window(subject: string, current: number, runner?: StatementRunner) {
      const found = lookup(subject);
      if (found) return found;
      const rows = await options.read(subject, current - spanMs, runner);
      // Another call may have read it meanwhile (and counted in it): that one stays.
      const again = lookup(subject);
      if (again) return again;
      const window: HeldWindow = {
        subject,
        buckets: new Map(),
        total: 0,
        current,
        unwritten: new Map(),
        writing: 0,
        usedAt: options.now(),
      };
      for (const { bucketMs, credits } of rows) {
        window.buckets.set(bucketMs, credits);
        window.total += credits;
      }
      size += window.buckets.size;
      held.set(subject, window);
      return window;
    },

    /**
     * Takes `credits` into the bucket of minute `bucketMs` if the window, moved on to that minute, stays
     * within `limit`; nothing to take is allowed as long as the window is within it. A minute before the
     * latest one the window counted at is taken as that one (see the module comment).
     */
    take(window: HeldWindow, bucketMs: number, credits: number, limit: number): HeldTake {
      window.usedAt = options.now();
      if (bucketMs > window.current) slide(window, bucketMs);
      const at = window.current;
      if (window.total + credits > limit) {
        const [first] = window.buckets.keys();
        return { taken: false, used: window.total, first };
      }
      if (credits > 0) change(window, at, credits);
      return { taken: true, bucketMs: at };
    },

    /**
     * The subject's credits in its buckets from `oldest` on, when its window is held and holds all of them
     * (`oldest` not before the window's first); undefined otherwise.
     */
    usedFrom(subject: string, oldest: number): number | undefined {
      const window = lookup(subject);
      if (!window || oldest < window.current - spanMs) return undefined;
      let used = 0;
      for (const [bucketMs, credits] of window.buckets) if (bucketMs >= oldest) used += credits;
      return used;
    },

    /**
     * Gives back `credits` taken into `bucketMs` and not spent, when the bucket still holds as much (a bucket
     * that has left the window counts no more: nothing to give back).
     */
    giveBack(window: HeldWindow, bucketMs: number, credits: number) {
      const had = window.buckets.get(bucketMs);
      if (had === undefined || had < credits || credits === 0) return;
      change(window, bucketMs, -credits);
    },

    /** Writes every change not yet written; resolves once committed. */
    flush: behind.flush,

    /** Writes what is held, and stops writing by itself (the database is closing). */
    close: behind.close,

    /** Windows and buckets held (for tests). */
    size: () => ({ windows: held.size, buckets: size }),
  };
}
