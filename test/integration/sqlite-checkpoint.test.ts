/**
 * The SQLite checkpointer thread (server/storage/database.ts): commits only append to the WAL, and a worker
 * thread copies the WAL back into the database file, so no request's commit pays for the checkpoint's fsyncs.
 * Shown from the outside: a copy of the database file alone (without its `-wal`) holds rows written through
 * the server's connection, which only a checkpoint can have put there, while the connection's own automatic
 * checkpoint is far from due.
 */
import { execFile } from 'node:child_process';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import SqliteDatabase from 'better-sqlite3';
import { sql } from 'kysely';
import pino from 'pino';
import { afterAll, expect, test } from 'vitest';
import { loadConfig } from '../../server/config.ts';
import { createServices } from '../../server/services.ts';
import {
  CHECKPOINT_INTERVAL_MS,
  createDatabase,
  nextCheckpointDelay,
} from '../../server/storage/database.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { repoRoot } from '../support/contract.ts';

const scratch = mkdtempSync(join(tmpdir(), 'checkpoint-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** The rows of `table` in a copy of the main database file, without its WAL. */
function rowsInMainFile(file: string, table = 'rate_limit_counters'): number {
  const copy = join(scratch, `copy-${Math.random().toString(36).slice(2)}.db`);
  copyFileSync(file, copy);
  const db = new SqliteDatabase(copy, { readonly: true });
  try {
    return Number((db.prepare(`select count(*) as n from ${table}`).get() as { n: number }).n);
  } catch {
    return 0; // the table itself is not checkpointed yet
  } finally {
    db.close();
  }
}

test('a worker thread checkpoints the WAL into the database file; commits leave it to that thread', async () => {
  const file = join(scratch, 'db.sqlite');
  const database = await createDatabase(`sqlite:${file}`, { checkpointIntervalMs: 20 });
  try {
    await migrate(database);
    const { rows } = await sql<{
      wal_autocheckpoint: number;
    }>`pragma wal_autocheckpoint`.execute(database.db);
    // The commit's own checkpoint stays as a safety net only: far beyond what this test writes.
    expect(Number(rows[0]?.wal_autocheckpoint)).toBeGreaterThanOrEqual(10_000);
    for (let i = 0; i < 20; i++) {
      await database.db
        .insertInto('rate_limit_counters')
        .values({ bucket: `b${i}`, window_start_ms: 0, used: 1 })
        .execute();
    }
    let found = 0;
    for (let attempt = 0; attempt < 500 && found < 20; attempt++) {
      found = rowsInMainFile(file);
      if (found < 20) await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(found).toBe(20);
  } finally {
    await database.close();
  }
});

test('while the WAL stays as it was, the thread looks half as often each time, down to one look per 4 intervals', () => {
  const waits: number[] = [];
  let wait = 10;
  for (let look = 0; look < 6; look++) {
    wait = nextCheckpointDelay(wait, false, 10);
    waits.push(wait);
  }
  expect(waits).toEqual([20, 40, 40, 40, 40, 40]);
  // A look that finds new frames brings it back to the interval.
  expect(nextCheckpointDelay(40, true, 10)).toBe(10);
  expect(nextCheckpointDelay(10, true, 10)).toBe(10);
});

test('a write after a quiet spell is checkpointed all the same, and the next ones too', async () => {
  const file = join(scratch, 'quiet.sqlite');
  const database = await createDatabase(`sqlite:${file}`, { checkpointIntervalMs: 20 });
  const inMainFile = async (count: number) => {
    let found = 0;
    for (let attempt = 0; attempt < 500 && found < count; attempt++) {
      found = rowsInMainFile(file);
      if (found < count) await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return found;
  };
  try {
    await migrate(database);
    // Quiet long enough for the thread to back off to its longest wait (80 ms).
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await database.db
      .insertInto('rate_limit_counters')
      .values({ bucket: 'a', window_start_ms: 0, used: 1 })
      .execute();
    expect(await inMainFile(1)).toBe(1);
    await database.db
      .insertInto('rate_limit_counters')
      .values({ bucket: 'b', window_start_ms: 0, used: 1 })
      .execute();
    expect(await inMainFile(2)).toBe(2);
  } finally {
    await database.close();
  }
});

test('close() stops the thread and is idempotent; an in-memory database has no WAL and no thread', async () => {
  const database = await createDatabase(`sqlite:${join(scratch, 'closing.sqlite')}`);
  await migrate(database);
  await Promise.all([database.close(), database.close()]);
  const memory = await createDatabase('sqlite::memory:');
  await migrate(memory);
  await memory.close();
});

test('close() settles when the checkpointer thread is gone already (it could not open the file)', async () => {
  const dir = join(scratch, 'vanishing');
  const database = await createDatabase(`sqlite:${join(dir, 'db.sqlite')}`);
  // The server's connection keeps its open file; the thread, starting a moment later, finds no file to open
  // and ends before close() is called. close() used to wait for an 'exit' that had already been sent.
  rmSync(dir, { recursive: true, force: true });
  await new Promise((resolve) => setTimeout(resolve, 1000));
  const closed = await Promise.race([
    database.close().then(() => 'closed'),
    new Promise((resolve) => setTimeout(() => resolve('still waiting'), 5000)),
  ]);
  expect(closed).toBe('closed');
});

test('the checkpointer thread runs in a process started with --input-type=module (as test workers are)', async () => {
  const file = join(scratch, 'esm-process.sqlite');
  const script = `
    const { createDatabase } = await import('./server/storage/database.ts');
    const { sql } = await import('kysely');
    const database = await createDatabase(process.argv[1], { checkpointIntervalMs: 20 });
    await sql\`create table t (n integer primary key)\`.execute(database.db);
    for (let i = 0; i < 20; i++) await sql\`insert into t (n) values (\${i})\`.execute(database.db);
    await new Promise((resolve) => setTimeout(resolve, 500));
    await database.close();
    console.log('closed');
  `;
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['--import', 'tsx', '--input-type=module', '-e', script, `sqlite:${file}`],
    { cwd: repoRoot, timeout: 30_000 },
  );
  expect(stdout.trim()).toBe('closed');
  // Checkpointed by the thread (the connection's own checkpoint is far from due): the rows are in the file.
  const copy = join(scratch, 'esm-copy.sqlite');
  copyFileSync(file, copy);
  const db = new SqliteDatabase(copy, { readonly: true });
  try {
    expect(Number((db.prepare('select count(*) as n from t').get() as { n: number }).n)).toBe(20);
  } finally {
    db.close();
  }
});

test('a commit group keeps the undo journals of its savepoints in memory (temp_store = MEMORY): no temporary files', async () => {
  const database = await createDatabase(`sqlite:${join(scratch, 'temp-store.sqlite')}`);
  try {
    const { rows } = await sql<{ temp_store: number | bigint }>`pragma temp_store`.execute(database.db);
    // 2 is MEMORY; the default (0) spills a group's journals past 64 KiB to a file made and deleted per group.
    expect(Number(rows[0]?.temp_store)).toBe(2);
  } finally {
    await database.close();
  }
});

test("SQLITE_CHECKPOINT_INTERVAL_MS sets the server's checkpointer; by default it checkpoints every few milliseconds", async () => {
  expect(CHECKPOINT_INTERVAL_MS).toBe(10);
  /** Accounts written through the server's services, and what the main file holds of them a while later. */
  async function accountsCheckpointed(name: string, variables: Record<string, string>, waitMs: number) {
    const file = join(scratch, `${name}.sqlite`);
    const config = loadConfig({
      NODE_ENV: 'test',
      LOG_LEVEL: 'silent',
      DATABASE_URL: `sqlite:${file}`,
      VIDEO_WORKER_ENABLED: 'false',
      ...variables,
    });
    const services = await createServices(config, pino({ level: 'silent' }));
    try {
      // Besides the bootstrap account: a known count that only a checkpoint can put in the main file.
      for (let i = 0; i < 5; i++) await services.accounts.createApiAccount({});
      const written = Number(
        (
          await services.database.db
            .selectFrom('accounts')
            .select((eb) => eb.fn.countAll().as('n'))
            .executeTakeFirstOrThrow()
        ).n,
      );
      let found = rowsInMainFile(file, 'accounts');
      for (let waited = 0; waited < waitMs && found < written; waited += 20) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        found = rowsInMainFile(file, 'accounts');
      }
      return { written, found };
    } finally {
      await services.close();
    }
  }
  // An hour: nothing reaches the main file while the server runs (its own commits' checkpoint is at 20,000 pages).
  const hourly = await accountsCheckpointed('hourly', { SQLITE_CHECKPOINT_INTERVAL_MS: '3600000' }, 300);
  expect(hourly.written).toBeGreaterThanOrEqual(5);
  expect(hourly.found).toBe(0);
  // The default: every account is in the main file soon after its commit.
  const often = await accountsCheckpointed('often', {}, 10_000);
  expect(often.found).toBe(often.written);
});
