/**
 * Opens the database a `DATABASE_URL` names, behind one Kysely query path:
 * - `sqlite:./data/service.db`, `sqlite:/abs/path.db` or `sqlite::memory:`: better-sqlite3 (the embedded default);
 * - `postgres://…` or `postgresql://…`: a `pg` Pool, for many server processes sharing one database.
 *
 * Both engines return money (BIGINT) as JS `bigint`: better-sqlite3 with safe integers, `pg` with a BigInt
 * parser for INT8 on this pool's own type table (the global `pg.types` stays untouched).
 */
import { mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { Worker } from 'node:worker_threads';
import SqliteDatabase from 'better-sqlite3';
import {
  CompiledQuery,
  type DatabaseConnection,
  type Driver,
  Kysely,
  type Dialect as KyselyDialect,
  PostgresDialect,
  type PostgresPool,
  type PostgresPoolClient,
  type PostgresQueryResult,
  type QueryResult,
  SqliteDialect,
  type SqliteDialectConfig,
  SqliteDriver,
  sql,
  Transaction,
} from 'kysely';
import pg from 'pg';
import { extend } from '../objects.ts';
import {
  ACCOUNT_CONCURRENCY,
  type AccountGate,
  BATCH_MAX,
  BatchUndone,
  createAccountGate,
} from './account-gate.ts';
import { StorageConfigError, StorageError } from './errors.ts';
import {
  type DirectStatement,
  directRunner,
  EAGER,
  GROUP_COMMIT_MAX,
  groupCommitting,
  type ReusableTransaction,
  type TransactionRunner,
  type WriteLock,
} from './group-commit.ts';
import { preparedName, type StatementRunner } from './internal.ts';
import type { Tables } from './schema.ts';

export type Dialect = 'sqlite' | 'postgres';

/** An open database: the Kysely instance plus what the server needs around it. */
export type Database = {
  db: Kysely<Tables>;
  dialect: Dialect;
  /** PostgreSQL: whether hot statements go as prepared statements (CreateDatabaseOptions.preparedStatements). */
  prepares: boolean;
  /** Closes the pool or file; idempotent. */
  close(): Promise<void>;
  /** Resolves when the database answers a trivial query (for `/readyz`). */
  ping(): Promise<void>;
  /**
   * Runs `fn` in a write transaction and settles once it is committed (or rolled back, with its error). On
   * SQLite the transactions waiting at the same time are committed as one group (see group-commit.ts).
   */
  transaction: TransactionRunner<Tables>;
  /**
   * Runs a short write that needs no transaction of its own (one statement, or statements each valid alone)
   * with `runner`: on SQLite in the commit group that is scheduled or running when one is (its commit is
   * shared; it waits no longer than it would for the connection), otherwise at once on its own (autocommit);
   * with `JOIN_SHARED`, also in the next group (a turn of the event loop later) while others are writing (a
   * group of more than one committed in the last QUIET_MS). On PostgreSQL always at once on the pool.
   */
  write<T>(fn: (runner: StatementRunner) => Promise<T>, options?: WriteOptions): Promise<T>;
  /**
   * SQLite only: a stamp that changes when another connection (another process: the operator CLI, another
   * worker) has committed to the file since the last read on this one (`PRAGMA data_version`, which ignores
   * this connection's own commits), and when `noteChange` was called in this process. Equal stamps mean that
   * nothing but this connection's own writes, none of them noted, happened in between. About 50 ns inside a
   * transaction, 1.5 µs outside one (it reads the WAL's index). PostgreSQL has no such counter.
   */
  changeStamp?(): string;
  /** SQLite only: a change of this process that `changeStamp` must tell (see there). */
  noteChange?(): void;
  /**
   * SQLite with one process writing the file (not CreateDatabaseOptions.sharedWriters): runs `statement`, one
   * compiled read (`compiledOnce`'s, on the runner it is given), at once and synchronously when no
   * transaction is open on the connection, and answers its rows before anything else of the process can run:
   * what it read is the file as last committed, and stays so until the caller's turn ends. Undefined when a
   * transaction is open (a commit group's writes, not yet committed, would be read), and while others write
   * (group-commit.ts, `shared`): the caller reads in a transaction of its own then. What a reservation held in
   * memory reads (held-reservations.ts).
   */
  readNow?<R>(statement: (runner: StatementRunner) => Promise<R[]>): R[] | undefined;
  /**
   * PostgreSQL, unless CreateDatabaseOptions.accountConcurrency is 0: runs a statement that locks the
   * account's row (a hold, a capture) once fewer than that many of this process's are at the database, on the
   * executor it is given: the database, or the transaction of the account's statements that waited together
   * (account-gate.ts).
   */
  forAccountRow?: AccountGate<Kysely<Tables>>;
};

/** How a short write is asked for (Database.write). */
export type WriteOptions = {
  /**
   * On SQLite, while others are writing, wait for the next commit group rather than commit alone: for a write
   * that a transaction of the same request follows anyway (an API-key request's rate-limit admission, before
   * its reservation), so that under load it shares a commit with the writes of its turn.
   */
  joinShared?: boolean;
};

/** Database.write's option for a write that shares the next group while others write (WriteOptions). */
export const JOIN_SHARED: WriteOptions = Object.freeze({ joinShared: true });

/**
 * Runs `write`, a change that decides what a hold may take (a key's spend limit, a DIEM stake), with a change
 * noted before and after it (Database.noteChange): a reservation stamped on either side of the write no
 * longer holds once it is done (ReserveResult.stamp).
 */
export async function withChangeNoted<T>(database: Database, write: () => Promise<T>): Promise<T> {
  database.noteChange?.();
  try {
    return await write();
  } finally {
    database.noteChange?.();
  }
}

export type CreateDatabaseOptions = {
  /** PostgreSQL pool size (default 10). */
  poolMax?: number;
  /** How long a SQLite writer waits for the file lock before failing (default 5000 ms). */
  busyTimeoutMs?: number;
  /**
   * SQLite: other processes write this file all the time (the server's `WORKERS` > 1). A commit group then
   * waits for the write lock on the event loop instead of in SQLite's busy handler, which sleeps with the
   * event loop stopped (group-commit.ts, WriteLock), and short writes always go in a group, so that none
   * takes the lock through that handler either. Default false: one process, whose writes never wait for the
   * lock but while the operator CLI writes.
   */
  sharedWriters?: boolean;
  /**
   * Called with the SQL of every statement sent to the database, `begin`/`commit`/`rollback` included: one
   * call is one round trip. For tests that count the round trips of an operation so that they cannot regress.
   */
  onQuery?(sql: string): void;
  /**
   * How often the SQLite checkpointer thread copies the WAL into the database file (default
   * CHECKPOINT_INTERVAL_MS; the server's `SQLITE_CHECKPOINT_INTERVAL_MS`).
   */
  checkpointIntervalMs?: number;
  /**
   * PostgreSQL: the hot statements go as prepared statements (default true; see internal.ts, `prepared` and
   * `scriptThenPrepared`). False sends every statement as text, for a connection pooler that moves sessions
   * between statements without keeping their prepared statements (PgBouncer in transaction mode before 1.21
   * or without `max_prepared_statements`): there a statement prepared on one server connection is unknown on
   * the next, and a call would fail.
   */
  preparedStatements?: boolean;
  /**
   * PostgreSQL: how many of this process's statements that lock one account's row may be at the database at
   * once (default ACCOUNT_CONCURRENCY; 0: no limit). See account-gate.ts.
   */
  accountConcurrency?: number;
  /**
   * PostgreSQL: at most how many of one account's holds and captures that waited for a place go together in
   * one transaction (default BATCH_MAX; 1: each alone). See account-gate.ts.
   */
  accountBatch?: number;
};

export type ParsedDatabaseUrl =
  | { dialect: 'sqlite'; filename: string; memory: boolean }
  | { dialect: 'postgres'; connectionString: string };

/** Parses a `DATABASE_URL`; throws StorageConfigError (without echoing credentials) when it is not usable. */
export function parseDatabaseUrl(url: string): ParsedDatabaseUrl {
  const trimmed = url.trim();
  if (trimmed.startsWith('sqlite:')) {
    let path = trimmed.slice('sqlite:'.length);
    if (path === ':memory:') return { dialect: 'sqlite', filename: ':memory:', memory: true };
    if (path === '') throw new StorageConfigError('SQLite URL has no file name');
    // `sqlite:///abs/file.db` and `sqlite://./rel.db` are accepted as well as `sqlite:./rel.db`.
    if (path.startsWith('//')) path = path.slice(2);
    return { dialect: 'sqlite', filename: resolve(path), memory: false };
  }
  if (/^postgres(ql)?:\/\//.test(trimmed)) {
    try {
      new URL(trimmed);
    } catch (cause) {
      throw new StorageConfigError('PostgreSQL URL is malformed', { cause: redactError(cause) });
    }
    return { dialect: 'postgres', connectionString: trimmed };
  }
  throw new StorageConfigError('DATABASE_URL must start with sqlite: or postgres://');
}

/** The URL with any password replaced, safe for logs and messages. */
export function redactDatabaseUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return url.replace(/\/\/([^:/@]+):[^@]*@/, '//$1:***@');
  }
}

