/**
 * PostgreSQL: the hot statements are prepared statements (named; each connection parses and plans one once):
 * a reservation's hold and a capture's one statement; the statement after the account's lock in a script is a
 * SQL-level one (`scriptThenPrepared`). They stay valid when a later migration adds a column to the tables they
 * touch (none of them selects `*`), as in a rolling upgrade where another instance migrates.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { scriptThenPrepared } from '../../server/storage/internal.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { type StartedPostgres, startPostgres } from '../support/postgres.ts';

let postgres: StartedPostgres;
let database: Database;

beforeAll(async () => {
  postgres = await startPostgres();
  // One connection: the prepared statements listed are those of the connection that ran the ledger's.
  database = await createDatabase(await postgres.createDatabase('prepared'), { poolMax: 1 });
  await migrate(database);
}, 120_000);

afterAll(async () => {
  await database?.close();
  await postgres?.stop();
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
async function watchedDatabase(name: string, use: (watched: Database, sent: string[]) => Promise<void>) {
  const sent: string[] = [];
  const watched = await createDatabase(await postgres.createDatabase(name), {
    poolMax: 1,
    onQuery: (text) => sent.push(text),
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
    expect(await scriptThenPrepared(watched.db, 'select 1', statement("it's"))).toEqual([
      { v: "it's", n: 8n },
    ]);
    // Unknown on this connection (26000, nothing written), prepared, run again.
    expect(sent).toHaveLength(3);
    expect(sent[0]).toMatch(/^select 1;\nexecute svc_[0-9a-f]+_s\('it''s', 7\)$/);
    expect(sent[1]).toMatch(/^prepare svc_[0-9a-f]+_s as select cast\(\$1 as text\)/);
    expect(sent[2]).toBe(sent[0]);
    sent.length = 0;
    expect(await scriptThenPrepared(watched.db, 'select 1', statement('again'))).toEqual([
      { v: 'again', n: 8n },
    ]);
    expect(sent).toHaveLength(1);
  });
});

test('fault: a statement PostgreSQL cannot prepare runs as text in the script, and answers the same', async () => {
  await watchedDatabase('scripts_text', async (watched, sent) => {
    // A parameter whose type nothing determines: PREPARE refuses it; as a literal it is text.
    const statement = sql<{ v: boolean }>`select ${'plain'} is null as v`.compile(watched.db);
    expect(await scriptThenPrepared(watched.db, 'select 1', statement)).toEqual([{ v: false }]);
    expect(sent.at(-1)).toBe("select 1;\nselect 'plain' is null as v");
  });
});
