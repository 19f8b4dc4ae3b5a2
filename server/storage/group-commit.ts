/**
 * Group commit for SQLite: the write transactions that are waiting while one runs are run after it inside the
 * same database transaction, each in its own savepoint (opened before its first statement that may write: one
 * that only reads has nothing to undo), and committed together. On this engine a commit is
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
 * An `eager` transaction (one a request waits on before its work, such as its reservation) skips that wait
 * when no group of more than one transaction has run for QUIET_MS: with nobody else writing, the turn would
 * group it with nothing, and a lone client would wait it on every request (about 15 µs on the path,
 * bench/HISTORY.md, sixteenth round). Whether others write is read from the groups themselves, not from a
 * count of requests in flight: under load a request is usually the only one in flight when it reserves (the
 * others of its poll phase are not parsed yet), while the captures answered together keep sharing groups.
 *
 * `shared()` tells the same (a group of more than one ran in the last QUIET_MS) to the short writes that run
 * outside groups (Database.write): while it holds, those asked for with JOIN_SHARED join the next group
 * instead of committing alone.
 *
 * With nothing waiting, a transaction is exactly BEGIN IMMEDIATE, its statements, COMMIT: no savepoint is
 * opened for the first function of a group. PostgreSQL does not need this (a pool of connections commits in
 * parallel) and does not use it.
 *
 * When other processes write the same file all the time (`WORKERS` > 1: CreateDatabaseOptions.sharedWriters),
 * a group takes SQLite's write lock through a `WriteLock`: BEGIN IMMEDIATE tried without SQLite's busy handler
 * and, while another connection holds the lock, tried again on a later turn of the event loop (beginWhenFree).
 * SQLite's handler would sleep (1, 2, 5, 10 ms ...) with the event loop stopped, and every request of the
 * process with it: two workers on one file served a quarter fewer chats than one process, at a p99 of 21 ms
 * (bench/HISTORY.md, fortieth round).
 *
 * Every group runs its functions with one transaction object, made once (`reusable`), on the connection as
 * Kysely hands it out (its driver's lock held for the group, so Kysely's other statements wait), with BEGIN,
 * COMMIT and ROLLBACK as plain statements. Kysely's own `transaction().execute` makes a builder, two executors,
 * a connection provider and a `Transaction` for every transaction, several of them from spread literals that
 * V8 gives a hidden class of their own in its old generation (bench/HISTORY.md, thirteenth and fourteenth
 * rounds). Outside a group the object's statements are refused, as Kysely refuses a finished transaction's.
 */
// From node:perf_hooks and node:timers, not the globals: fake timers in tests replace the globals.
import { performance } from 'node:perf_hooks';
import { setImmediate, setTimeout } from 'node:timers';
import type {
  Compilable,
  CompiledQuery,
  ConnectionProvider,
  DatabaseConnection,
  Kysely,
  QueryResult,
  Transaction,
} from 'kysely';

/** How a transaction is asked for. */
export type TransactionOptions = {
  /**
   * Its caller waits on it before the work it was asked for can go on (a request's reservation). On SQLite it
   * starts at once when the groups have been quiet (see above); PostgreSQL has no wait to skip.
   */
  eager?: boolean;
};

export type TransactionRunner<DB> = <T>(
  fn: (trx: Transaction<DB>) => Promise<T>,
  options?: TransactionOptions,
) => Promise<T>;

/** Asked for by a request that waits on it: `eager` (TransactionOptions). */
export const EAGER: TransactionOptions = Object.freeze({ eager: true });

/** For how long after a group of more than one transaction the eager ones still wait their turn (ms). */
export const QUIET_MS = 50;

/** The group-committing runner, and whether a group is scheduled or running (a write asked for now joins one). */
export type GroupCommitting<DB> = {
  transaction: TransactionRunner<DB>;
  busy(): boolean;
  /** Whether a group of more than one transaction ran in the last QUIET_MS (others are writing). */
  shared(): boolean;
};

/**
 * Runs a statement of the group's own (BEGIN IMMEDIATE, COMMIT, ROLLBACK, `savepoint x`, `release savepoint x`,
 * `rollback to savepoint x`) on the one connection, synchronously, reported to `onQuery` as `reportedAs` when
 * given. Only called while a group holds that connection, between two statements of its functions: nothing
 * else can be running on it.
 */
