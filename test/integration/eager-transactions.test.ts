/**
 * The transactions a request waits on before its work (its reservation, a wallet's request slot) are asked
 * for eagerly (server/storage/group-commit.ts): on a quiet SQLite database they commit before the event loop's
 * next turn instead of in it. A capture, which no one waits on when it is alone, still waits its turn.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { QUIET_MS } from '../../server/storage/group-commit.ts';
import {
  createAccounts,
  createDatabase,
  createLedger,
  type Database,
  migrate,
} from '../../server/storage/index.ts';
import { createWalletSlots } from '../../server/storage/wallet-slots.ts';

const scratch = mkdtempSync(join(tmpdir(), 'svc-eager-'));
let database: Database;
let accountId: string;

beforeAll(async () => {
  database = await createDatabase(`sqlite:${join(scratch, 'db.sqlite')}`);
  await migrate(database);
  accountId = (await createAccounts(database).createApiAccount({})).id;
  await createLedger(database).topUp({ accountId, amountNano: 10n ** 12n });
});

afterAll(async () => {
  await database?.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** Whether `work` settles before a callback queued for the event loop's next check phase, after a quiet spell. */
async function settlesBeforeTheTurn(work: () => Promise<unknown>): Promise<boolean> {
  await new Promise((resolve) => setTimeout(resolve, QUIET_MS + 20));
  let turned = false;
  const turn = new Promise<void>((resolve) =>
    setImmediate(() => {
      turned = true;
      resolve();
    }),
  );
  let before = false;
  await Promise.all([work().then(() => (before = !turned)), turn]);
  return before;
}

test('behavior: a reservation and a wallet slot commit before the next turn; a capture waits its turn', async () => {
  const ledger = createLedger(database);
  const reserve = (requestId: string) =>
    ledger.reserve({ accountId, amountNano: 1_000_000n, requestId, ttlMs: 60_000 });
  expect(await settlesBeforeTheTurn(() => reserve('eager-1'))).toBe(true);
  const { reservation } = await reserve('eager-2');
  expect(
    await settlesBeforeTheTurn(() =>
      ledger.capture(reservation.id, { items: [{ sku: 'test', amountNano: 500n }] }),
    ),
  ).toBe(false);
  const slots = createWalletSlots(database);
  expect(await settlesBeforeTheTurn(() => slots.take({ accountId, max: 5, leaseMs: 60_000 }))).toBe(true);
});
