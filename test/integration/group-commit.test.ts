/**
 * Group commit on SQLite (server/storage/group-commit.ts), on a real database file: transactions that wait
 * while one runs are committed together, yet each caller sees serial execution, its own result or error, and
 * a settled promise only once its writes are committed (checked from a second connection to the file).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Sqlite from 'better-sqlite3';
import { sql, type Transaction } from 'kysely';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import {
  createDatabase,
  type Database,
  JOIN_SHARED,
  type WriteOptions,
} from '../../server/storage/database.ts';
import { EAGER, QUIET_MS, TransactionEndedError } from '../../server/storage/group-commit.ts';

const scratch = mkdtempSync(join(tmpdir(), 'svc-group-commit-'));
const file = join(scratch, 'db.sqlite');
let database: Database;
const statements: string[] = [];
/** A second connection to the same file: it sees only what is committed. */
let reader: Sqlite.Database;

beforeAll(async () => {
  database = await createDatabase(`sqlite:${file}`, { onQuery: (text) => statements.push(text) });
  await sql`create table items (n integer primary key, label text not null)`.execute(database.db);
  reader = new Sqlite(file, { readonly: true });
});

afterAll(async () => {
  reader?.close();
  await database?.close();
  rmSync(scratch, { recursive: true, force: true });
});

beforeEach(async () => {
  await sql`delete from items`.execute(database.db);
  statements.length = 0;
});

const committedLabels = () =>
  (reader.prepare('select label from items order by n').all() as { label: string }[]).map((r) => r.label);

/** A transaction that reads the count and inserts the next number: serial execution numbers them 0..n-1. */
const appendOne = (label: string, options?: typeof EAGER) =>
  database.transaction(async (trx) => {
    const { rows } = await sql<{ count: bigint }>`select count(*) as count from items`.execute(trx);
    const n = Number(rows[0]?.count ?? 0);
    await sql`insert into items (n, label) values (${n}, ${label})`.execute(trx);
    return n;
  }, options);

/** What settles first: what `start` asks for, or a callback queued for the event loop's next check phase. */
async function settlesFirst(start: () => Promise<unknown>) {
  const order: string[] = [];
  const turn = new Promise<void>((resolve) =>
    setImmediate(() => {
      order.push('turn');
      resolve();
    }),
  );
  await Promise.all([start().then(() => order.push('committed')), turn]);
  return order[0];
}

/** What settles first: `appendOne(label, options)` or the next check phase's callback. */
const beforeTheTurn = (label: string, options?: typeof EAGER) =>
  settlesFirst(() => appendOne(label, options));

const quiet = () => new Promise((resolve) => setTimeout(resolve, QUIET_MS + 20));