/** A copy of a driver error whose message cannot leak credentials from a connection string; keeps `code`. */
function redactError(error: unknown): Error {
  const message = error instanceof Error ? error.message.replace(/\/\/[^@\s]*@/g, '//***@') : 'error';
  const code = (error as { code?: unknown } | null)?.code;
  return Object.assign(new Error(message), code === undefined ? {} : { code });
}

/** Opens (and for SQLite, creates) the database. Run `migrate` afterwards. */
export async function createDatabase(url: string, options: CreateDatabaseOptions = {}): Promise<Database> {
  const parsed = parseDatabaseUrl(url);
  return parsed.dialect === 'sqlite'
    ? openSqlite(parsed.filename, parsed.memory, options)
    : openPostgres(parsed.connectionString, options);
}

function openSqlite(filename: string, memory: boolean, options: CreateDatabaseOptions): Database {
  if (!memory) mkdirSync(dirname(filename), { recursive: true });
  let sqlite: SqliteDatabase.Database;
  try {
    sqlite = new SqliteDatabase(filename);
  } catch (cause) {
    throw new StorageConfigError('Cannot open the SQLite database', { cause });
  }
  sqlite.defaultSafeIntegers(true);
  if (!memory) sqlite.pragma('journal_mode = WAL');
  sqlite.pragma('foreign_keys = ON');
  const busyTimeoutMs = Math.max(0, Math.trunc(options.busyTimeoutMs ?? 5000));
  sqlite.pragma(`busy_timeout = ${busyTimeoutMs}`);
  sqlite.pragma('synchronous = NORMAL');
  // The undo journal of each member of a commit group (a savepoint) stays in memory: on disk, a group of a few
  // requests spills it to a temporary file, created, written page by page and deleted for every such group.
  sqlite.pragma('temp_store = MEMORY');
  // Checkpoints (the only fsyncs with WAL + NORMAL) run on a worker thread, off the event loop; the commit's
  // own automatic checkpoint stays only as a safety net should the worker fall far behind.
  const checkpointer = memory
    ? undefined
    : startCheckpointer(filename, options.checkpointIntervalMs ?? CHECKPOINT_INTERVAL_MS);
  if (checkpointer) sqlite.pragma(`wal_autocheckpoint = ${SAFETY_CHECKPOINT_PAGES}`);
  const cached = cachingStatements(sqlite);
  const dialect = observed(new ImmediateSqliteDialect({ database: cached }), options.onQuery);
  const db = new Kysely<Tables>({ dialect });
  // A compiled statement run as Kysely's SQLite driver runs it (same result), without its steps; a reader's
  // rows as arrays made into objects by its own row function (directStatements).
  const runDirect = directStatements(sqlite, cached);
  const direct: DirectStatement = <R>(query: CompiledQuery<R>): QueryResult<R> => {
    options.onQuery?.(query.sql);
    return runDirect(query.sql, query.parameters) as QueryResult<R>;
  };
  // A commit group's own statements (BEGIN, COMMIT, ROLLBACK, its savepoints) go straight to the connection
  // the group holds, each prepared once.
  const groupStatements = new Map<string, SqliteDatabase.Statement>();
  const raw = (text: string, reportedAs?: string) => {
    options.onQuery?.(reportedAs ?? text);
    let statement = groupStatements.get(text);
    if (!statement) {
      statement = sqlite.prepare(text);
      groupStatements.set(text, statement);
    }
    statement.run();
  };
  // The commit groups' one transaction object: the database's own executor on the connection a group holds
  // (`getExecutor` is Kysely's, marked internal; Kysely is pinned at 0.28 and group-commit.test.ts covers it).
  const reusable: ReusableTransaction<Tables> = (provider) =>
    new Transaction<Tables>({
      config: { dialect },
      dialect,
      driver: NO_DRIVER,
      executor: db.getExecutor().withConnectionProvider(provider),
    });
  const lock = options.sharedWriters ? writeLock(sqlite, busyTimeoutMs, options.onQuery) : undefined;
  const group = groupCommitting(db, raw, reusable, GROUP_COMMIT_MAX, direct, lock);
  // A short write outside a group runs straight on the connection too: no other transaction can be open on
  // it then (every write transaction is the group's), and a statement never is half-run (better-sqlite3 is
  // synchronous). With JOIN_SHARED, while others write (group.shared()), it waits for the next group instead
  // of committing alone: a loaded API-key chat's rate-limit admission then shares a commit with the
  // reservations and captures of its turn (bench/HISTORY.md, thirty-fourth round: 5 to 10% more chats a second
  // at 16 connections; a wallet's, 9% fewer, so not a wallet's).
  const runner: StatementRunner = directRunner(direct);
  // Every SQLite statement is prepared once (cachingStatements).
  // With other processes writing the file (sharedWriters), a short write is always a group's, so that it takes
  // the lock as groups do: at once (EAGER) while the groups are quiet, as the write alone would have run.
  const wrapped = wrap(db, 'sqlite', true, group.transaction, (fn, writeOptions) => {
    if (lock) return group.transaction(fn, EAGER);
    return group.busy() || (writeOptions?.joinShared === true && group.shared())
      ? group.transaction(fn)
      : fn(runner);
  });
  const dataVersion = sqlite.prepare('PRAGMA data_version').pluck().safeIntegers(false);
  let noted = 0;
  // readNow's runner: the statement runs inside `executeQuery`, synchronously, and its rows are kept for it.
  let readRows: unknown[] | undefined;
  const reading: StatementRunner = {
    executeQuery<R>(query: CompiledQuery<R>): Promise<QueryResult<R>> {
      const result = direct(query);
      readRows = result.rows;
      return Promise.resolve(result);
    },
  };
  const database = extend(wrapped, {
    changeStamp: () => `${dataVersion.get() as number}:${noted}`,
    noteChange: () => {
      noted++;
    },
    readNow: lock
      ? undefined
      : <R>(statement: (runner: StatementRunner) => Promise<R[]>): R[] | undefined => {
          // Also not while others write (a group of more than one committed in the last QUIET_MS): a loaded
          // process's reservations share their groups' turns, as before (bench/HISTORY.md, forty-third round:
          // made at once there, 8% fewer chats a second at 16 connections).
          if (sqlite.inTransaction || group.shared()) return undefined;
          readRows = undefined;
          // The rows are taken from the runner: the promise would hand them over a turn of microtasks later. A
          // statement that fails throws here, synchronously; one that could not be built rejects (told below).
          statement(reading).catch(() => undefined);
          const rows = readRows as R[] | undefined;
          readRows = undefined;
          if (!rows) throw new StorageError('STORAGE_FAILURE', 'readNow: the statement did not run at once');
          return rows;
        },
  });
  if (!checkpointer) return database;
  let closing: Promise<void> | undefined;
  return extend(database, {
    close() {
      closing ??= checkpointer.stop().then(() => database.close());
      return closing;
    },
  });
}