export type RawStatement = (text: string, reportedAs?: string) => void;

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
 * Makes the transaction object every group uses: a `Transaction` whose statements go through `provider`
 * (database.ts builds it on the database's own executor).
 */
export type ReusableTransaction<DB> = (provider: ConnectionProvider) => Transaction<DB>;

/** Raised by a statement of the groups' transaction object run while no group holds the connection. */
export class TransactionEndedError extends Error {
  constructor() {
    super('The transaction has ended: its statements run only inside it');
  }
}

/**
 * Whether `text` certainly writes nothing: a plain SELECT (SQLite has no SELECT that writes; this schema defines
 * no function that does). Anything else (INSERT, UPDATE, DELETE, a WITH, a pragma, a raw statement) counts
 * as a write, which costs at worst a savepoint opened for nothing.
 */
function onlyReads(text: string): boolean {
  return /^\s*select\b/i.test(text);
}

/**
 * The groups' transaction: its statements run on the connection a group holds, and only while one does. Its
 * `executeQuery` (what compiledOnce's hot statements call) runs the statement straight on that connection
 * (directRunner); the statements of query builders go through Kysely's executor to the same connection.
 *
 * A function's savepoint is opened before its first statement that may write (`savepoint`, set by
 * `inSavepoint`), not before the function: one that only reads (a reservation held in memory, which checks the
 * account and writes nothing) needs nothing undone, and costs the group no SAVEPOINT and RELEASE.
 */
function groupsTransaction<DB>(
  reusable: ReusableTransaction<DB>,
  executeQuery: ReturnType<typeof directRunner>['executeQuery'] | undefined,
  raw: RawStatement,
) {
  const state = {
    connection: undefined as DatabaseConnection | undefined,
    trx: undefined as unknown as Transaction<DB>,
    /** The savepoint of the running function, to open before its first write; undefined once opened. */
    savepoint: undefined as string | undefined,
  };
  /**
   * Why a statement cannot run now: the group has ended, or the running function's savepoint, opened before
   * its first statement that may write, could not be; undefined when it can run.
   */
  const refusal = (text: string): unknown => {
    if (!state.connection) return new TransactionEndedError();
    const name = state.savepoint;
    if (name === undefined || onlyReads(text)) return undefined;
    try {
      raw(`savepoint ${name}`);
    } catch (error) {
      return error;
    }
    state.savepoint = undefined;
    return undefined;
  };
  // The connection as the group's statements see it: each statement after the savepoint it may need.
  const connection: DatabaseConnection = {
    executeQuery(query) {
      const refused = refusal(query.sql);
      if (refused !== undefined) return Promise.reject(refused);
      return (state.connection as DatabaseConnection).executeQuery(query);
    },
    streamQuery(query, chunkSize) {
      const refused = refusal(query.sql);
      if (refused !== undefined) throw refused;
      return (state.connection as DatabaseConnection).streamQuery(query, chunkSize);
    },
  };
  const provider: ConnectionProvider = {
    provideConnection(consumer) {
      return state.connection ? consumer(connection) : Promise.reject(new TransactionEndedError());
    },
  };
  state.trx = reusable(provider);
  if (executeQuery) {
    Object.defineProperty(state.trx, 'executeQuery', {
      value: <R>(query: CompiledQuery<R> | Compilable<R>) => {
        const compiled = 'compile' in query ? query.compile() : query;
        const refused = refusal(compiled.sql);
        return refused === undefined ? executeQuery(compiled) : Promise.reject(refused);
      },
    });
  }
  return state;
}

type GroupsTransaction<DB> = ReturnType<typeof groupsTransaction<DB>>;

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

/**
 * How a group takes SQLite's write lock when other processes write the file (see above). `tryBegin` runs
 * BEGIN IMMEDIATE with SQLite's busy handler off: undefined once it began, SQLite's SQLITE_BUSY error while
 * another connection holds the lock (any other error is thrown). After `timeoutMs` of trying, a group fails
 * with that error, as the busy handler's own timeout would.
 */
export type WriteLock = {
  tryBegin(): Error | undefined;
  timeoutMs: number;
};

/**
 * For how long (ms) a group tries for a held write lock on every turn of the event loop before it waits a
 * timer's millisecond between tries. Another process's group holds the lock for a fraction of a millisecond,
 * and the turns in between serve this process's requests; a millisecond's timer after a few tries left a
 * quarter of the machine idle and two workers 25% slower (bench/HISTORY.md, fortieth round). A lock held for
 * longer (the operator CLI's transaction) is not worth a CPU kept turning.
 */
export const WRITE_LOCK_SPIN_MS = 2;

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));
const nextMillisecond = () => new Promise<void>((resolve) => setTimeout(resolve, 1));

