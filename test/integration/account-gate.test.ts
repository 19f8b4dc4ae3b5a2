/**
 * PostgreSQL: at most DATABASE_ACCOUNT_CONCURRENCY (3 by default) of a process's holds and captures of one
 * account wait at the database for the account's row; the rest wait in the process (server/storage/
 * account-gate.ts). Shown by holding the row from another session and counting the sessions PostgreSQL has
 * waiting on a lock; once the row is free every hold and capture completes, exactly as without the gate.
 * Those that waited together go as one transaction, committed once, each seeing the ones before it: the
 * balances stay exact, a hold the balance cannot cover is refused as alone, and a batch that one statement
 * spoils is undone and its statements run alone.
 */
import { sql } from 'kysely';
import pg from 'pg';
import { expect, test } from 'vitest';
import { createAccounts } from '../../server/storage/accounts.ts';
import { CommitRolledBack, createDatabase } from '../../server/storage/database.ts';
import { InsufficientBalanceError, ReservationStateError } from '../../server/storage/errors.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

const postgres = postgresPerFile();

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Runs `calls` while another session holds the account's row; answers how many sessions PostgreSQL had
 * waiting on a lock once they settled in, then frees the row and answers the calls' results.
 */
async function whileRowHeld<T>(url: string, accountId: string, calls: () => Array<Promise<T>>) {
  const blocker = new pg.Client({ connectionString: url });
  const watcher = new pg.Client({ connectionString: url });
  await Promise.all([blocker.connect(), watcher.connect()]);
  try {
    await blocker.query('begin');
    await blocker.query('select 1 from accounts where id = $1 for update', [accountId]);
    const running = calls();
    const waitingOnLocks = async () =>
      Number(
        (
          await watcher.query<{ n: string }>(
            `select count(*) as n from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'`,
          )
        ).rows[0]?.n,
      );
    // Until the count stops rising (every call sent has reached the lock), then once more a little later.
    let waiting = 0;
    for (let i = 0; i < 50; i++) {
      await sleep(40);
      const now = await waitingOnLocks();
      if (now > 0 && now === waiting) break;
      waiting = now;
    }
    await sleep(200);
    waiting = await waitingOnLocks();
    await blocker.query('commit');
    return { waiting, results: await Promise.all(running) };
  } finally {
    await Promise.all([blocker.end(), watcher.end()]);
  }
}

test.each([
  ['by default', 3, undefined],
  ['with DATABASE_ACCOUNT_CONCURRENCY=0 (no limit)', 8, 0],
])(
  'behavior: 8 holds, then 8 captures, of one account, %s: %i of each wait at the database',
  async (_, expected, accountConcurrency) => {
    const url = await postgres().createDatabase(`gate_${expected}`);
    const database = await createDatabase(
      url,
      accountConcurrency === undefined ? {} : { accountConcurrency },
    );
    try {
      await migrate(database);
      const account = await createAccounts(database).createApiAccount({ name: 'gate' });
      const ledger = createLedger(database);
      await ledger.topUp({ accountId: account.id, amountNano: 1_000_000_000n });
      const held = await whileRowHeld(url, account.id, () =>
        Array.from({ length: 8 }, (_, i) =>
          ledger.reserve({
            accountId: account.id,
            amountNano: 10_000_000n,
            requestId: `gate-${expected}-${i}`,
            modelId: 'm',
            ttlMs: 60_000,
          }),
        ),
      );
      expect(held.waiting).toBe(expected);
      expect((await ledger.getBalance(account.id)).usdReservedNano).toBe(80_000_000n);
      const captured = await whileRowHeld(url, account.id, () =>
        held.results.map(({ reservation }) =>
          ledger.captureWith(reservation, { items: [{ sku: 'output_tokens', amountNano: 1_000_000n }] }),
        ),
      );
      expect(captured.waiting).toBe(expected);
      const balance = await ledger.getBalance(account.id);
      expect(balance.usdReservedNano).toBe(0n);
      expect(balance.usdNano).toBe(1_000_000_000n - 8_000_000n);
    } finally {
      await database.close();
    }
  },
);

/** A database of its own with one funded account; `statements` records every statement sent (`begin`, `commit`…). */
async function fundedAccount(name: string, amountNano: bigint, accountConcurrency?: number) {
  const url = await postgres().createDatabase(name);
  const statements: string[] = [];
  const database = await createDatabase(url, {
    onQuery: (text) => statements.push(text.trim().split(/\s+/)[0]?.toLowerCase() ?? ''),
    ...(accountConcurrency === undefined ? {} : { accountConcurrency }),
  });
  await migrate(database);
  const account = await createAccounts(database).createApiAccount({ name });
  const ledger = createLedger(database);
  await ledger.topUp({ accountId: account.id, amountNano });
  statements.length = 0;
  return { url, database, ledger, accountId: account.id, statements };
}

const hold = (
  ledger: ReturnType<typeof createLedger>,
  accountId: string,
  requestId: string,
  amountNano: bigint,
) => ledger.reserve({ accountId, amountNano, requestId, modelId: 'm', ttlMs: 60_000 });