function openPostgres(connectionString: string, options: CreateDatabaseOptions): Database {
  const pool = new pg.Pool({
    connectionString,
    max: options.poolMax ?? 10,
    // Connections are kept once opened. pg-pool's default closes one after 10 s idle, and the next burst then
    // pays for new ones: a backend started, the password exchange, and every hot statement prepared again
    // (bench/HISTORY.md, twenty-fifth round: after 11 s idle, chats on one key 247 to 300 per second with a
    // p99 of 250 to 320 ms, against 304 to 376 and 73 to 95 ms with the connections kept). One that fails
    // (PostgreSQL restarted, the session ended by the server) is dropped from the pool as before.
    idleTimeoutMillis: 0,
    // TCP keepalive after a minute idle: a NAT or firewall between the gateway and PostgreSQL that forgets idle
    // flows would otherwise drop a kept connection silently.
    keepAlive: true,
    keepAliveInitialDelayMillis: 60_000,
    types: {
      getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
        oid === pg.types.builtins.INT8 && format !== 'binary'
          ? (value: string) => BigInt(value)
          : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
    },
  });
  // An idle client losing its connection must not crash the process; the next query reports the failure.
  pool.on('error', () => {});
  // Nor may a checked-out client that the server cuts off (a restart sends 57P01 to every session): without a
  // listener that 'error' event would crash the process. The query in flight fails and its request with it.
  pool.on('connect', (client) => {
    client.on('error', () => {});
  });
  const prepares = options.preparedStatements ?? true;
  const db = new Kysely<Tables>({
    dialect: observed(new PostgresDialect({ pool: lastResults(pool, prepares) }), options.onQuery),
  });
  const database = wrap(db, 'postgres', prepares);
  const perAccount = options.accountConcurrency ?? ACCOUNT_CONCURRENCY;
  if (perAccount === 0) return database;
  const batch = options.accountBatch ?? BATCH_MAX;
  const forAccountRow = createAccountGate<Kysely<Tables>>(
    perAccount,
    { alone: db, together: batch > 1 ? (fns) => together(db, fns) : undefined },
    batch,
  );
  return extend(database, { forAccountRow });
}

