/**
 * SQLite with other processes writing the same file (`WORKERS` > 1, database.ts `sharedWriters`): a commit
 * group waits for the write lock on the event loop instead of in SQLite's busy handler, which sleeps with the
 * event loop stopped (group-commit.ts, WriteLock). The lock's other holder here is a second connection in this
 * process, as another worker's would be: it can only let go while this process's event loop turns, so a wait
 * in the busy handler would end in SQLITE_BUSY where the event-loop wait ends in a commit. Then the real
 * thing: `WORKERS=2` on one SQLite file, chats from both workers, the ledger exact.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Sqlite from 'better-sqlite3';
import { sql } from 'kysely';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { loadCatalog } from '../../server/catalog/load.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { beginWhenFree, type WriteLock } from '../../server/storage/group-commit.ts';
import { awayFromMinuteEdge } from '../support/clock.ts';
import { checkSettledInvariants } from '../support/invariants.ts';
import { startServerProcess, stopServerProcesses } from '../support/server-process.ts';

const scratch = mkdtempSync(join(tmpdir(), 'svc-shared-writers-'));
const file = join(scratch, 'db.sqlite');
const statements: string[] = [];
let database: Database;
/** Another connection to the file: the other process's writer, and a reader of what is committed. */
let other: Sqlite.Database;

beforeAll(async () => {
  database = await createDatabase(`sqlite:${file}`, {
    sharedWriters: true,
    busyTimeoutMs: 2_000,
    onQuery: (text) => statements.push(text),
  });
  await sql`create table items (n integer primary key, label text not null)`.execute(database.db);
  other = new Sqlite(file, { timeout: 0 });
});

afterAll(async () => {
  other?.close();
  await database?.close();
  await stopServerProcesses();
  rmSync(scratch, { recursive: true, force: true });
});

beforeEach(async () => {
  if (other.inTransaction) other.exec('rollback');
  await sql`delete from items`.execute(database.db);
  statements.length = 0;
});

const labels = () =>
  (other.prepare('select label from items order by n').all() as { label: string }[]).map((r) => r.label);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const append = (label: string) =>
  database.transaction(async (trx) => {
    const { rows } = await sql<{ count: bigint }>`select count(*) as count from items`.execute(trx);
    const n = Number(rows[0]?.count ?? 0);
    await sql`insert into items (n, label) values (${n}, ${label})`.execute(trx);
    return n;
  });

describe('SQLite write lock held by another connection (sharedWriters)', () => {
  test('behavior: a group waits for the lock on the event loop, joined by what is asked for meanwhile, and commits once it is let go', async () => {
    other.exec('begin immediate');
    other.prepare("insert into items (n, label) values (0, 'other')").run();
    let settled = false;
    const first = append('first').finally(() => {
      settled = true;
    });
    // The event loop turns while the group waits: timers fire, and the other writer is still in its transaction.
    await sleep(30);
    expect(settled).toBe(false);
    const second = append('second');
    await sleep(5);
    other.exec('commit');
    // Serial order after the other writer's commit: its row first, then the group's two, in one commit.
    expect(await Promise.all([first, second])).toEqual([1, 2]);
    expect(labels()).toEqual(['other', 'first', 'second']);
    expect(statements.filter((s) => s === 'begin')).toHaveLength(1);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
  });

  test('behavior: a short write waits in a group too, never in the busy handler', async () => {
    other.exec('begin immediate');
    const written = database.write((runner) =>
      runner.executeQuery(sql`insert into items (n, label) values (${7}, ${'short'})`.compile(database.db)),
    );
    await sleep(30);
    expect(labels()).toEqual([]);
    other.exec('commit');
    await written;
    expect(labels()).toEqual(['short']);
    expect(statements).toEqual(['begin', 'insert into items (n, label) values (?, ?)', 'commit']);
  });

  test('behavior: without another writer, a lone transaction is still BEGIN, its statements, COMMIT', async () => {
    expect(await append('alone')).toBe(0);
    expect(statements.filter((s) => s === 'begin' || s === 'commit' || s.startsWith('savepoint'))).toEqual([
      'begin',
      'commit',
    ]);
    // The busy handler is back on for every other statement.
    expect((await sql<{ timeout: bigint }>`pragma busy_timeout`.execute(database.db)).rows[0]?.timeout).toBe(
      2_000n,
    );
  });

  test('behavior: after the timeout the group fails with SQLITE_BUSY, leaving nothing; the event loop ran all along and the next group commits', async () => {
    const short = await createDatabase(`sqlite:${file}`, { sharedWriters: true, busyTimeoutMs: 300 });
    try {
      other.exec('begin immediate');
      const order: string[] = [];
      const timer = sleep(10).then(() => order.push('timer'));
      const refused = await short
        .transaction(async (trx) => {
          await sql`insert into items (n, label) values (${1}, ${'lost'})`.execute(trx);
        })
        .then(
          () => undefined,
          (error: { code?: string }) => {
            order.push('refused');
            return error;
          },
        );
      await timer;
      expect(refused?.code).toBe('SQLITE_BUSY');
      // The timer fell due during the wait: a wait in SQLite's handler would have held it back.
      expect(order).toEqual(['timer', 'refused']);
      other.exec('commit');
      expect(labels()).toEqual([]);
      await short.transaction(async (trx) => {
        await sql`insert into items (n, label) values (${2}, ${'kept'})`.execute(trx);
      });
      expect(labels()).toEqual(['kept']);
    } finally {
      if (other.inTransaction) other.exec('rollback');
      await short.close();
    }
  });
});

