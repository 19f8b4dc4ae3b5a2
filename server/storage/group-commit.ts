/**
 * Group commit for SQLite: the write transactions that are waiting while one runs are run after it inside the
 * same database transaction, each in its own savepoint, and committed together. On this engine a commit is
 * the dear part of a small write transaction (the WAL frames of every page it dirtied, written with one
 * system call each); shared pages (the account row, the last leaf of each index) are written once per group
 * instead of once per transaction.
 *
 * What each caller sees is unchanged: its function runs alone on the single connection, after the earlier
 * ones and seeing their writes (the order of serial execution); its promise settles only once the group's
 * COMMIT is done, with its own result or error; a function that throws leaves nothing behind (its savepoint
 * is rolled back, or the whole transaction when it ran first). Should the COMMIT fail, or an error leave the
 * transaction unusable, every caller of the group gets the error and nothing of the group is kept.
 *
 * A group starts in the event loop's check phase (`setImmediate`) after the first transaction is asked for,
 * not at once: the transactions asked for by the other callbacks of the same loop turn (the other requests
 * read from their sockets in the same poll phase) join it. Without that wait nothing would ever group under
 * load: a transaction's statements all run in microtasks (better-sqlite3 is synchronous), so it is committed
 * before the next request's callback can ask for one. The wait is one turn of the event loop.
 *
 * With nothing waiting, a transaction is exactly BEGIN IMMEDIATE, its statements, COMMIT: no savepoint is
 * opened for the first function of a group. PostgreSQL does not need this (a pool of connections commits in
 * parallel) and does not use it.
 */
// From node:timers, not the global: fake timers in tests replace the global setImmediate, not this one.
import { setImmediate } from 'node:timers';
import type { Compilable, CompiledQuery, Kysely, QueryResult, Transaction } from 'kysely';

export type TransactionRunner<DB> = <T>(fn: (trx: Transaction<DB>) => Promise<T>) => Promise<T>;

/** The group-committing runner, and whether a group is scheduled or running (a write asked for now joins one). */
export type GroupCommitting<DB> = { transaction: TransactionRunner<DB>; busy(): boolean };

/**
 * Runs a savepoint statement (`savepoint x`, `release savepoint x`, `rollback to savepoint x`) on the one
 * connection, synchronously. Only called while the group's transaction holds that connection, between two
 * statements of its own: nothing else can be running on it.
 */
export type RawStatement = (text: string) => void;

/**
 * Runs a compiled statement on the one connection, synchronously, as the dialect's driver would (same text,
 * same values, same result). Only called while nothing else can hold that connection: inside the group's
 * transaction, or for a short write while no group is under way.
 */
export type DirectStatement = <R>(query: CompiledQuery<R>) => QueryResult<R>;

/**
 * `direct` as an `executeQuery`: one promise, instead of Kysely's executor, connection provider and driver
 * (on the JSON-RPC path their self time fell from 5.5% to about 2% of the process's CPU). A statement that
 * fails rejects with the database's own error, as through Kysely.
 */
export function directRunner(direct: DirectStatement) {
  return {
    executeQuery<R>(query: CompiledQuery<R> | Compilable<R>): Promise<QueryResult<R>> {
      try {
        return Promise.resolve(direct('compile' in query ? query.compile() : query));
      } catch (error) {
        return Promise.reject(error);
      }
    },
  };
}

/**
 * The group's transaction with its `executeQuery` (what compiledOnce's hot statements call) running the
 * statement straight on the connection the transaction holds (directRunner). The transaction itself (BEGIN,
 * COMMIT, its hold on the connection) and the statements of query builders stay Kysely's.
 */
function straight<DB>(
  trx: Transaction<DB>,
  executeQuery: ReturnType<typeof directRunner>['executeQuery'],
): Transaction<DB> {
  Object.defineProperty(trx, 'executeQuery', { value: executeQuery });
  return trx;
}

type Waiting<DB> = {
  fn: (trx: Transaction<DB>) => Promise<unknown>;
  resolve(value: unknown): void;
  reject(error: unknown): void;
};

type Done<DB> = Waiting<DB> & { result: unknown };

/** A waiting function with its result, as an object of one shape (not a spread: this runs per transaction). */
const completed = <DB>(item: Waiting<DB>, result: unknown): Done<DB> => ({
  fn: item.fn,
  resolve: item.resolve,
  reject: item.reject,
  result,
});

/** How many transactions one group holds at most, so that a waiting plain statement is not held for long. */
export const GROUP_COMMIT_MAX = 16;

export function groupCommitting<DB>(
  db: Kysely<DB>,
  raw: RawStatement,
  maxGroup = GROUP_COMMIT_MAX,
  direct?: DirectStatement,
): GroupCommitting<DB> {
  // Made once: every group's transaction gets the same one (straight).
  const straightQuery = direct && directRunner(direct).executeQuery;
  const queue: Waiting<DB>[] = [];
  let draining = false;

  /** Runs `next` in a savepoint of the open transaction; its result, or undefined when it failed (undone). */
  async function inSavepoint(trx: Transaction<DB>, next: Waiting<DB>, name: string) {
    try {
      raw(`savepoint ${name}`);
    } catch (error) {
      next.reject(error);
      throw error;
    }
    let result: unknown;
    try {
      result = await next.fn(trx);
    } catch (error) {
      next.reject(error);
      // Undo only this function's writes; should that be impossible the group cannot be trusted.
      raw(`rollback to savepoint ${name}`);
      raw(`release savepoint ${name}`);
      return undefined;
    }
    try {
      raw(`release savepoint ${name}`);
    } catch (error) {
      next.reject(error);
      throw error;
    }
    return completed(next, result);
  }

  async function runGroup(): Promise<void> {
    const first = queue.shift() as Waiting<DB>;
    const done: Done<DB>[] = [];
    let began = false;
    try {
      await db.transaction().execute(async (opened) => {
        began = true;
        const trx = straightQuery ? straight(opened, straightQuery) : opened;
        try {
          done.push(completed(first, await first.fn(trx)));
        } catch (error) {
          // The first function is alone in the transaction: undoing it is the plain rollback.
          first.reject(error);
          throw error;
        }
        while (queue.length > 0 && done.length < maxGroup) {
          const item = await inSavepoint(trx, queue.shift() as Waiting<DB>, `group_${done.length}`);
          if (item) done.push(item);
        }
      });
    } catch (error) {
      // BEGIN, a savepoint or the COMMIT failed (or the first function did, with `done` empty): nothing of
      // the group is kept.
      if (!began) first.reject(error);
      for (const item of done) item.reject(error);
      return;
    }
    for (const item of done) item.resolve(item.result);
  }

  async function drain(): Promise<void> {
    draining = true;
    try {
      while (queue.length > 0) await runGroup();
    } finally {
      draining = false;
    }
  }

  // The first transaction asked for while nothing runs schedules the group; those asked for until it starts
  // (or while it runs) join it or the next one.
  let scheduled = false;
  // Nothing drains while a group is scheduled: `transaction` schedules only when no drain runs.
  const start = () => {
    scheduled = false;
    void drain();
  };
  return {
    transaction: <T>(fn: (trx: Transaction<DB>) => Promise<T>) =>
      new Promise<T>((resolve, reject) => {
        queue.push({ fn, resolve: resolve as (value: unknown) => void, reject });
        if (draining || scheduled) return;
        scheduled = true;
        setImmediate(start);
      }),
    busy: () => draining || scheduled,
  };
}