/**
 * PostgreSQL: `fns` in order, in one transaction on one connection, committed once (account-gate.ts
 * `BatchRunner.together`): BatchUndone, with nothing kept, when BEGIN or one of them fails (after a ROLLBACK)
 * or when the COMMIT rolled back; any other error of the COMMIT as it is (its outcome unknown to us).
 */
function together<R>(db: Kysely<Tables>, fns: Array<(q: Kysely<Tables>) => Promise<R>>): Promise<R[]> {
  return db.connection().execute(async (connection) => {
    const results: R[] = [];
    try {
      await sql`begin`.execute(connection);
      for (const fn of fns) results.push(await fn(connection));
    } catch (error) {
      await sql`rollback`.execute(connection).catch(() => undefined);
      throw new BatchUndone(error);
    }
    try {
      await sql`commit`.execute(connection);
    } catch (error) {
      throw error instanceof CommitRolledBack ? new BatchUndone(error) : error;
    }
    return results;
  });
}

/**
 * A COMMIT that PostgreSQL answered with ROLLBACK: the transaction had failed (a statement's error that its
 * caller caught), and nothing of it was kept. PostgreSQL reports no error for it; this pool does.
 */
export class CommitRolledBack extends Error {
  constructor() {
    super('COMMIT rolled the transaction back: a statement of it had failed');
  }
}

