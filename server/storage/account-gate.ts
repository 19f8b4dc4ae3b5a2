/**
 * PostgreSQL: how many of this process's statements that lock one account's row may be at PostgreSQL at once
 * (a hold's and a capture's one round trip, `ledger.ts`). Each such statement holds the row until its commit
 * has flushed the WAL, so one account's statements go through one at a time whatever the number sent; the
 * ones sent beyond what can follow at once only wait inside PostgreSQL, where each waiter costs the database
 * CPU (its lock wait, its wake-up, the re-check of the row it waited for). Measured on the twenty-fifth round's
 * VM (bench/HISTORY.md; one server, 16 connections on one key, a pool of 10): PostgreSQL's CPU per chat 2.0 to
 * 2.4 ms with every request's statement sent at once, 1.2 to 1.4 ms with at most 3 of them, and the chats per
 * second 320 to 448 against 480 to 590; at most 1 made the database's CPU the same but the rate lower (289 to
 * 307: the next statement leaves only once the last one's answer is back), at most 2 or 4 were in between.
 * Statements of different accounts never wait for each other here.
 *
 * What waits here holds no connection and no lock: the gate is taken before the statement's connection, and
 * given to the next waiter, in arrival order, when the statement settles (answered or failed).
 */

/** The default of `DATABASE_ACCOUNT_CONCURRENCY`. */
export const ACCOUNT_CONCURRENCY = 3;

/** Runs `fn` once fewer than the limit of `accountId`'s statements are running; settles as `fn` does. */
export type AccountGate = <T>(accountId: string, fn: () => Promise<T>) => Promise<T>;

type Lane = { running: number; waiting: Array<() => void> };

/** A gate of `limit` statements per account (a positive whole number). */
export function createAccountGate(limit: number): AccountGate {
  if (!Number.isSafeInteger(limit) || limit < 1) throw new RangeError('limit must be a positive integer');
  const lanes = new Map<string, Lane>();
  return async (accountId, fn) => {
    let lane = lanes.get(accountId);
    if (!lane) {
      lane = { running: 0, waiting: [] };
      lanes.set(accountId, lane);
    }
    if (lane.running < limit) lane.running++;
    else {
      const queued = lane;
      await new Promise<void>((resolve) => queued.waiting.push(resolve));
    }
    try {
      return await fn();
    } finally {
      // The place goes to the next waiter as it is (still counted), or is given back.
      const next = lane.waiting.shift();
      if (next) next();
      else if (--lane.running === 0) lanes.delete(accountId);
    }
  };
}
