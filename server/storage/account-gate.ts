/**
 * PostgreSQL: how many of this process's statements that lock one account's row may be at PostgreSQL at once
 * (a hold's and a capture's one round trip, `ledger.ts`), and the statements that wait for a place sent
 * together. Each such statement holds the row until its commit has flushed the WAL, so one account's
 * statements go through one at a time whatever the number sent; the ones sent beyond what can follow at once
 * only wait inside PostgreSQL, where each waiter costs the database CPU (its lock wait, its wake-up, the
 * re-check of the row it waited for). Measured on the twenty-fifth round's VM (bench/HISTORY.md; one server, 16
 * connections on one key, a pool of 10): PostgreSQL's CPU per chat 2.0 to 2.4 ms with every request's
 * statement sent at once, 1.2 to 1.4 ms with at most 3 of them, and the chats per second 320 to 448 against
 * 480 to 590; at most 1 made the database's CPU the same but the rate lower (289 to 307: the next statement
 * leaves only once the last one's answer is back), at most 2 or 4 were in between. Statements of different
 * accounts never wait for each other here.
 *
 * What waits here holds no connection and no lock: the gate is taken before the statement's connection, and
 * given to the next waiter, in arrival order, when the statement settles (answered or failed).
 *
 * **Batches** (with a `BatchRunner`, thirtieth round): when a place frees and several of the account's
 * statements are waiting, up to BATCH_MAX of them go together, in arrival order, as one transaction on one
 * connection, committed once. One account's commits cannot share a WAL flush otherwise (each holds the row
 * until its own flush), so its requests went one flush at a time; a batch pays one flush for all of them. Each
 * statement sees the ones before it, as it would have after their commits. A statement alone (nothing
 * waiting) still runs at once on its own, as before. Should any statement of a batch fail, nothing of the
 * batch is kept (`BatchUndone`) and each statement is then run again on its own, in the same order, each
 * caller getting its own answer or error; should the commit itself fail, every caller of the batch gets that
 * error, as a lone statement's caller would. Only statements marked `batchable` go together: one statement
 * run on the executor given, letting every database error through (a function that caught one would leave
 * PostgreSQL's transaction aborted, and its COMMIT would only roll it back: `database.ts` turns such a COMMIT
 * into an error), and nothing on another connection (it would wait for the row the batch holds, and the
 * batch for it). The others run alone, in their turn.
 */

/** The default of `DATABASE_ACCOUNT_CONCURRENCY`. */
export const ACCOUNT_CONCURRENCY = 3;

/** At most how many waiting statements of one account go together in one transaction. */
export const BATCH_MAX = 8;

/** Raised by `BatchRunner.together` when a statement failed: the transaction was rolled back, nothing kept. */
export class BatchUndone extends Error {
  constructor(cause: unknown) {
    super('A statement of the batch failed; the batch was rolled back', { cause });
  }
}

/** Where the gate's statements run: `alone` on its own, or `together` in one transaction. */
export type BatchRunner<Q> = {
  /** The executor of a statement run on its own (its own implicit transaction). */
  alone: Q;
  /**
   * Runs `fns` in order, each given the transaction's executor, in one transaction committed once; their
   * results in order. Throws BatchUndone (rolled back) when one of them throws, or the commit's own error.
   */
  together<R>(fns: Array<(q: Q) => Promise<R>>): Promise<R[]>;
};

/**
 * Runs `fn` once fewer than the limit of `accountId`'s statements are running; settles as `fn` does. `fn` is
 * given where to run its statement (BatchRunner); a `batchable` one (see above) may go with others, and may
 * then be called twice (a batch undone, then alone).
 */
export type AccountGate<Q> = <T>(
  accountId: string,
  fn: (q: Q) => Promise<T>,
  batchable?: boolean,
) => Promise<T>;

type Waiter<Q> = {
  fn: (q: Q) => Promise<unknown>;
  batchable: boolean;
  resolve(value: unknown): void;
  reject(error: unknown): void;
};

type Lane<Q> = { running: number; waiting: Array<Waiter<Q>> };

/**
 * A gate of `limit` statements per account (a positive whole number), run on `runner.alone`, and the waiting
 * ones batched with `runner.together` when it is given.
 */
export function createAccountGate<Q>(
  limit: number,
  runner: { alone: Q; together?: BatchRunner<Q>['together'] },
  batchMax = BATCH_MAX,
): AccountGate<Q> {
  if (!Number.isSafeInteger(limit) || limit < 1) throw new RangeError('limit must be a positive integer');
  const lanes = new Map<string, Lane<Q>>();
  const together = runner.together;

  async function runAlone(waiter: Waiter<Q>) {
    try {
      waiter.resolve(await waiter.fn(runner.alone));
    } catch (error) {
      waiter.reject(error);
    }
  }

  async function run(waiters: Array<Waiter<Q>>) {
    if (waiters.length === 1 || !together) {
      for (const waiter of waiters) await runAlone(waiter);
      return;
    }
    let results: unknown[];
    try {
      results = await together(waiters.map((waiter) => waiter.fn));
    } catch (error) {
      if (error instanceof BatchUndone) {
        // Nothing of the batch was kept: each statement again, on its own, in the same order.
        for (const waiter of waiters) await runAlone(waiter);
      } else {
        for (const waiter of waiters) waiter.reject(error);
      }
      return;
    }
    waiters.forEach((waiter, i) => {
      waiter.resolve(results[i]);
    });
  }

  /** The waiters that go next: the first, and the batchable ones after a batchable first. */
  function next(lane: Lane<Q>): Array<Waiter<Q>> {
    let count = 1;
    if (together && lane.waiting[0]?.batchable) {
      while (count < batchMax && lane.waiting[count]?.batchable) count++;
    }
    return lane.waiting.splice(0, count);
  }

  /** Starts what the lane has room for: a lone waiter at once, the waiters of a freed place together. */
  function pump(accountId: string, lane: Lane<Q>) {
    while (lane.running < limit && lane.waiting.length > 0) {
      const waiters = next(lane);
      lane.running++;
      void run(waiters).finally(() => {
        lane.running--;
        if (lane.running === 0 && lane.waiting.length === 0) lanes.delete(accountId);
        else pump(accountId, lane);
      });
    }
  }

  return <T>(accountId: string, fn: (q: Q) => Promise<T>, batchable = false) =>
    new Promise<T>((resolve, reject) => {
      let lane = lanes.get(accountId);
      if (!lane) {
        lane = { running: 0, waiting: [] };
        lanes.set(accountId, lane);
      }
      lane.waiting.push({ fn, batchable, resolve: resolve as (value: unknown) => void, reject });
      pump(accountId, lane);
    });
}