/**
 * The pool as Kysely sees it: a script of several statements (sent without parameters, as one simple query)
 * answers with its last statement's result, as psql shows it. pg answers such a script with one result per
 * statement, and Kysely, which reads the `rows` of one, would see none. With `named`, a hot statement goes as a
 * named (prepared) one.
 */
function lastResults(pool: pg.Pool, named: boolean): PostgresPool {
  const clients = new WeakMap<pg.PoolClient, PostgresPoolClient>();
  // pg types a query's answer as one result; a script's is an array of them.
  const last = (result: pg.QueryResult | pg.QueryResult[]) =>
    (Array.isArray(result) ? result.at(-1) : result) as PostgresQueryResult<unknown>;
  return {
    async connect() {
      const client = await pool.connect();
      let seen = clients.get(client);
      if (!seen) {
        seen = {
          query: ((text: unknown, parameters?: unknown[]) => {
            if (typeof text !== 'string') return client.query(text as pg.Submittable);
            // A hot statement of a fixed text: prepared once per connection (internal.ts, `prepared`).
            const name = named && parameters?.length ? preparedName(text) : undefined;
            return (
              name ? client.query({ name, text, values: parameters }) : client.query(text, parameters)
            ).then((result) => {
              const answer = last(result);
              // A COMMIT of a failed transaction is answered ROLLBACK, without an error: made one here.
              if (text === 'commit' && (answer as { command?: string }).command === 'ROLLBACK')
                throw new CommitRolledBack();
              return answer;
            });
          }) as PostgresPoolClient['query'],
          // pg-pool gives the client a new `release` at every checkout: looked up when called.
          release: () => client.release(),
        };
        clients.set(client, seen);
      }
      return seen;
    },
    end: () => pool.end(),
  };
}

function wrap(
  db: Kysely<Tables>,
  dialect: Dialect,
  prepares: boolean,
  transaction: TransactionRunner<Tables> = (fn) => db.transaction().execute((trx) => fn(trx)),
  write: Database['write'] = (fn) => fn(db),
): Database {
  let closing: Promise<void> | undefined;
  return {
    db,
    dialect,
    prepares,
    transaction,
    write,
    close() {
      closing ??= db.destroy();
      return closing;
    },
    async ping() {
      try {
        await sql`select 1`.execute(db);
      } catch (cause) {
        throw new StorageError('STORAGE_FAILURE', 'Database unreachable', { cause: redactError(cause) });
      }
    },
  };
}

/**
 * The write lock of a connection whose file other processes write all the time (sharedWriters): BEGIN
 * IMMEDIATE with the busy handler off for that one statement, SQLite's SQLITE_BUSY error returned instead of
 * thrown and made without a stack trace (a try costs about 2 µs instead of 6 to 8 with one; a group may try
 * several times). Reported to `onQuery` as `begin` once it began. The handler is set by `exec` each time, not
 * by a prepared PRAGMA: SQLite applies `busy_timeout` when the statement is compiled, so a prepared one sets
 * it when prepared (and re-prepared), not when run. Both `exec`s take about 0.8 µs a group.
 */
function writeLock(
  sqlite: SqliteDatabase.Database,
  timeoutMs: number,
  onQuery: ((sql: string) => void) | undefined,
): WriteLock {
  const handlerOn = `pragma busy_timeout = ${timeoutMs}`;
  const begin = sqlite.prepare('begin immediate');
  return {
    timeoutMs,
    tryBegin() {
      const stackTraceLimit = Error.stackTraceLimit;
      sqlite.exec('pragma busy_timeout = 0');
      Error.stackTraceLimit = 0;
      try {
        begin.run();
      } catch (error) {
        if ((error as { code?: unknown }).code === 'SQLITE_BUSY') return error as Error;
        throw error;
      } finally {
        Error.stackTraceLimit = stackTraceLimit;
        sqlite.exec(handlerOn);
      }
      onQuery?.('begin');
      return undefined;
    },
  };
}

