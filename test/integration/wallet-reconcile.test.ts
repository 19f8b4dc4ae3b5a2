/**
 * The crash window of a Base top-up, on a real EVM node: the settlement transaction is broadcast and mined, but
 * the process that sent it records nothing more (it dies mid-settle, or its settle call fails after the
 * broadcast). Fresh server instances on the same database then reconcile from the chain (the token's
 * `authorizationState` and `AuthorizationUsed` log): the payment is credited exactly once, with one TOP_UP,
 * also when two instances reconcile at once (on SQLite and on PostgreSQL) and when reconciliation runs again. An authorization that was never
 * broadcast stays pending while it is valid and fails (nothing credited) once the chain passes `validBefore`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { Facilitator } from '../../server/providers/x402/facilitator.ts';
import { createInProcessFacilitator } from '../../server/providers/x402/in-process.ts';
import type { Services } from '../../server/services.ts';
import { createX402Payments } from '../../server/storage/x402-payments.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { type StartedPostgres, startPostgres } from '../support/postgres.ts';
import { startServer as startTestServer } from '../support/server.ts';
import { installTestUsdc, mintUsdc, usdcBalance } from '../support/x402/contracts.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-reconcile-'));
const PAY_TO = privateKeyToAccount(generatePrivateKey()).address;
/** Past the settle lease: what a reconciler sees once the process that claimed the payment is gone. */
const AFTER_LEASE_MS = 6 * 60_000;

// biome-ignore lint/suspicious/noExplicitAny: a response body as tests read it; the assertions check its shape.
type Json = any;

const cleanups: Array<() => Promise<void>> = [];

afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  rmSync(scratch, { recursive: true, force: true });
});

async function newAnvil(): Promise<StartedAnvil> {
  const anvil = await startAnvil({ chainId: 8453 });
  cleanups.push(() => anvil.stop());
  await installTestUsdc(anvil.rpc);
  return anvil;
}

/** A server instance on `db`; its facilitator is the configured in-process one unless one is given. */
/** `db`: a name for a SQLite file in the scratch directory, or a PostgreSQL URL. */
async function startInstance(anvil: StartedAnvil, db: string, facilitator?: Facilitator) {
  const { services, base, close } = await startTestServer(
    db.startsWith('postgres') ? db : `sqlite:${join(scratch, `${db}.db`)}`,
    {
      PUBLIC_ORIGIN: 'https://api.example.test',
      X402_PAY_TO_BASE: PAY_TO,
      X402_BASE_RPC_URL: anvil.url,
      X402_FACILITATOR_PRIVATE_KEY: ANVIL_PRIVATE_KEYS[0],
    },
    { services: facilitator ? { facilitator } : {} },
  );
  cleanups.push(close);
  const topUp = async (body: unknown, headers: Record<string, string> = {}) => {
    const response = await fetch(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
    return { status: response.status, body: (await response.json()) as Json };
  };
  return { services, topUp };
}

async function signedPayment(anvil: StartedAnvil, topUp: Awaited<ReturnType<typeof startInstance>>['topUp']) {
  const payer = privateKeyToAccount(generatePrivateKey());
  await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], payer.address, 20_000_000n);
  const offer = await topUp({ amountUsd: 5 });
  expect(offer.status).toBe(402);
  return { header: await evmPaymentHeader(offer.body, payer), payer: payer.address };
}

async function walletState(services: Services, address: string) {
  const wallet = await services.accounts.findWalletAccount(address);
  if (!wallet) return { entries: [], balanceNano: 0n };
  return {
    entries: await services.ledger.listEntries(wallet.id),
    balanceNano: (await services.ledger.getBalance(wallet.id)).usdNano,
  };
}

let postgres: StartedPostgres | undefined;
/** A fresh database on a PostgreSQL server started on first use (stopped after the file). */
async function postgresDatabase(name: string): Promise<string> {
  if (!postgres) {
    postgres = await startPostgres();
    const started = postgres;
    cleanups.unshift(() => started.stop());
  }
  return postgres.createDatabase(name);
}

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

