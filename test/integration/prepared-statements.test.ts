/**
 * PostgreSQL: the hot statements are prepared statements (named; each connection parses and plans one once):
 * a reservation's hold and a capture's one statement; the statement after the account's lock in a script is a
 * SQL-level one (`scriptThenPrepared`). They stay valid when a later migration adds a column to the tables they
 * touch (none of them selects `*`), as in a rolling upgrade where another instance migrates. With
 * `preparedStatements: false` (DATABASE_PREPARED_STATEMENTS) every statement goes as text, which a pooler that
 * loses a session's prepared statements between two calls cannot break. The pool keeps its connections, and so
 * what they prepared, while they are idle.
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, test, vi } from 'vitest';
import { loadConfig } from '../../server/config.ts';
import { createServices } from '../../server/services.ts';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { scriptThenPrepared } from '../../server/storage/internal.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

const postgres = postgresPerFile();
let database: Database;

beforeAll(async () => {
  // One connection: the prepared statements listed are those of the connection that ran the ledger's.
  database = await createDatabase(await postgres().createDatabase('prepared'), { poolMax: 1 });
  await migrate(database);
}, 120_000);

afterAll(async () => {
  await database?.close();
});

async function preparedOnTheConnection() {
  const { rows } = await sql<{ name: string; statement: string }>`
    select name, statement from pg_prepared_statements`.execute(database.db);
  return rows;
}

test('behavior: a hold and a capture run as prepared statements, with each call its own values', async () => {
  const accounts = createAccounts(database);
  const ledger = createLedger(database);
  const account = await accounts.createApiAccount({ name: 'prepared' });
  await ledger.topUp({ accountId: account.id, amountNano: 1_000_000_000n });
  for (let i = 1; i <= 3; i++) {
    const { reservation } = await ledger.reserve({
      accountId: account.id,
      amountNano: 100_000_000n,
      requestId: `prepared-${i}`,
      modelId: 'm',
      ttlMs: 60_000,
    });
    await ledger.captureWith(reservation, {
      items: [{ sku: 'output_tokens', amountNano: BigInt(i) * 1_000n }],
    });
  }
  const prepared = await preparedOnTheConnection();
  const named = (start: string) => prepared.filter((p) => p.statement.trimStart().startsWith(start));
  expect(named('with held as')).toEqual([expect.objectContaining({ name: expect.stringMatching(/^svc_/) })]);
  expect(named('with settled as')).toEqual([
    expect.objectContaining({ name: expect.stringMatching(/^svc_/) }),
  ]);
  // Each call charged its own amount.
  expect((await ledger.getBalance(account.id)).usdNano).toBe(1_000_000_000n - 6_000n);
});

test('behavior: a column added by a later migration leaves the prepared statements working', async () => {
  const accounts = createAccounts(database);
  const ledger = createLedger(database);
  const account = await accounts.createApiAccount({ name: 'migrated' });
  await ledger.topUp({ accountId: account.id, amountNano: 1_000_000_000n });
  const charge = async (requestId: string) => {
    const { reservation } = await ledger.reserve({
      accountId: account.id,
      amountNano: 100_000_000n,
      requestId,
      modelId: 'm',
      ttlMs: 60_000,
    });
    await ledger.captureWith(reservation, { items: [{ sku: 'output_tokens', amountNano: 5_000n }] });
    // The capture by id (a transaction whose statements are compiledOnce's, one reading the account's row).
    const { reservation: other } = await ledger.reserve({
      accountId: account.id,
      amountNano: 100_000_000n,
      requestId: `${requestId}-by-id`,
      modelId: 'm',
      ttlMs: 60_000,
    });
    await ledger.capture(other.id, { items: [{ sku: 'output_tokens', amountNano: 5_000n }] });
  };
  await charge('before-migration');
  for (const table of ['accounts', 'reservations', 'ledger_entries', 'api_key_spend_days'])
    await sql`alter table ${sql.table(table)} add column later_column text`.execute(database.db);
  await charge('after-migration');
  expect((await ledger.getBalance(account.id)).usdNano).toBe(1_000_000_000n - 20_000n);
  expect((await preparedOnTheConnection()).length).toBeGreaterThan(0);
});

/** A database of its own on one connection, with every statement it sends, for `use`. */
async function watchedDatabase(
  name: string,
  use: (watched: Database, sent: string[]) => Promise<void>,
  options: { preparedStatements?: boolean } = {},
) {
  const sent: string[] = [];
  const watched = await createDatabase(await postgres().createDatabase(name), {
    poolMax: 1,
    onQuery: (text) => sent.push(text),
    ...options,
  });
  try {
    await use(watched, sent);
  } finally {
    await watched.close();
  }
}

test('behavior: a script runs its last statement as a SQL-level prepared one, prepared by the first call of a connection', async () => {
  await watchedDatabase('scripts', async (watched, sent) => {
    const statement = (value: string) =>
      sql<{
        v: string;
        n: string;
      }>`select cast(${value} as text) as v, cast(${7} as bigint) + 1 as n`.compile(watched.db);
    expect(await scriptThenPrepared(watched, 'select 1', statement("it's"))).toEqual([{ v: "it's", n: 8n }]);
    // Unknown on this connection (26000, nothing written), prepared, run again.
    expect(sent).toHaveLength(3);
    expect(sent[0]).toMatch(/^select 1;\nexecute svc_[0-9a-f]+_s\('it''s', 7\)$/);
    expect(sent[1]).toMatch(/^prepare svc_[0-9a-f]+_s as select cast\(\$1 as text\)/);
    expect(sent[2]).toBe(sent[0]);
    sent.length = 0;
    expect(await scriptThenPrepared(watched, 'select 1', statement('again'))).toEqual([
      { v: 'again', n: 8n },
    ]);
    expect(sent).toHaveLength(1);
  });
});