test('behavior: holds and captures that waited together are committed in batches, and every balance is exact', async () => {
  const { url, database, ledger, accountId, statements } = await fundedAccount(
    'batch_exact',
    1_000_000_000n,
    1,
  );
  try {
    const held = await whileRowHeld(url, accountId, () =>
      Array.from({ length: 12 }, (_, i) => hold(ledger, accountId, `batch-${i}`, 10_000_000n)),
    );
    // One waited at the database alone, the other 11 in the process, then together.
    expect(held.waiting).toBe(1);
    expect(statements.filter((s) => s === 'begin').length).toBeGreaterThan(0);
    expect(statements.filter((s) => s === 'begin').length).toBeLessThan(6);
    expect((await ledger.getBalance(accountId)).usdReservedNano).toBe(120_000_000n);
    // Each hold saw the ones before it: the balances they found fall by 10_000_000 each, in order.
    const available = held.results.map((r) => r.availableNano);
    expect([...available].sort((a, b) => (a > b ? -1 : 1))).toEqual(
      Array.from({ length: 12 }, (_, i) => 1_000_000_000n - BigInt(i + 1) * 10_000_000n),
    );
    statements.length = 0;
    await whileRowHeld(url, accountId, () =>
      held.results.map(({ reservation }, i) =>
        ledger.captureWith(reservation, {
          items: [{ sku: 'output_tokens', amountNano: BigInt(i + 1) * 1_000n }],
        }),
      ),
    );
    expect(statements.filter((s) => s === 'begin').length).toBeLessThan(6);
    const balance = await ledger.getBalance(accountId);
    expect(balance.usdReservedNano).toBe(0n);
    expect(balance.usdNano).toBe(1_000_000_000n - 78_000n);
    const { rows } = await sql<{ n: string; total: string }>`
      select count(*) as n, sum(amount_nano)::bigint as total from ledger_entries
      where account_id = ${accountId} and type = 'CHARGE'`.execute(database.db);
    expect(rows[0]).toEqual({ n: 12n, total: -78_000n });
  } finally {
    await database.close();
  }
});

test('behavior: in a batch, the holds past what the balance covers are refused, as they would be one by one', async () => {
  const { url, database, ledger, accountId } = await fundedAccount('batch_short', 50_000_000n, 1);
  try {
    const { results } = await whileRowHeld(url, accountId, () =>
      Array.from({ length: 10 }, (_, i) =>
        hold(ledger, accountId, `short-${i}`, 10_000_000n).then(
          () => 'held',
          (error: unknown) => (error instanceof InsufficientBalanceError ? 'refused' : error),
        ),
      ),
    );
    expect(results.filter((r) => r === 'held')).toHaveLength(5);
    expect(results.filter((r) => r === 'refused')).toHaveLength(5);
    const balance = await ledger.getBalance(accountId);
    expect(balance.usdReservedNano).toBe(50_000_000n);
    expect(balance.usdAvailableNano).toBe(0n);
  } finally {
    await database.close();
  }
});

test('fault: a capture that cannot go at once spoils its batch; the batch is undone and each capture runs alone', async () => {
  const { url, database, ledger, accountId, statements } = await fundedAccount(
    'batch_spoiled',
    1_000_000_000n,
    1,
  );
  try {
    const held = await Promise.all(
      Array.from({ length: 4 }, (_, i) => hold(ledger, accountId, `spoiled-${i}`, 10_000_000n)),
    );
    const settledAlready = held[1]?.reservation;
    if (!settledAlready) throw new Error('no reservation');
    await ledger.captureWith(settledAlready, { items: [{ sku: 'output_tokens', amountNano: 5_000n }] });
    statements.length = 0;
    const { results } = await whileRowHeld(url, accountId, () =>
      held.map(({ reservation }) =>
        ledger.captureWith(reservation, { items: [{ sku: 'output_tokens', amountNano: 1_000n }] }).then(
          () => 'captured',
          (error: unknown) => (error instanceof ReservationStateError ? 'already settled' : error),
        ),
      ),
    );
    expect(results).toEqual(['captured', 'already settled', 'captured', 'captured']);
    expect(statements).toContain('rollback');
    const balance = await ledger.getBalance(accountId);
    expect(balance.usdReservedNano).toBe(0n);
    expect(balance.usdNano).toBe(1_000_000_000n - 5_000n - 3_000n);
  } finally {
    await database.close();
  }
});

test('fault: a COMMIT that PostgreSQL answers with ROLLBACK (a statement of the transaction had failed) is an error', async () => {
  const { database } = await fundedAccount('commit_rolled_back', 1n);
  try {
    const outcome = database.db.connection().execute(async (connection) => {
      await sql`begin`.execute(connection);
      await sql`select 1 / 0`.execute(connection).catch(() => undefined);
      await sql`commit`.execute(connection);
    });
    await expect(outcome).rejects.toBeInstanceOf(CommitRolledBack);
  } finally {
    await database.close();
  }
});