/** BEGIN IMMEDIATE through `lock`, tried again on later turns of the event loop while the lock is held. */
export async function beginWhenFree(lock: WriteLock): Promise<void> {
  const start = performance.now();
  for (;;) {
    const busy = lock.tryBegin();
    if (busy === undefined) return;
    const waited = performance.now() - start;
    if (waited >= lock.timeoutMs) throw busy;
    await (waited < WRITE_LOCK_SPIN_MS ? nextTurn() : nextMillisecond());
  }
}

/** How many transactions one group holds at most, so that a waiting plain statement is not held for long. */
export const GROUP_COMMIT_MAX = 16;

export function groupCommitting<DB>(
  db: Kysely<DB>,
  raw: RawStatement,
  reusable: ReusableTransaction<DB>,
  maxGroup = GROUP_COMMIT_MAX,
  direct?: DirectStatement,
  lock?: WriteLock,
): GroupCommitting<DB> {
  const executor = db.getExecutor();
  // Made by the first group, used by every group.
  let shared: GroupsTransaction<DB> | undefined;
  const queue: Waiting<DB>[] = [];
  let draining = false;
  // Until when the eager transactions still wait their turn: QUIET_MS after the last shared group.
  let sharedUntil = 0;

  /**
   * Runs `next` in a savepoint of the open transaction, opened before its first statement that may write
   * (groupsTransaction); its result, or undefined when it failed (its writes undone).
   */
  async function inSavepoint(group: GroupsTransaction<DB>, next: Waiting<DB>, name: string) {
    group.savepoint = name;
    let result: unknown;
    try {
      result = await next.fn(group.trx);
    } catch (error) {
      const opened = group.savepoint === undefined;
      group.savepoint = undefined;
      next.reject(error);
      // Undo only this function's writes; should that be impossible the group cannot be trusted.
      if (opened) {
        raw(`rollback to savepoint ${name}`);
        raw(`release savepoint ${name}`);
      }
      return undefined;
    }
    const opened = group.savepoint === undefined;
    group.savepoint = undefined;
    if (opened) {
      try {
        raw(`release savepoint ${name}`);
      } catch (error) {
        next.reject(error);
        throw error;
      }
    }
    return completed(next, result);
  }

  async function runGroup(): Promise<void> {
    const first = queue.shift() as Waiting<DB>;
    const done: Done<DB>[] = [];
    let began = false;
    // How many functions this group ran: more than one, and the eager transactions wait their turn a while.
    let members = 1;
    try {
      await executor.provideConnection(async (connection) => {
        shared ??= groupsTransaction(reusable, direct && directRunner(direct).executeQuery, raw);
        const group = shared;
        // Reported as `begin`, as Kysely's driver reports a transaction's start on either engine.
        if (lock) await beginWhenFree(lock);
        else raw('begin immediate', 'begin');
        began = true;
        group.connection = connection;
        try {
          try {
            done.push(completed(first, await first.fn(group.trx)));
          } catch (error) {
            // The first function is alone in the transaction: undoing it is the plain rollback.
            first.reject(error);
            throw error;
          }
          while (queue.length > 0 && done.length < maxGroup) {
            members++;
            const item = await inSavepoint(group, queue.shift() as Waiting<DB>, `group_${done.length}`);
            if (item) done.push(item);
          }
          raw('commit');
        } catch (error) {
          // As Kysely does after a failed function or COMMIT; a transaction SQLite already ended has nothing
          // to roll back, and the error that ended it is the one reported.
          try {
            raw('rollback');
          } catch {}
          throw error;
        } finally {
          group.connection = undefined;
          if (members > 1) sharedUntil = performance.now() + QUIET_MS;
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

  /** Whether a group of more than one ran in the last QUIET_MS: eager transactions and JOIN_SHARED writes wait. */
  const groupsShared = () => performance.now() < sharedUntil;
  // The first transaction asked for while nothing runs schedules the group; those asked for until it starts
  // (or while it runs) join it or the next one.
  let scheduled = false;
  // Nothing drains while a group is scheduled: `transaction` schedules only when no drain runs.
  const start = () => {
    scheduled = false;
    void drain();
  };
  return {
    transaction: <T>(fn: (trx: Transaction<DB>) => Promise<T>, options?: TransactionOptions) =>
      new Promise<T>((resolve, reject) => {
        queue.push({ fn, resolve: resolve as (value: unknown) => void, reject });
        if (draining || scheduled) return;
        scheduled = true;
        if (options?.eager && !groupsShared()) queueMicrotask(start);
        else setImmediate(start);
      }),
    busy: () => draining || scheduled,
    shared: groupsShared,
  };
}
