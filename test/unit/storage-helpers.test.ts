import { createHash } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, test } from 'vitest';
import { normalizeWalletAddress } from '../../server/storage/accounts.ts';
import { generateSecret, hashSecret } from '../../server/storage/api-keys.ts';
import { createDatabase, parseDatabaseUrl, redactDatabaseUrl } from '../../server/storage/database.ts';
import {
  InsufficientBalanceError,
  KeySpendLimitError,
  StorageConfigError,
  StorageError,
} from '../../server/storage/errors.ts';
import {
  compiledOnce,
  epochDayOf,
  isoDay,
  periodStartMs,
  prepared,
  preparedName,
  resolveOptions,
  timeOrderedIds,
  toBigInt,
  toNumber,
  withLiterals,
} from '../../server/storage/internal.ts';
import { migrate, storageMigrations } from '../../server/storage/migrations.ts';

describe('parseDatabaseUrl', () => {
  test('behavior: sqlite file, absolute, memory and postgres URLs', () => {
    expect(parseDatabaseUrl('sqlite::memory:')).toEqual({
      dialect: 'sqlite',
      filename: ':memory:',
      memory: true,
    });
    expect(parseDatabaseUrl('sqlite:./data/service.db')).toEqual({
      dialect: 'sqlite',
      filename: `${process.cwd()}/data/service.db`,
      memory: false,
    });
    expect(parseDatabaseUrl('sqlite:///var/lib/svc.db')).toMatchObject({ filename: '/var/lib/svc.db' });
    expect(parseDatabaseUrl('postgres://u:p@db:5432/svc')).toEqual({
      dialect: 'postgres',
      connectionString: 'postgres://u:p@db:5432/svc',
    });
    expect(parseDatabaseUrl('postgresql://db/svc').dialect).toBe('postgres');
  });

  test('behavior: anything else is a StorageConfigError that does not echo the URL', () => {
    for (const url of ['mysql://root:hunter2@db/x', 'sqlite:', '']) {
      try {
        parseDatabaseUrl(url);
        expect.unreachable(url);
      } catch (error) {
        expect(error).toBeInstanceOf(StorageConfigError);
        expect((error as StorageError).code).toBe('STORAGE_CONFIG');
        expect((error as Error).message).not.toContain('hunter2');
      }
    }
  });
});

describe('redactDatabaseUrl', () => {
  test('behavior: the password is replaced, the rest kept', () => {
    expect(redactDatabaseUrl('postgres://svc:s3cret@db.internal:5432/svc')).toBe(
      'postgres://svc:***@db.internal:5432/svc',
    );
    expect(redactDatabaseUrl('sqlite:./data/service.db')).toBe('sqlite:./data/service.db');
  });
});

describe('createDatabase', () => {
  test('behavior: a PostgreSQL pool parses INT8 as bigint without touching the global pg type table', async () => {
    const database = await createDatabase('postgres://u:p@127.0.0.1:1/none');
    try {
      expect(database.dialect).toBe('postgres');
      expect(pg.types.getTypeParser(pg.types.builtins.INT8, 'text')('42')).toBe('42');
    } finally {
      await database.close();
    }
  });

  test('behavior: SQLite in memory migrates and returns integers as bigint', async () => {
    const database = await createDatabase('sqlite::memory:');
    try {
      expect(await migrate(database)).toEqual({ applied: Object.keys(storageMigrations('sqlite')) });
      expect(await migrate(database)).toEqual({ applied: [] });
      const { rows } = await sql<{ n: unknown }>`select count(*) as n from kysely_migration`.execute(
        database.db,
      );
      expect(rows[0]?.n).toBe(BigInt(Object.keys(storageMigrations('sqlite')).length));
    } finally {
      await database.close();
    }
  });
});

