/**
 * PostgreSQL: at most DATABASE_ACCOUNT_CONCURRENCY (3 by default) of a process's holds and captures of one
 * account wait at the database for the account's row; the rest wait in the process (server/storage/
 * account-gate.ts). Shown by holding the row from another session and counting the sessions PostgreSQL has
 * waiting on a lock; once the row is free every hold and capture completes, exactly as without the gate.
 */
import pg from 'pg';
import { expect, test } from 'vitest';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createDatabase } from '../../server/storage/database.ts';
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
  ['by default', undefined, 3],
  ['with DATABASE_ACCOUNT_CONCURRENCY=0 (no limit)', 0, 8],
])(
  'behavior: 8 holds, then 8 captures, of one account, %s: %i of each wait at the database',
  async (_, accountConcurrency, expected) => {
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