describe('group commit (SQLite)', () => {
  test('behavior: concurrent transactions run serially, commit in fewer groups, and settle once committed', async () => {
    const seenAtSettle: string[][] = [];
    const results = await Promise.all(
      Array.from({ length: 24 }, (_, i) =>
        appendOne(`t${i}`).then((n) => {
          // When a caller hears back, its write is visible to another connection: it is committed.
          seenAtSettle[i] = committedLabels();
          return n;
        }),
      ),
    );
    expect([...results].sort((a, b) => a - b)).toEqual(Array.from({ length: 24 }, (_, i) => i));
    expect(committedLabels()).toHaveLength(24);
    results.forEach((_, i) => {
      expect(seenAtSettle[i]).toContain(`t${i}`);
    });
    const commits = statements.filter((s) => s === 'commit').length;
    const begins = statements.filter((s) => s === 'begin').length;
    expect(begins).toBe(commits);
    expect(commits).toBeGreaterThan(0);
    expect(commits).toBeLessThan(24);
  });

  test('behavior: transactions asked for by separate callbacks of one event-loop turn commit as one group', async () => {
    // Two callbacks queued together run in the same phase of one turn, one after the other (each followed by
    // its microtasks), as two requests read in the same poll phase do. A group that started at once would
    // have committed the first before the second callback ran. (Immediates, not two `setTimeout(0)`: each
    // timer reads the clock when it is made, so the second can fall due a millisecond later, in another turn.)
    const pending: Promise<number>[] = [];
    await new Promise<void>((resolve) => {
      setImmediate(() => pending.push(appendOne('first')));
      setImmediate(() => {
        pending.push(appendOne('second'));
        resolve();
      });
    });
    expect(await Promise.all(pending)).toEqual([0, 1]);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
    expect(statements.filter((s) => s.startsWith('savepoint'))).toHaveLength(1);
    expect(committedLabels()).toEqual(['first', 'second']);
  });

  const insert = (n: number, label: string, options?: WriteOptions) =>
    database.write(
      (runner) =>
        runner.executeQuery(sql`insert into items (n, label) values (${n}, ${label})`.compile(database.db)),
      options,
    );

  test('behavior: a write runs at once on its own when no group is under way, and joins the group when one is', async () => {
    await insert(0, 'alone');
    expect(statements).toEqual(['insert into items (n, label) values (?, ?)']);

    statements.length = 0;
    const grouped = appendOne('first');
    await insert(2, 'joined');
    expect(await grouped).toBe(1);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
    expect(statements.filter((s) => s.startsWith('savepoint'))).toHaveLength(1);
    expect(committedLabels()).toEqual(['alone', 'first', 'joined']);
  });

  test('behavior: after a shared group, a JOIN_SHARED write waits its turn and shares the next group (until the groups have been quiet); a plain one still runs alone', async () => {
    await quiet();
    // Two callbacks of one turn: one group of two.
    await new Promise<void>((resolve) => {
      setImmediate(() => void appendOne('first'));
      setImmediate(() => void appendOne('second').then(() => resolve()));
    });
    statements.length = 0;
    // Others are writing: the write is not run alone at once, but in the next check phase's group.
    expect(await settlesFirst(() => insert(2, 'write, busy', JOIN_SHARED))).toBe('turn');
    expect(statements).toEqual(['begin', 'insert into items (n, label) values (?, ?)', 'commit']);
    // A write and a transaction asked for in the same turn share one commit.
    statements.length = 0;
    await Promise.all([insert(3, 'write', JOIN_SHARED), appendOne('transaction')]);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
    // Without the option, the same write runs at once on its own.
    statements.length = 0;
    await insert(5, 'plain write, busy');
    expect(statements).toEqual(['insert into items (n, label) values (?, ?)']);
    await quiet();
    statements.length = 0;
    await insert(6, 'write, quiet', JOIN_SHARED);
    expect(statements).toEqual(['insert into items (n, label) values (?, ?)']);
    expect(committedLabels()).toEqual([
      'first',
      'second',
      'write, busy',
      'write',
      'transaction',
      'plain write, busy',
      'write, quiet',
    ]);
  });

  test('behavior: an eager transaction starts at once while no group has been shared; a plain one waits its turn', async () => {
    await quiet();
    expect(await beforeTheTurn('eager', EAGER)).toBe('committed');
    expect(await beforeTheTurn('plain')).toBe('turn');
    expect(await beforeTheTurn('eager again', EAGER)).toBe('committed');
    // Alone, each is BEGIN IMMEDIATE, its statements, COMMIT.
    expect(statements.filter((s) => s === 'commit')).toHaveLength(3);
    expect(statements.filter((s) => s.startsWith('savepoint'))).toHaveLength(0);
    expect(committedLabels()).toEqual(['eager', 'plain', 'eager again']);
  });

  test('behavior: after a shared group, eager transactions wait their turn (and group) until the groups have been quiet', async () => {
    await quiet();
    // Two callbacks of one turn: one group of two.
    await new Promise<void>((resolve) => {
      setImmediate(() => void appendOne('first'));
      setImmediate(() => void appendOne('second').then(() => resolve()));
    });
    expect(await beforeTheTurn('eager, busy', EAGER)).toBe('turn');
    // Two eager ones asked for by two callbacks of one turn while busy: they still share a group. (Immediates,
    // as above: two `setTimeout(0)` can fall in two turns.)
    statements.length = 0;
    const pending: Promise<number>[] = [];
    await new Promise<void>((resolve) => {
      setImmediate(() => pending.push(appendOne('eager 1', EAGER)));
      setImmediate(() => {
        pending.push(appendOne('eager 2', EAGER));
        resolve();
      });
    });
    expect(await Promise.all(pending)).toEqual([3, 4]);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
    await quiet();
    expect(await beforeTheTurn('eager, quiet', EAGER)).toBe('committed');
    expect(committedLabels()).toEqual([
      'first',
      'second',
      'eager, busy',
      'eager 1',
      'eager 2',
      'eager, quiet',
    ]);
  });

  test('behavior: what is asked for while an eager transaction runs joins its group, in order', async () => {
    await quiet();
    const eager = appendOne('eager', EAGER);
    const plain = appendOne('plain');
    const write = database.write((runner) =>
      runner.executeQuery(sql`insert into items (n, label) values (${2}, ${'write'})`.compile(database.db)),
    );
    expect(await Promise.all([eager, plain])).toEqual([0, 1]);
    await write;
    expect(statements.filter((s) => s === 'begin')).toHaveLength(1);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
    expect(committedLabels()).toEqual(['eager', 'plain', 'write']);
  });

  test("behavior: compiled statements, run straight on the connection (in a group and alone), answer as Kysely does; a failing one rejects with SQLite's error and is undone alone", async () => {
    const insert = (n: number, label: string) =>
      sql`insert into items (n, label) values (${n}, ${label})`.compile(database.db);
    const select = sql<{ n: bigint; label: string }>`select n, label from items order by n`.compile(
      database.db,
    );
    // Kysely's own answers for the same statements, for comparison.
    const viaKysely = await database.db.executeQuery(insert(1, 'kysely'));
    const kyselyRefusal = await database.db.executeQuery(insert(1, 'again')).then(
      () => undefined,
      (error: { code?: string }) => error,
    );
    expect(kyselyRefusal).toMatchObject({ code: 'SQLITE_CONSTRAINT_PRIMARYKEY' });

    const alone = await database.write((runner) => runner.executeQuery(insert(2, 'alone')));
    expect(alone).toEqual({ ...viaKysely, insertId: 2n });
    const [grouped, refused, after] = await Promise.allSettled([
      database.transaction(async (trx) => {
        const inserted = await trx.executeQuery(insert(3, 'grouped'));
        return { inserted, rows: (await trx.executeQuery(select)).rows };
      }),
      database.transaction((trx) => trx.executeQuery(insert(3, 'duplicate'))),
      database.write((runner) => runner.executeQuery(insert(4, 'after'))),
    ]);
    expect(grouped).toEqual({
      status: 'fulfilled',
      value: {
        inserted: { ...viaKysely, insertId: 3n },
        rows: [
          { n: 1n, label: 'kysely' },
          { n: 2n, label: 'alone' },
          { n: 3n, label: 'grouped' },
        ],
      },
    });
    expect(refused).toMatchObject({ status: 'rejected', reason: { code: kyselyRefusal?.code } });
    expect(after).toMatchObject({ status: 'fulfilled', value: { ...viaKysely, insertId: 4n } });
    expect(committedLabels()).toEqual(['kysely', 'alone', 'grouped', 'after']);
    expect(statements.filter((s) => s === 'commit')).toHaveLength(1);
  });

  test('behavior: a lone transaction is just BEGIN IMMEDIATE, its statements, COMMIT (no savepoint)', async () => {
    await appendOne('alone');
    expect(statements).toEqual([
      'begin',
      'select count(*) as count from items',
      'insert into items (n, label) values (?, ?)',
      'commit',
    ]);
  });

  test('behavior: a failing transaction inside a group leaves nothing and fails alone; the others commit', async () => {
    const failing = () =>
      database.transaction(async (trx) => {
        await sql`insert into items (n, label) values (${1000}, ${'doomed'})`.execute(trx);
        throw new Error('refused by the caller');
      });
    const outcomes = await Promise.allSettled([
      appendOne('a'),
      appendOne('b'),
      failing(),
      appendOne('c'),
      appendOne('d'),
    ]);
    expect(outcomes.map((o) => o.status)).toEqual([
      'fulfilled',
      'fulfilled',
      'rejected',
      'fulfilled',
      'fulfilled',
    ]);
    expect((outcomes[2] as PromiseRejectedResult).reason.message).toBe('refused by the caller');
    expect(committedLabels()).toEqual(['a', 'b', 'c', 'd']);
    expect(statements.some((s) => s.startsWith('rollback to savepoint'))).toBe(true);
  });

  test('behavior: a member opens its savepoint before its first write: one that only reads opens none, and one that fails after reading and writing is undone alone', async () => {
    await appendOne('before');
    statements.length = 0;
    /** Reads the labels (a query builder's statement and a compiled one); writes nothing. */
    const readOnly = (fail: boolean) =>
      database.transaction(async (trx) => {
        const { rows } = await sql<{ label: string }>`select label from items order by n`.execute(trx);
        const compiled = await trx.executeQuery(
          sql<{ count: bigint }>`select count(*) as count from items`.compile(database.db),
        );
        if (fail) throw new Error('refused after reading');
        return [rows.map((r) => r.label), compiled.rows[0]?.count];
      });
    /** Reads, writes (a compiled statement), then fails: its write must not survive. */
    const writesThenFails = () =>
      database.transaction(async (trx) => {
        await sql`select count(*) from items`.execute(trx);
        await trx.executeQuery(sql`insert into items (n, label) values (${500}, ${'undone'})`.compile(trx));
        throw new Error('refused after writing');
      });
    const outcomes = await Promise.allSettled([
      appendOne('a'),
      readOnly(false),
      writesThenFails(),
      readOnly(true),
      appendOne('b'),
    ]);
    expect(outcomes.map((o) => o.status)).toEqual([
      'fulfilled',
      'fulfilled',
      'rejected',
      'rejected',
      'fulfilled',
    ]);
    // The reader saw the group's earlier write (serial order), uncommitted.
    expect((outcomes[1] as PromiseFulfilledResult<unknown>).value).toEqual([['before', 'a'], 2n]);
    expect((outcomes[2] as PromiseRejectedResult).reason.message).toBe('refused after writing');
    expect((outcomes[3] as PromiseRejectedResult).reason.message).toBe('refused after reading');
    expect(committedLabels()).toEqual(['before', 'a', 'b']);
    // One group: the first member without a savepoint (as ever); the readers without one; the writer that failed
    // opened its savepoint after its read and before its write, and rolled back to it; the last writer's too.
    expect(statements).toEqual([
      'begin',
      'select count(*) as count from items',
      'insert into items (n, label) values (?, ?)',
      'select label from items order by n',
      'select count(*) as count from items',
      'select count(*) from items',
      'savepoint group_2',
      'insert into items (n, label) values (?, ?)',
      'rollback to savepoint group_2',
      'release savepoint group_2',
      'select label from items order by n',
      'select count(*) as count from items',
      'select count(*) as count from items',
      'savepoint group_2',
      'insert into items (n, label) values (?, ?)',
      'release savepoint group_2',
      'commit',
    ]);
  });

  test('behavior: a failing first transaction is rolled back alone; those waiting behind it commit', async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const first = database.transaction(async (trx) => {
      await sql`insert into items (n, label) values (${1000}, ${'first'})`.execute(trx);
      await gate;
      throw new Error('first fails');
    });
    const behind = [appendOne('x'), appendOne('y')];
    release();
    await expect(first).rejects.toThrow('first fails');
    await expect(Promise.all(behind)).resolves.toEqual([0, 1]);
    expect(committedLabels()).toEqual(['x', 'y']);
  });

  test('behavior: every group runs with one transaction object, which refuses statements outside its group', async () => {
    const seen: Transaction<unknown>[] = [];
    await database.transaction(async (trx) => {
      seen.push(trx as Transaction<unknown>);
      await sql`insert into items (n, label) values (${0}, ${'in'})`.execute(trx);
    });
    await database.transaction(async (trx) => {
      seen.push(trx as Transaction<unknown>);
    });
    // Made once (not a builder, executors and a Transaction per transaction, as Kysely's own execute makes).
    expect(seen[1]).toBe(seen[0]);
    const kept = seen[0] as Transaction<unknown>;
    statements.length = 0;
    // A statement of a query builder, and a compiled one (what the hot statements run), after the group ended.
    await expect(sql`insert into items (n, label) values (${1}, ${'late'})`.execute(kept)).rejects.toThrow(
      TransactionEndedError,
    );
    await expect(
      kept.executeQuery(sql`insert into items (n, label) values (${2}, ${'late'})`.compile(kept)),
    ).rejects.toThrow(TransactionEndedError);
    expect(statements).toEqual([]);
    expect(committedLabels()).toEqual(['in']);
  });

  test('behavior: when the group itself breaks, every caller in it gets the error and nothing of it is kept', async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const first = database.transaction(async (trx) => {
      await sql`insert into items (n, label) values (${1}, ${'kept-if-committed'})`.execute(trx);
      await gate;
      return 'first';
    });
    // Ends the transaction under the group's feet: its savepoint cannot be released, nor the group committed.
    const breaker = database.transaction(async (trx) => {
      await sql.raw('rollback').execute(trx);
      return 'breaker';
    });
    release();
    const outcomes = await Promise.allSettled([first, breaker]);
    expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected']);
    expect(committedLabels()).toEqual([]);
    // The connection is usable afterwards.
    await expect(appendOne('after')).resolves.toBe(0);
    expect(committedLabels()).toEqual(['after']);
  });
});