describe('generateSecret', () => {
  test('behavior: prefix by type plus 44 base62 characters, different every time', () => {
    const secrets = Array.from({ length: 200 }, () => generateSecret('INFERENCE'));
    for (const secret of secrets) expect(secret).toMatch(/^svc_inference_[0-9A-Za-z]{44}$/);
    expect(new Set(secrets).size).toBe(200);
    expect(generateSecret('ADMIN')).toMatch(/^svc_admin_[0-9A-Za-z]{44}$/);
    // Every alphabet character shows up across 8800 draws (uniform sampling, no truncated alphabet).
    expect(new Set(secrets.join('').replace(/^svc_inference_/gm, '')).size).toBeGreaterThanOrEqual(62);
  });

  test('behavior: hashSecret is the lowercase hex SHA-256 of the UTF-8 text', () => {
    expect(hashSecret('abc')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    expect(hashSecret('abc')).toBe(createHash('sha256').update('abc').digest('hex'));
    // A bearer token is whatever the client sent: non-ASCII text is hashed as its UTF-8 bytes.
    expect(hashSecret('clé-€-😀')).toBe(
      createHash('sha256').update(Buffer.from('clé-€-😀', 'utf8')).digest('hex'),
    );
  });
});

describe('normalizeWalletAddress', () => {
  test('behavior: EVM addresses are lowercased, other chains keep their case', () => {
    expect(normalizeWalletAddress(' 0xABCDEF0123456789abcdef0123456789ABCDEF01 ')).toBe(
      '0xabcdef0123456789abcdef0123456789abcdef01',
    );
    expect(normalizeWalletAddress('7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV')).toBe(
      '7EcDhSYGxXyscszYEp35KHN8vvw3svAuLKTzXwCFLtV',
    );
    expect(() => normalizeWalletAddress('  ')).toThrow(StorageError);
  });
});

describe('time and number helpers', () => {
  test('behavior: the DIEM epoch changes at 00:00 UTC and limit periods start where they should', () => {
    const lastMs = Date.UTC(2026, 0, 31, 23, 59, 59, 999);
    expect(epochDayOf(lastMs + 1) - epochDayOf(lastMs)).toBe(1);
    expect(isoDay(epochDayOf(lastMs))).toBe('2026-01-31');
    expect(periodStartMs('EPOCH', lastMs)).toBe(Date.UTC(2026, 0, 31));
    expect(periodStartMs('MONTH', lastMs)).toBe(Date.UTC(2026, 0, 1));
    expect(periodStartMs('MONTH', lastMs + 1)).toBe(Date.UTC(2026, 1, 1));
    expect(periodStartMs('LIFETIME', lastMs)).toBe(0);
  });

  test('behavior: aggregates from either engine become the same bigint', () => {
    expect(toBigInt('123456789012345678901')).toBe(123456789012345678901n);
    expect(toBigInt('-5.000')).toBe(-5n);
    expect(toBigInt(null)).toBe(0n);
    expect(toBigInt(7n)).toBe(7n);
    expect(() => toBigInt('1.5')).toThrow(RangeError);
    expect(toNumber(42n)).toBe(42);
    expect(() => toNumber(2n ** 60n)).toThrow(RangeError);
  });
});

describe('errors', () => {
  test('behavior: typed errors carry a stable code and their details', () => {
    const insufficient = new InsufficientBalanceError({
      requiredNano: 5n,
      usdAvailableNano: 1n,
      diemAvailableNano: 2n,
    });
    expect(insufficient).toBeInstanceOf(StorageError);
    expect(insufficient).toMatchObject({ code: 'INSUFFICIENT_BALANCE', message: 'Insufficient balance' });
    const limit = new KeySpendLimitError({
      apiKeyId: 'k',
      currency: 'DIEM',
      period: 'EPOCH',
      limitNano: 1n,
      spentNano: 1n,
      requestedNano: 1n,
    });
    expect(limit.message).toBe('API key DIEM spend limit exceeded');
    const cause = new Error('driver');
    expect(new StorageError('STORAGE_FAILURE', 'x', { cause }).cause).toBe(cause);
  });
});

describe('timeOrderedIds', () => {
  const V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
  const msOf = (id: string) => Number.parseInt(id.replaceAll('-', '').slice(0, 12), 16);

  test('behavior: a lowercase UUID of version 7 and variant 10 whose first 48 bits are the millisecond', () => {
    const at = Date.UTC(2026, 10, 21, 16, 30, 0, 123);
    const next = timeOrderedIds(() => at);
    for (let i = 0; i < 1000; i++) {
      const id = next();
      expect(id).toMatch(V7);
      expect(msOf(id)).toBe(at);
    }
    // The repositories' default id source is this one, on their clock.
    const { randomId } = resolveOptions({ now: () => at });
    expect(randomId()).toMatch(V7);
    expect(msOf(randomId())).toBe(at);
  });

  test('behavior: strictly increasing as text, within a millisecond, across milliseconds and when the clock steps back', () => {
    const times = [5_000, 5_000, 5_000, 5_001, 5_001, 4_000, 4_000, 6_000, 6_000];
    let i = 0;
    const next = timeOrderedIds(() => times[i++ % times.length] as number);
    const ids = Array.from({ length: 50_000 }, () => next());
    const unordered = ids.findIndex((id, k) => k > 0 && (ids[k - 1] as string) >= id);
    expect(unordered).toBe(-1);
    expect(new Set(ids).size).toBe(ids.length);
    expect(msOf(ids[5] as string)).toBe(5_001);
    expect(msOf(ids[7] as string)).toBe(6_000);
  });

  test('behavior: two sources in the same millisecond do not collide, and their random tails differ', () => {
    const a = timeOrderedIds(() => 42);
    const b = timeOrderedIds(() => 42);
    const ids = new Set<string>();
    for (let i = 0; i < 20_000; i++) {
      ids.add(a());
      ids.add(b());
    }
    expect(ids.size).toBe(40_000);
    const tails = new Set([...ids].map((id) => id.slice(-12)));
    expect(tails.size).toBeGreaterThan(39_990);
  });

  test('edge: a millisecond that runs out of counter takes the next one and stays ordered', () => {
    // A span of 2^10 (the default is 2^26): the counter starts below 2^9, so the borrow comes within 2^10 ids.
    const next = timeOrderedIds(() => 1_000, 2 ** 10);
    let previous = next();
    let borrowed = false;
    for (let i = 0; i < 2 ** 10 && !borrowed; i++) {
      const id = next();
      if (id <= previous) throw new Error(`not increasing: ${previous} then ${id}`);
      if (msOf(id) === 1_001) borrowed = true;
      previous = id;
    }
    expect(borrowed).toBe(true);
    expect(previous).toMatch(V7);
    expect(() => timeOrderedIds(Date.now, 1000)).toThrow(RangeError);
  });

  test('edge: clocks out of range are clamped to valid ids', () => {
    expect(timeOrderedIds(() => -5)()).toMatch(/^00000000-0000-7/);
    expect(msOf(timeOrderedIds(() => 1.9)())).toBe(1);
    expect(timeOrderedIds(() => 2 ** 60)()).toMatch(/^ffffffff-ffff-7/);
  });
});

describe('compiledOnce', () => {
  test("behavior: compiles once, then runs the same SQL with each call's values (a value used twice too)", async () => {
    const database = await createDatabase('sqlite::memory:');
    try {
      await migrate(database);
      const { db } = database;
      let builds = 0;
      const hit = compiledOnce((bucket: string, cost: number) => {
        builds++;
        return db
          .insertInto('rate_limit_counters')
          .values({ bucket, window_start_ms: 0, used: cost })
          .onConflict((oc) =>
            oc
              .columns(['bucket', 'window_start_ms'])
              .doUpdateSet((eb) => ({ used: eb('rate_limit_counters.used', '+', cost) })),
          )
          .returning('used');
      });
      expect(await hit(db, 'a', 2)).toEqual([{ used: 2n }]);
      expect(await hit(db, 'a', 3)).toEqual([{ used: 5n }]);
      expect(await hit(db, 'b', 7)).toEqual([{ used: 7n }]);
      expect(builds).toBe(1);
    } finally {
      await database.close();
    }
  });

  test('negative: a value the builder does not turn into a parameter is refused, not silently fixed', async () => {
    const database = await createDatabase('sqlite::memory:');
    try {
      await migrate(database);
      const { db } = database;
      const ignoresItsValue = compiledOnce((_bucket: string) =>
        db.selectFrom('rate_limit_counters').select('used').where('bucket', '=', 'fixed'),
      );
      await expect(ignoresItsValue(db, 'a')).rejects.toThrow(/not compiled to a parameter/);
    } finally {
      await database.close();
    }
  });
});

describe('withLiterals', () => {
  const compiled = (text: string, parameters: unknown[]) =>
    ({ sql: text, parameters, query: undefined }) as unknown as Parameters<typeof withLiterals>[0];

  test('behavior: text, integers and null written in as literals, each placeholder once', () => {
    expect(
      withLiterals(compiled('select $1, $2, $3, $4, $10', ["it's", 5n, -7, null, 'x', 0, 0, 0, 0, '$1 \\'])),
    ).toBe("select 'it''s', 5, -7, null,  E'$1 \\\\'");
  });

  test('fault: a value that is not text, an integer or null is refused, as is a placeholder without a value', () => {
    for (const value of [1.5, true, new Date(0), undefined, Number.MAX_SAFE_INTEGER + 1]) {
      expect(() => withLiterals(compiled('select $1', [value]))).toThrow(/text, integers and null/);
    }
    expect(() => withLiterals(compiled('select $2', ['a']))).toThrow();
  });
});

describe('prepared', () => {
  const compiled = (text: string) =>
    ({ sql: text, parameters: [1], query: undefined }) as unknown as Parameters<typeof prepared>[0];

  test('behavior: a marked statement has one name for its text; compiledOnce marks its own', async () => {
    const text = 'update accounts set usd_reserved_nano = $1 where id = $2 -- prepared test';
    expect(preparedName(text)).toBeUndefined();
    expect(prepared(compiled(text)).sql).toBe(text);
    const name = preparedName(text);
    expect(name).toMatch(/^svc_[0-9a-f]{24}$/);
    prepared(compiled(text));
    expect(preparedName(text)).toBe(name);
    expect(preparedName(`${text} `)).toBeUndefined();

    const database = await createDatabase('sqlite::memory:');
    try {
      await migrate(database);
      const { db } = database;
      const read = compiledOnce((bucket: string) =>
        db.selectFrom('rate_limit_counters').select('used').where('bucket', '=', bucket),
      );
      await read(db, 'a');
      expect(
        preparedName('select "used" from "rate_limit_counters" where "bucket" = ?') ??
          preparedName('select "used" from "rate_limit_counters" where "bucket" = $1'),
      ).toMatch(/^svc_/);
    } finally {
      await database.close();
    }
  });

  test('negative: a statement that selects every column is never prepared (a later column would break its plan)', () => {
    for (const text of [
      'select * from accounts where id = $1',
      'select "accounts".* from "accounts" where "id" = $1',
    ]) {
      prepared(compiled(text));
      expect(preparedName(text)).toBeUndefined();
    }
  });
});
