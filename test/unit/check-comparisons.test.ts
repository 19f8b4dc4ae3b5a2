/**
 * The text rewrite of migration 0023_check_comparisons (`withoutInLists`), and `oneOf`, which new tables use:
 * an IN list of three or more strings becomes comparisons, everything else stays as it was. SQLite itself
 * checks that both forms hold for the same values.
 */
import Sqlite from 'better-sqlite3';
import { DummyDriver, Kysely, SqliteAdapter, SqliteIntrospector, SqliteQueryCompiler } from 'kysely';
import { describe, expect, test } from 'vitest';
import { withoutInLists } from '../../server/storage/check-comparisons.ts';
import { oneOf } from '../../server/storage/migrations.ts';

describe('withoutInLists', () => {
  test('behavior: a check of a column against three or more strings becomes comparisons, quoted or bare column alike', () => {
    expect(
      withoutInLists(`"status" text not null check ("status" in ('held', 'captured', 'released'))`),
    ).toBe(
      `"status" text not null check (("status" = 'held' or "status" = 'captured' or "status" = 'released'))`,
    );
    expect(withoutInLists(`status text check (status in ('a','b' ,  'c', 'd'))`)).toBe(
      `status text check ((status = 'a' or status = 'b' or status = 'c' or status = 'd'))`,
    );
  });

  test('behavior: quotes inside a value stay doubled; several checks in one text are each rewritten', () => {
    expect(
      withoutInLists(`x text check (x in ('it''s', 'a, b', 'c))')), y text CHECK (y in ('1', '2', '3'))`),
    ).toBe(
      `x text check ((x = 'it''s' or x = 'a, b' or x = 'c))')), y text check ((y = '1' or y = '2' or y = '3'))`,
    );
  });

  test('behavior: short lists, numbers, subqueries, `not in` and lists inside larger checks stay as they are', () => {
    for (const text of [
      `check ("currency" in ('USD', 'DIEM'))`,
      `check (kind in ('api'))`,
      `check (pro in (0, 1, 2))`,
      `check (x in (select y from t))`,
      `check (x not in ('a', 'b', 'c'))`,
      `check (x in ('a', 'b', 'c') or y > 0)`,
      `check (case when y > 0 then x end in ('a', 'b', 'c'))`,
      `CREATE TABLE "t" ("a" text)`,
    ])
      expect(withoutInLists(text)).toBe(text);
  });

  test('behavior: both forms accept and refuse the same values, NULL included', () => {
    const db = new Sqlite(':memory:');
    try {
      const inList = `create table a (v text check (v in ('x', 'y', 'z')))`;
      db.exec(inList);
      db.exec(withoutInLists(inList).replace('table a', 'table b'));
      for (const value of ['x', 'y', 'z', 'X', 'w', '', null]) {
        const outcome = (table: string) => {
          try {
            db.prepare(`insert into ${table} (v) values (?)`).run(value);
            return 'stored';
          } catch (error) {
            return /CHECK constraint failed/.test((error as Error).message) ? 'refused' : String(error);
          }
        };
        expect(outcome('b')).toBe(outcome('a'));
      }
      expect(db.prepare('select count(*) as n from b').get()).toEqual({ n: 4 });
    } finally {
      db.close();
    }
  });
});

describe('oneOf', () => {
  test('behavior: writes what 0023 makes of the IN lists of the tables before it', () => {
    const db = new Kysely<unknown>({
      dialect: {
        createAdapter: () => new SqliteAdapter(),
        createDriver: () => new DummyDriver(),
        createIntrospector: (k) => new SqliteIntrospector(k),
        createQueryCompiler: () => new SqliteQueryCompiler(),
      },
    });
    const { sql } = oneOf('status', ['held', 'captured', 'released']).compile(db);
    expect(`check (${sql})`).toBe(withoutInLists(`check ("status" in ('held', 'captured', 'released'))`));
  });
});
