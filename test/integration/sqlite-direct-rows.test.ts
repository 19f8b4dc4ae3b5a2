/**
 * The statements run straight on the SQLite connection (the hot statements, a commit group's transaction)
 * read their rows as arrays and make the objects themselves (server/storage/database.ts `directStatements`,
 * `rowFunction`). Each answer must be the one better-sqlite3's own rows give through Kysely: the same keys in
 * the same order, the same values and types, for any column name, and after another connection changed the
 * schema under a `select *`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Sqlite from 'better-sqlite3';
import { type CompiledQuery, sql } from 'kysely';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createDatabase, type Database, rowFunction } from '../../server/storage/database.ts';

const scratch = mkdtempSync(join(tmpdir(), 'svc-direct-rows-'));
const file = join(scratch, 'db.sqlite');
let database: Database;

beforeAll(async () => {
  database = await createDatabase(`sqlite:${file}`);
  await sql`create table things (id integer primary key, label text, amount integer, ratio real, data blob)`.execute(
    database.db,
  );
  await sql`insert into things values (1, 'one', 9007199254740993, 0.5, x'00ff'), (2, null, null, null, null)`.execute(
    database.db,
  );
});

afterAll(async () => {
  await database?.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** The rows of `query` run straight on the connection: alone, and in a commit group's transaction. */
async function direct(query: CompiledQuery) {
  const alone = await database.write((runner) => runner.executeQuery(query));
  const grouped = await database.transaction((trx) => trx.executeQuery(query));
  expect(grouped.rows).toEqual(alone.rows);
  return alone.rows as Record<string, unknown>[];
}

/** Equal, key order and prototype included. */
function expectSameRows(actual: Record<string, unknown>[], expected: Record<string, unknown>[]) {
  expect(actual).toStrictEqual(expected);
  expect(actual.map((row) => Object.keys(row))).toEqual(expected.map((row) => Object.keys(row)));
  expect(actual.map((row) => Object.getPrototypeOf(row))).toEqual(
    expected.map((row) => Object.getPrototypeOf(row)),
  );
}

test('behavior: a reader answers straight on the connection with the rows Kysely gives (names, order, bigint, null, real, blob)', async () => {
  const queries = [
    sql`select * from things order by id`,
    sql`select label, id, amount as "the amount", data from things order by id desc`,
    sql`select 1 as x, 2 as x, 'c' as constructor, 3 as "__proto__", 4 as "1st", 5 as "$ok"`,
    sql`select id from things where id > 99`,
  ].map((q) => q.compile(database.db));
  for (const query of queries) {
    const viaKysely = (await database.db.executeQuery(query)).rows as Record<string, unknown>[];
    expectSameRows(await direct(query), viaKysely);
  }
  const [row] = await direct(sql`select * from things where id = 1`.compile(database.db));
  expect(row).toEqual({
    id: 1n,
    label: 'one',
    amount: 9007199254740993n,
    ratio: 0.5,
    data: Buffer.from([0, 255]),
  });
});

test('behavior: a RETURNING statement runs once and answers its rows as objects', async () => {
  const insert =
    sql`insert into things (id, label, amount) values (${10}, ${'ten'}, ${10n}) returning id, label as "the label"`.compile(
      database.db,
    );
  expect(await database.write((runner) => runner.executeQuery(insert))).toMatchObject({
    rows: [{ id: 10n, 'the label': 'ten' }],
  });
  const count = sql<{ n: bigint }>`select count(*) as n from things where id = 10`.compile(database.db);
  expect((await database.db.executeQuery(count)).rows).toEqual([{ n: 1n }]);
  await sql`delete from things where id = 10`.execute(database.db);
});

test("behavior: a statement straight on the connection binds its values as Kysely's driver does (text, bigint, real, null, blob; writer and reader)", async () => {
  // Bound as arguments, not as one array (better-sqlite3 reads an array one element at a time through V8's API).
  const values = ['x\u00e9\u{1f600}', 9007199254740993n, -0.25, null, Buffer.from([1, 0, 254])] as const;
  const insert =
    sql`insert into things (id, label, amount, ratio, data) values (${20}, ${values[0]}, ${values[1]}, ${values[2]}, ${values[4]}), (${21}, ${values[3]}, ${values[3]}, ${values[3]}, ${values[3]})`.compile(
      database.db,
    );
  expect(await database.write((runner) => runner.executeQuery(insert))).toMatchObject({
    numAffectedRows: 2n,
  });
  const read = sql`select id, label, amount, ratio, data from things
    where (id = ${20} and label = ${values[0]} and amount = ${values[1]} and ratio = ${values[2]} and data = ${values[4]})
       or (id = ${21} and label is ${values[3]}) order by id`.compile(database.db);
  const expected = [
    { id: 20n, label: values[0], amount: values[1], ratio: values[2], data: values[4] },
    { id: 21n, label: null, amount: null, ratio: null, data: null },
  ];
  expectSameRows(await direct(read), expected);
  expectSameRows((await database.db.executeQuery(read)).rows as Record<string, unknown>[], expected);
  await sql`delete from things where id in (20, 21)`.execute(database.db);
});

test('behavior: a `select *` read straight on the connection sees a column another connection added', async () => {
  const all = sql`select * from things where id = 1`.compile(database.db);
  expect(Object.keys((await direct(all))[0] ?? {})).toEqual(['id', 'label', 'amount', 'ratio', 'data']);
  const other = new Sqlite(file);
  try {
    other.exec(`alter table things add column note text not null default 'added'`);
  } finally {
    other.close();
  }
  expectSameRows(await direct(all), (await database.db.executeQuery(all)).rows as Record<string, unknown>[]);
  expect((await direct(all))[0]).toMatchObject({ id: 1n, data: Buffer.from([0, 255]), note: 'added' });
});

test('behavior: rowFunction makes the object better-sqlite3 makes for the same names and values', () => {
  const sqlite = new Sqlite(':memory:');
  try {
    for (const names of [
      ['a', 'b'],
      ['a', 'a'],
      ['a b', 'c'],
      ['__proto__'],
      ['__proto__', '__proto__'],
      ['toString', 'hasOwnProperty'],
      [],
    ]) {
      const values = names.map((_, i) => `v${i}`);
      const columns = names.map((name, i) => `'v${i}' as "${name}"`).join(', ');
      const expected = sqlite.prepare(`select ${columns || '1 as one'}`).get() as Record<string, unknown>;
      if (names.length === 0) {
        expect(rowFunction([])([])).toStrictEqual({});
        continue;
      }
      const made = rowFunction(names)(values) as Record<string, unknown>;
      expect(made).toStrictEqual(expected);
      expect(Object.keys(made)).toEqual(Object.keys(expected));
      expect(Object.getPrototypeOf(made)).toBe(Object.getPrototypeOf(expected));
    }
  } finally {
    sqlite.close();
  }
});