/**
 * The driver the commit groups' transaction object is given (Kysely wants one): that object never opens,
 * ends or hands out connections itself; a group does, on the database's own driver.
 */
const notInTransaction = () => Promise.reject(new Error('Not available inside a transaction'));
const NO_DRIVER: Driver = {
  init: async () => {},
  acquireConnection: notInTransaction,
  beginTransaction: notInTransaction,
  commitTransaction: notInTransaction,
  rollbackTransaction: notInTransaction,
  releaseConnection: async () => {},
  destroy: async () => {},
};

/**
 * SQLite write transactions start with BEGIN IMMEDIATE: the write lock is taken up front, so a transaction
 * that reads a balance and then writes it cannot interleave with another connection's (another process's)
 * writer, and never hits the deferred-upgrade SQLITE_BUSY deadlock. In one process the Kysely driver already
 * serialises everything on its single connection. The server's write transactions are commit groups, which
 * begin theirs the same way (group-commit.ts); this driver serves a `db.transaction()` called directly.
 */
class ImmediateSqliteDriver extends SqliteDriver {
  override async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }
}

class ImmediateSqliteDialect extends SqliteDialect {
  readonly #config: SqliteDialectConfig;
  constructor(config: SqliteDialectConfig) {
    super(config);
    this.#config = config;
  }
  override createDriver(): Driver {
    return new ImmediateSqliteDriver(this.#config);
  }
}

/** WAL pages after which a commit checkpoints by itself (SQLite's default is 1000): the worker's safety net. */
export const SAFETY_CHECKPOINT_PAGES = 20_000;

/**
 * How often the checkpointer thread checkpoints, by default (ms). Small checkpoints often rather than large
 * ones seldom: a busy server writes about 100 KB of WAL per billed request (each dirty page is a frame), so
 * at 200 ms each checkpoint flushed some 25 MB at once, and the requests that waited on another process
 * meanwhile (the upstream, the client) took the machine's stall: one request at a time on the 2-CPU bench
 * VM, the chat upstream adapter's added p99 was 2.5 to 2.9 ms at 200 ms and 1.8 ms at 10 ms, the JSON-RPC
 * proxy's 1.6 to 2.2 and 1.1 to 1.4 ms, with the same p50s and chats per second (bench/HISTORY.md,
 * fourteenth round). A PASSIVE checkpoint with nothing new in the WAL does nothing, so an idle server does
 * not flush; at 4 ms the flushes began to cost chats per second. `SQLITE_CHECKPOINT_INTERVAL_MS` sets it
 * (larger on a disk where each flush is dear).
 */
export const CHECKPOINT_INTERVAL_MS = 10;

/**
 * The checkpointer thread's wait before its next look, after a look that waited `lastMs` and `found` new
 * frames in the WAL (or did not): the interval again after a look that found some, twice the last wait after
 * one that found none, at most 4 intervals (40 ms by default). A thread woken every 10 ms costs a process
 * that serves nothing about 2.5% of a vCPU on this VM (each wake-up of its halted vCPU about 120 µs of CPU,
 * the empty checkpoint itself 6 µs); a quarter of that when backed off. No further: the first look after a
 * quiet spell comes up to 4 intervals after the first write and copies all the WAL written meanwhile at once
 * (about 100 KB per billed request, see below; the fourteenth round's checkpoints 200 ms apart raised the
 * proxies' p99 by 0.5 to 0.9 ms). From then on, every interval again. Run on the thread from its source text
 * (`toString`): self-contained.
 */
export function nextCheckpointDelay(lastMs: number, found: boolean, intervalMs: number): number {
  return found ? intervalMs : Math.min(lastMs * 2, intervalMs * 4);
}

/**
 * The checkpointer thread: its own connection to the file runs `PRAGMA wal_checkpoint(PASSIVE)` every
 * `intervalMs` while the WAL grows, less often while it does not (`nextCheckpointDelay`). With WAL and
 * `synchronous = NORMAL` a commit only appends to the WAL (no fsync); the fsyncs happen when the WAL is
 * copied back into the database file, and SQLite's default does that inside the commit that crosses 1,000
 * pages, which stalls the event loop for milliseconds (p99 of a commit 8 ms, up to 100 ms on a shared disk).
 * A PASSIVE checkpoint never blocks readers or writers of other connections, and the durability is the same:
 * what a commit wrote survives a crash of the process at once, and a power loss after the next checkpoint.
 */
export function startCheckpointer(filename: string, intervalMs: number): { stop(): Promise<void> } {
  const worker = new Worker(
    `
    const { parentPort, workerData } = require('node:worker_threads');
    const Database = require(workerData.module);
    const db = new Database(workerData.filename);
    const nextDelay = ${nextCheckpointDelay.toString()};
    // What the WAL held at the last look (its frames, and how many of them are in the file): found new work
    // when it changed. An error counts as work: the next look comes at the interval.
    let seen = '';
    const checkpoint = () => {
      try {
        const { log, checkpointed } = db.pragma('wal_checkpoint(PASSIVE)')[0];
        const now = log + ':' + checkpointed;
        const found = now !== seen;
        seen = now;
        return found;
      } catch {
        return true;
      }
    };
    // Each look due \`delay\` after the last one was due (as setInterval keeps its beat), not after it ended.
    let delay = workerData.intervalMs;
    let due = performance.now() + delay;
    const tick = () => {
      delay = nextDelay(delay, checkpoint(), workerData.intervalMs);
      const now = performance.now();
      due = Math.max(due + delay, now);
      timer = setTimeout(tick, due - now);
    };
    let timer = setTimeout(tick, delay);
    parentPort.on('message', () => { clearTimeout(timer); checkpoint(); db.close(); parentPort.close(); });
    `,
    {
      eval: true,
      // Plain CommonJS, whatever flags the process runs with: inherited, `--input-type=module` made this
      // code an ES module (no `require`: the thread died at once), and `--import tsx` loaded a loader in it.
      execArgv: [],
      workerData: { module: createRequire(import.meta.url).resolve('better-sqlite3'), filename, intervalMs },
    },
  );
  worker.unref();
  // A checkpointer that cannot run leaves the safety net; the server does not depend on it.
  worker.on('error', () => {});
  // Listened to from the start: a thread that is gone before stop() (it failed to open the file, say) sends
  // its one 'exit' then, not again.
  const exited = new Promise<void>((done) => worker.once('exit', () => done()));
  let stopping: Promise<void> | undefined;
  return {
    stop() {
      if (!stopping) {
        // Kept alive while it finishes: close() is awaited.
        worker.ref();
        worker.postMessage('stop');
        setTimeout(() => void worker.terminate(), 2000).unref();
        stopping = exited;
      }
      return stopping;
    },
  };
}

/** How many prepared SQLite statements are kept (the server's distinct statements are far fewer). */
const STATEMENT_CACHE_SIZE = 1000;

/**
 * The SQLite handle Kysely sees, with each distinct SQL text prepared once: better-sqlite3 would otherwise
 * parse and plan every statement on every call. Reusing a statement is safe because Kysely runs one
 * statement at a time on its single connection; the cache is bounded (least recently prepared dropped).
 */
function cachingStatements(
  sqlite: SqliteDatabase.Database,
): SqliteDialectConfig['database'] & { prepare(sqlText: string): SqliteDatabase.Statement } {
  const statements = new Map<string, SqliteDatabase.Statement>();
  return {
    close: () => sqlite.close(),
    prepare(sqlText: string) {
      let statement = statements.get(sqlText);
      if (!statement) {
        statement = sqlite.prepare(sqlText);
        if (statements.size >= STATEMENT_CACHE_SIZE) {
          const oldest = statements.keys().next().value;
          if (oldest !== undefined) statements.delete(oldest);
        }
        statements.set(sqlText, statement);
      }
      return statement;
    },
  } as unknown as SqliteDialectConfig['database'] & { prepare(sqlText: string): SqliteDatabase.Statement };
}

/**
 * How the statements run straight on the connection (`direct`: the hot statements, a group's transaction)
 * are run, by SQL text, each made once. A writer: the cached statement's `run`, as Kysely's driver. A reader:
 * a twin of its statement that returns each row as an array (better-sqlite3's raw mode), and a function made
 * once for its columns that turns that array into the object Kysely's driver would have returned, the same
 * keys in the same order, built by one object literal. Better-sqlite3's own rows cost, per column, a lookup
 * of its name in V8's string table and a search of the object's hidden-class transitions; in `perf` that was
 * 22 µs of a sequential chat's 1.28 ms (bench/HISTORY.md, thirtieth round). Bounded as the statement cache
 * is: the texts of query builders' statements can vary.
 */
function directStatements(
  sqlite: SqliteDatabase.Database,
  cached: { prepare(sqlText: string): SqliteDatabase.Statement },
): (sqlText: string, parameters: readonly unknown[]) => QueryResult<unknown> {
  const runners = new Map<string, (parameters: readonly unknown[]) => QueryResult<unknown>>();
  const runnerOf = (sqlText: string) => {
    const statement = cached.prepare(sqlText);
    if (!statement.reader) {
      return (parameters: readonly unknown[]): QueryResult<unknown> => {
        // Spread, not the array: better-sqlite3 reads an array's elements through V8's API one `Get` at a
        // time, and binds arguments directly (same binding for these values: none is an array or a plain
        // object; a 17-value insert 1.7 -> 1.4 µs, bench/HISTORY.md, thirty-eighth round).
        const { changes, lastInsertRowid } = statement.run(...parameters);
        return { numAffectedRows: BigInt(changes), insertId: BigInt(lastInsertRowid), rows: [] };
      };
    }
    const arrays = sqlite.prepare(sqlText).raw(true);
    const describe = () => {
      const names = arrays.columns().map((column) => column.name);
      return { width: names.length, row: rowFunction(names) };
    };
    let shape = describe();
    return (parameters: readonly unknown[]): QueryResult<unknown> => {
      const rows = arrays.all(...parameters) as unknown[][];
      // SQLite prepares a statement again when the schema changed (another connection's migration): a
      // `select *` may then return other columns. A row of another width has its names read again.
      if (rows.length > 0 && (rows[0] as unknown[]).length !== shape.width) shape = describe();
      const { row } = shape;
      const objects: unknown[] = new Array(rows.length);
      for (let i = 0; i < rows.length; i++) objects[i] = row(rows[i] as unknown[]);
      return { rows: objects };
    };
  };
  return (sqlText, parameters) => {
    let runner = runners.get(sqlText);
    if (!runner) {
      runner = runnerOf(sqlText);
      if (runners.size >= STATEMENT_CACHE_SIZE) {
        const oldest = runners.keys().next().value;
        if (oldest !== undefined) runners.delete(oldest);
      }
      runners.set(sqlText, runner);
    }
    return runner(parameters);
  };
}

/** Names that an object literal takes as plain own keys. */
const PLAIN_KEY = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * What turns a row's values into the object better-sqlite3 would have made for these column names: the same
 * keys, in the same order, a repeated name keeping its last value. For plain names, one object literal
 * (`(values) => ({ name0: values[0], … })`: one hidden class, made by V8 once); otherwise (a name that is not
 * an identifier, or `__proto__`, which a literal may not name twice) the values assigned one by one, as
 * better-sqlite3 sets them.
 */
export function rowFunction(names: readonly string[]): (values: unknown[]) => object {
  if (names.every((name) => PLAIN_KEY.test(name) && name !== '__proto__')) {
    const fields = names.map((name, i) => `${name}: values[${i}]`).join(', ');
    return new Function('values', `return { ${fields} };`) as (values: unknown[]) => object;
  }
  const keys = [...names];
  return (values) => {
    const row: Record<string, unknown> = {};
    for (let i = 0; i < keys.length; i++) row[keys[i] as string] = values[i];
    return row;
  };
}

/** The dialect unchanged, or with every statement its driver sends reported to `onQuery` first. */
function observed(dialect: KyselyDialect, onQuery: ((sql: string) => void) | undefined): KyselyDialect {
  if (!onQuery) return dialect;
  const watch = (connection: DatabaseConnection): DatabaseConnection =>
    new Proxy(connection, {
      get(target, property, receiver) {
        if (property === 'executeQuery' || property === 'streamQuery') {
          const method = Reflect.get(target, property, target) as (
            query: CompiledQuery,
            ...rest: unknown[]
          ) => unknown;
          return (query: CompiledQuery, ...rest: unknown[]) => {
            onQuery(query.sql);
            return method.call(target, query, ...rest);
          };
        }
        const value = Reflect.get(target, property, receiver);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  return {
    createAdapter: () => dialect.createAdapter(),
    createIntrospector: (db) => dialect.createIntrospector(db),
    createQueryCompiler: () => dialect.createQueryCompiler(),
    createDriver() {
      const driver = dialect.createDriver();
      const originals = new WeakMap<DatabaseConnection, DatabaseConnection>();
      const unwrap = (connection: DatabaseConnection) => originals.get(connection) ?? connection;
      return {
        init: () => driver.init(),
        destroy: () => driver.destroy(),
        async acquireConnection() {
          const connection = await driver.acquireConnection();
          const wrapped = watch(connection);
          originals.set(wrapped, connection);
          return wrapped;
        },
        releaseConnection: (connection) => driver.releaseConnection(unwrap(connection)),
        beginTransaction: (connection, settings) => {
          onQuery('begin');
          return driver.beginTransaction(unwrap(connection), settings);
        },
        commitTransaction: (connection) => {
          onQuery('commit');
          return driver.commitTransaction(unwrap(connection));
        },
        rollbackTransaction: (connection) => {
          onQuery('rollback');
          return driver.rollbackTransaction(unwrap(connection));
        },
      };
    },
  };
}