describe('beginWhenFree', () => {
  test('behavior: tries again on later turns of the event loop until it begins', async () => {
    let tries = 0;
    const busy = Object.assign(new Error('database is locked'), { code: 'SQLITE_BUSY' });
    const lock: WriteLock = { timeoutMs: 5_000, tryBegin: () => (++tries < 7 ? busy : undefined) };
    await beginWhenFree(lock);
    expect(tries).toBe(7);
  });

  test('behavior: the last SQLITE_BUSY is thrown once the timeout has passed', async () => {
    const busy = Object.assign(new Error('database is locked'), { code: 'SQLITE_BUSY' });
    let tries = 0;
    await expect(
      beginWhenFree({
        timeoutMs: 20,
        tryBegin: () => {
          tries++;
          return busy;
        },
      }),
    ).rejects.toBe(busy);
    expect(tries).toBeGreaterThan(1);
  });
});

describe('WORKERS=2 on one SQLite file', () => {
  test('behavior: chats from both workers, the key held to its requests a minute across them, every chat billed, the ledger exact', {
    timeout: 120_000,
  }, async () => {
    const model = 'llama-3.3-70b';
    const perMinute = loadCatalog().models.get(model)?.rateLimits.paid?.requestsPerMinute ?? 0;
    expect(perMinute).toBeGreaterThan(0);
    const url = `sqlite:${join(scratch, 'cluster.db')}`;
    const server = await startServerProcess(
      { DATABASE_URL: url, WORKERS: '2', BOOTSTRAP_BALANCE_USD: '50' },
      { listening: 2 },
    );
    const key = [...server.output().matchAll(/ADMIN_API_KEY=(svc_admin_\w+)/g)].map((m) => m[1])[0] ?? '';
    const chat = () =>
      fetch(`${server.base}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 16 }),
      }).then(async (r) => ({ status: r.status, body: await r.text() }));
    // Five waves of 24 at once: both workers write the file at the same moments, all in one clock minute (the
    // window the limit counts in; waves across a minute's turn would be admitted in both).
    await awayFromMinuteEdge();
    const answers: Array<{ status: number; body: string }> = [];
    for (let wave = 0; wave < 5; wave++)
      answers.push(...(await Promise.all(Array.from({ length: 24 }, chat))));
    const refused = answers.filter((a) => a.status !== 200);
    // The minute's count is one row both workers update: exactly the limit went through, whichever worker.
    expect(answers.length - refused.length).toBe(perMinute);
    for (const r of refused) {
      expect(r.status).toBe(429);
      expect(JSON.parse(r.body)).toMatchObject({ code: 'RATE_LIMIT_EXCEEDED' });
    }
    const report = await checkSettledInvariants(url);
    expect(report.violations).toEqual([]);
    expect(report.reservations.captured).toBe(perMinute);
    await server.waitForLog(
      (lines) => lines.filter((l) => l.msg === 'request').length >= answers.length,
      10_000,
    );
    const served = new Set(
      server
        .logs()
        .filter((l) => l.msg === 'request')
        .map((l) => l.pid),
    );
    expect(served).toEqual(new Set(server.workerPids()));
  });
});