describe('x402 top-up crash window', () => {
  let anvil: StartedAnvil;
  beforeAll(async () => {
    anvil = await newAnvil();
  });

  test.each([
    ['the process dies after the broadcast (row left settling)', 'dies', 'sqlite'],
    ['settle fails after the broadcast (row left pending without a transaction)', 'throws', 'sqlite'],
    ['the process dies after the broadcast, on PostgreSQL', 'dies', 'postgres'],
  ] as const)(
    'behavior: %s -> reconciled from the chain and credited exactly once',
    async (_name, mode, engine) => {
      const db = engine === 'postgres' ? await postgresDatabase(`crash_${mode}`) : `crash-${mode}`;
      const real = await createInProcessFacilitator({
        evm: { rpcUrl: anvil.url, privateKey: ANVIL_PRIVATE_KEYS[0] },
      });
      const broadcast = deferred();
      let settled: Awaited<ReturnType<Facilitator['settle']>> | undefined;
      // Our facilitator port around the real one: the transfer really settles on chain, then nothing that
      // follows it in this process happens.
      const crashing: Facilitator = {
        verify: (payload, requirements) => real.verify(payload, requirements),
        supported: () => real.supported(),
        settle: async (payload, requirements) => {
          settled = await real.settle(payload, requirements);
          broadcast.resolve();
          if (mode === 'throws') throw new Error('connection reset after the broadcast');
          return new Promise<never>(() => {});
        },
      };
      const first = await startInstance(anvil, db, crashing);
      const { header, payer } = await signedPayment(anvil, first.topUp);
      const answer = first.topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header }).catch(() => undefined);
      await broadcast.promise;
      expect(settled?.success).toBe(true);
      if (mode === 'throws') {
        const answered = await answer;
        expect(answered?.status).toBe(504);
        expect(answered?.body.code).toBe('SETTLEMENT_TIMEOUT');
      }
      // The money moved on chain; nothing was credited.
      expect(await usdcBalance(anvil.url, payer)).toBe(15_000_000n);
      expect(await usdcBalance(anvil.url, PAY_TO)).toBeGreaterThanOrEqual(5_000_000n);
      expect((await walletState(first.services, payer)).entries).toHaveLength(0);
      const [row] = await first.services.database.db.selectFrom('x402_payments').selectAll().execute();
      expect(row?.status).toBe(mode === 'dies' ? 'settling' : 'pending');

      // Two fresh instances on the same database reconcile at once, after the dead process's lease.
      const second = await startInstance(anvil, db);
      const third = await startInstance(anvil, db);
      const later = Date.now() + AFTER_LEASE_MS;
      await Promise.all([
        second.services.wallet.housekeeping(later),
        third.services.wallet.housekeeping(later),
      ]);
      await second.services.wallet.housekeeping(later + AFTER_LEASE_MS);
      await third.services.wallet.housekeeping(later + AFTER_LEASE_MS);

      const { entries, balanceNano } = await walletState(second.services, payer);
      expect(entries.map((e) => [e.type, e.amountNano])).toEqual([['TOP_UP', 5_000_000_000n]]);
      expect(balanceNano).toBe(entries.reduce((sum, e) => sum + e.amountNano, 0n));
      const payment = await createX402Payments(second.services.database).get(row?.payment_key ?? '');
      expect(payment).toMatchObject({ status: 'settled', entryId: entries[0]?.id });
      // The credited transaction is the one on chain that moved the payment.
      const receipt = await anvil.rpc<{ status: string; to: string }>('eth_getTransactionReceipt', [
        payment?.txHash,
      ]);
      expect(receipt.status).toBe('0x1');
      expect(entries[0]).toMatchObject({ network: 'eip155:8453', txHash: payment?.txHash });

      // The same payment submitted again is refused as already credited; the dead request gets nothing more.
      const again = await second.topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
      expect(again.status).toBe(409);
      expect(again.body.code).toBe('PAYMENT_ALREADY_SETTLED');
      expect(await usdcBalance(anvil.url, payer)).toBe(15_000_000n);
    },
  );
});

describe('x402 top-up never broadcast', () => {
  test('behavior: unused and valid -> stays pending; unused past validBefore (chain time) -> failed, nothing credited', async () => {
    // Its own node: this test moves the chain's clock forward.
    const anvil = await newAnvil();
    const real = await createInProcessFacilitator({
      evm: { rpcUrl: anvil.url, privateKey: ANVIL_PRIVATE_KEYS[0] },
    });
    const dying: Facilitator = {
      verify: (payload, requirements) => real.verify(payload, requirements),
      supported: () => real.supported(),
      settle: async () => {
        throw new Error('the process died before broadcasting');
      },
    };
    const first = await startInstance(anvil, 'unused', dying);
    const { header, payer } = await signedPayment(anvil, first.topUp);
    const answered = await first.topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
    expect(answered.status).toBe(504);

    const second = await startInstance(anvil, 'unused');
    const payments = createX402Payments(second.services.database);
    const later = Date.now() + AFTER_LEASE_MS;
    expect(await second.services.wallet.topUp?.reconcile(later)).toEqual({
      credited: 0,
      pending: 1,
      failed: 0,
    });
    const [pending] = await payments.due(50, later + AFTER_LEASE_MS);
    expect(pending?.status).toBe('pending');

    // The chain passes validBefore (now + 300 s when signed) with the authorization unused.
    await anvil.rpc('evm_increaseTime', [600]);
    await anvil.rpc('evm_mine');
    expect(await second.services.wallet.topUp?.reconcile(later + AFTER_LEASE_MS)).toEqual({
      credited: 0,
      pending: 0,
      failed: 1,
    });
    expect((await payments.get(pending?.paymentKey ?? ''))?.status).toBe('failed');
    expect((await walletState(second.services, payer)).entries).toHaveLength(0);
    expect(await usdcBalance(anvil.url, payer)).toBe(20_000_000n);
  });
});