test('fault: a statement PostgreSQL cannot prepare runs as text in the script, and answers the same', async () => {
  await watchedDatabase('scripts_text', async (watched, sent) => {
    // A parameter whose type nothing determines: PREPARE refuses it; as a literal it is text.
    const statement = sql<{ v: boolean }>`select ${'plain'} is null as v`.compile(watched.db);
    expect(await scriptThenPrepared(watched, 'select 1', statement)).toEqual([{ v: false }]);
    expect(sent.at(-1)).toBe("select 1;\nselect 'plain' is null as v");
  });
});

/** A charge on `ledger` (its hold and its capture), then what a pooler that moves sessions does between calls. */
async function chargeThenLoseStatements(watched: Database, requestId: string) {
  await migrate(watched);
  const accounts = createAccounts(watched);
  const ledger = createLedger(watched);
  const account = await accounts.createApiAccount({ name: requestId });
  await ledger.topUp({ accountId: account.id, amountNano: 1_000_000_000n });
  const charge = async (id: string) => {
    const { reservation } = await ledger.reserve({
      accountId: account.id,
      amountNano: 100_000_000n,
      requestId: id,
      modelId: 'm',
      ttlMs: 60_000,
    });
    await ledger.captureWith(reservation, { items: [{ sku: 'output_tokens', amountNano: 7_000n }] });
  };
  await charge(`${requestId}-1`);
  // The next statement reaches a server connection that does not know this session's prepared statements.
  await sql`deallocate all`.execute(watched.db);
  return { charge: () => charge(`${requestId}-2`), balance: () => ledger.getBalance(account.id) };
}

test('fault: behind a pooler that loses prepared statements between calls, the default fails and preparedStatements: false serves', async () => {
  await watchedDatabase('lost_statements', async (watched) => {
    const { charge } = await chargeThenLoseStatements(watched, 'lost');
    await expect(charge()).rejects.toThrow(/does not exist/);
  });
  await watchedDatabase(
    'as_text',
    async (watched, sent) => {
      expect(watched.prepares).toBe(false);
      const { charge, balance } = await chargeThenLoseStatements(watched, 'text');
      await charge();
      expect((await balance()).usdNano).toBe(1_000_000_000n - 14_000n);
      // A script carries its last statement as text at once: no `execute`, no `prepare`.
      const statement = sql<{ v: string }>`select cast(${'x'} as text) as v`.compile(watched.db);
      expect(await scriptThenPrepared(watched, 'select 1', statement)).toEqual([{ v: 'x' }]);
      expect(sent.at(-1)).toBe("select 1;\nselect cast('x' as text) as v");
      expect(sent.filter((text) => /^(prepare|execute) |\nexecute /.test(text))).toEqual([]);
      const { rows } = await sql`select name from pg_prepared_statements`.execute(watched.db);
      expect(rows).toEqual([]);
    },
    { preparedStatements: false },
  );
});

test("behavior: DATABASE_PREPARED_STATEMENTS=false reaches the server's database (prepared by default)", async () => {
  const url = await postgres().createDatabase('configured');
  for (const [value, prepares] of [
    [undefined, true],
    ['false', false],
  ] as const) {
    const services = await createServices(
      loadConfig({
        NODE_ENV: 'test',
        DATABASE_URL: url,
        VIDEO_WORKER_ENABLED: 'false',
        ...(value ? { DATABASE_PREPARED_STATEMENTS: value } : {}),
      }),
      pino({ level: 'silent' }),
    );
    try {
      expect(services.database.prepares).toBe(prepares);
    } finally {
      await services.close();
    }
  }
});

test('behavior: the pool keeps its connections while idle, and what they prepared', async () => {
  // pg-pool closes a connection left idle for idleTimeoutMillis (10 s unless set) with a timer: faked here.
  vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
  const kept = await createDatabase(await postgres().createDatabase('kept'), { poolMax: 2 });
  try {
    // Two connections at once, each answering with its backend's pid and its prepared statements' count.
    const backends = async () => {
      const answers = await Promise.all(
        [0, 1].map(() =>
          sql<{ pid: number; prepared: string }>`select pg_backend_pid() as pid,
            (select count(*) from pg_prepared_statements) as prepared from pg_sleep(0.05)`.execute(kept.db),
        ),
      );
      return answers.map(({ rows }) => rows[0]).sort((a, b) => (a?.pid ?? 0) - (b?.pid ?? 0));
    };
    await sql`prepare kept_probe as select 1`.execute(kept.db);
    const before = await backends();
    expect(new Set(before.map((b) => b?.pid)).size).toBe(2);
    vi.advanceTimersByTime(60 * 60_000);
    vi.useRealTimers();
    // Time for a closed connection's end to be seen, were one closed.
    await new Promise((resolve) => setTimeout(resolve, 200));
    // The same backends, the statement prepared on one of them still there.
    expect(await backends()).toEqual(before);
    expect(before.some((b) => Number(b?.prepared) === 1)).toBe(true);
  } finally {
    vi.useRealTimers();
    await kept.close();
  }
});
