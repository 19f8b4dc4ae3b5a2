/**
 * Settlement edge cases on a real EVM node: a settlement still pending (mining paused) is answered 202, a
 * resubmission of it is answered 202 again (never a fresh 402), and the reconciler credits it exactly once after
 * the block is mined; the facilitator reached over HTTP (`X402_FACILITATOR_URL`) settles a top-up; and with no
 * facilitator configured the top-up answers 503.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { Facilitator } from '../../server/providers/x402/facilitator.ts';
import { createInProcessFacilitator } from '../../server/providers/x402/in-process.ts';
import type { Services } from '../../server/services.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { createPendingSettlementStore } from '../../server/storage/x402-payments.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { startServer as startTestServer } from '../support/server.ts';
import { installTestUsdc, mintUsdc, usdcBalance } from '../support/x402/contracts.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-settlement-'));
const PAY_TO = privateKeyToAccount(generatePrivateKey()).address;

// biome-ignore lint/suspicious/noExplicitAny: a response body as tests read it; the assertions check its shape.
type Json = any;

let anvil: StartedAnvil;
const cleanups: Array<() => Promise<void>> = [];

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  await installTestUsdc(anvil.rpc);
});

afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

async function startServer(name: string, env: Record<string, string>, facilitator?: Facilitator) {
  const { services, base, close } = await startTestServer(
    `sqlite:${join(scratch, `${name}.db`)}`,
    { PUBLIC_ORIGIN: 'https://api.example.test', ...env },
    { services: facilitator ? { facilitator } : {} },
  );
  cleanups.push(close);
  const topUp = async (body: unknown, headers: Record<string, string> = {}) => {
    const response = await fetch(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
    return { status: response.status, headers: response.headers, body: (await response.json()) as Json };
  };
  return { services, topUp };
}

async function signedPayment(
  topUp: Awaited<ReturnType<typeof startServer>>['topUp'],
  amountUsd: number,
): Promise<{ header: string; payer: `0x${string}` }> {
  const payer = privateKeyToAccount(generatePrivateKey());
  await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], payer.address, 20_000_000n);
  const offer = await topUp({ amountUsd });
  expect(offer.status).toBe(402);
  return { header: await evmPaymentHeader(offer.body, payer), payer: payer.address };
}

async function topUpEntries(services: Services, address: string) {
  const wallet = await services.accounts.findWalletAccount(address);
  return wallet ? services.ledger.listEntries(wallet.id) : [];
}

describe('x402 settlement', () => {
  test('behavior: a pending settlement -> 202, resubmission -> 202, reconciled and credited once when mined', async () => {
    const url = `sqlite:${join(scratch, 'pending.db')}`;
    const store: Database = await createDatabase(url);
    cleanups.push(() => store.close());
    // The server's own facilitator, with a short receipt wait so that an unmined transaction is "pending".
    const facilitator = await createInProcessFacilitator({
      evm: {
        rpcUrl: anvil.url,
        privateKey: ANVIL_PRIVATE_KEYS[0],
        pendingSettlementStore: createPendingSettlementStore(store),
        confirmationTimeoutMs: 1500,
      },
    });
    const { services, topUp } = await startServer('pending', { X402_PAY_TO_BASE: PAY_TO }, facilitator);
    const { header, payer } = await signedPayment(topUp, 5);

    await anvil.rpc('evm_setAutomine', [false]);
    try {
      const first = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
      expect(first.status, JSON.stringify(first.body)).toBe(202);
      expect(first.body.data).toMatchObject({ status: 'pending', walletAddress: payer, amountUsd: 5 });
      const transaction = first.body.data.transaction as string;
      expect(transaction).toMatch(/^0x[0-9a-f]{64}$/);

      const again = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
      expect(again.status).toBe(202);
      expect(again.body.data.transaction).toBe(transaction);
      expect(await topUpEntries(services, payer)).toHaveLength(0);

      await anvil.rpc('evm_mine');
    } finally {
      await anvil.rpc('evm_setAutomine', [true]);
    }
    await services.wallet.housekeeping();
    await services.wallet.housekeeping();
    const entries = await topUpEntries(services, payer);
    expect(entries.map((e) => [e.type, e.amountNano])).toEqual([['TOP_UP', 5_000_000_000n]]);
    expect(await usdcBalance(anvil.url, payer)).toBe(15_000_000n);
    const settled = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
    expect(settled.status).toBe(409);
    expect(settled.body.code).toBe('PAYMENT_ALREADY_SETTLED');
  });

  test('behavior: a verified payment that fails to settle -> 402 SETTLEMENT_FAILED with fresh requirements; nothing credited', async () => {
    // A facilitator whose account has no ETH for gas: verification passes, the submission fails.
    const broke = await createInProcessFacilitator({
      evm: { rpcUrl: anvil.url, privateKey: generatePrivateKey() },
    });
    const { services, topUp } = await startServer('failing', { X402_PAY_TO_BASE: PAY_TO }, broke);
    const { header, payer } = await signedPayment(topUp, 5);
    const failed = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
    expect(failed.status).toBe(402);
    expect(failed.body.code).toBe('SETTLEMENT_FAILED');
    expect(failed.body.error.length).toBeLessThan(300);
    const fresh = JSON.parse(Buffer.from(failed.headers.get('payment-required') ?? '', 'base64').toString());
    expect(fresh.accepts[0]).toMatchObject({ network: 'eip155:8453', amount: '5000000' });
    expect(await topUpEntries(services, payer)).toHaveLength(0);
    expect(await usdcBalance(anvil.url, payer)).toBe(20_000_000n);
    // The payment moved nothing, so the same one may be tried again (and fails again here).
    expect((await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header })).body.code).toBe(
      'SETTLEMENT_FAILED',
    );
  });

  test('behavior: X402_FACILITATOR_URL settles through a facilitator over HTTP', async () => {
    // A facilitator service: the reference facilitator behind the x402 HTTP API, on loopback.
    const remote = await createInProcessFacilitator({
      evm: { rpcUrl: anvil.url, privateKey: ANVIL_PRIVATE_KEYS[3] },
    });
    const calls: string[] = [];
    const http = createServer((req, res) => {
      let text = '';
      req.on('data', (chunk: Buffer) => {
        text += chunk.toString();
      });
      req.on('end', async () => {
        calls.push(`${req.method} ${req.url}`);
        const body = text
          ? (JSON.parse(text) as { paymentPayload: never; paymentRequirements: never })
          : undefined;
        const result =
          req.url === '/supported'
            ? await remote.supported()
            : req.url === '/verify' && body
              ? await remote.verify(body.paymentPayload, body.paymentRequirements)
              : req.url === '/settle' && body
                ? await remote.settle(body.paymentPayload, body.paymentRequirements)
                : undefined;
        res.statusCode = result ? 200 : 404;
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify(result ?? { error: 'not found' }));
      });
    });
    http.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => http.once('listening', () => resolve()));
    cleanups.push(
      () =>
        new Promise<void>((resolve) => {
          http.closeAllConnections();
          http.close(() => resolve());
        }),
    );
    const { services, topUp } = await startServer('http', {
      X402_PAY_TO_BASE: PAY_TO,
      X402_FACILITATOR_URL: `http://127.0.0.1:${(http.address() as AddressInfo).port}`,
    });
    const { header, payer } = await signedPayment(topUp, 5);
    const paid = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': header });
    expect(paid.status, JSON.stringify(paid.body)).toBe(200);
    expect(calls).toEqual(expect.arrayContaining(['POST /verify', 'POST /settle']));
    expect((await topUpEntries(services, payer)).map((e) => e.amountNano)).toEqual([5_000_000_000n]);
    expect(await usdcBalance(anvil.url, payer)).toBe(15_000_000n);
  });

  test('behavior: without a facilitator or a pay-to address the top-up answers 503 X402_NOT_CONFIGURED', async () => {
    for (const [name, env] of [
      ['none', {}],
      ['no-facilitator', { X402_PAY_TO_BASE: PAY_TO }],
      ['no-pay-to', { X402_BASE_RPC_URL: anvil.url, X402_FACILITATOR_PRIVATE_KEY: ANVIL_PRIVATE_KEYS[2] }],
    ] as const) {
      const { topUp } = await startServer(`unconfigured-${name}`, env);
      const response = await topUp({ amountUsd: 5 });
      expect(response.status).toBe(503);
      expect(response.body.code).toBe('X402_NOT_CONFIGURED');
    }
  });
});
