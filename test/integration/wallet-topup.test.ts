/**
 * Top-up end to end, offline: a real EVM node (anvil, chain id 8453) with the solc-compiled EIP-3009 test token
 * at the real Base USDC address, the server with its in-process facilitator settling through that node, and
 * the stock `@x402/fetch` client paying with a viem account. Token balances move on chain; the ledger shows one
 * TOP_UP per payment; replays and concurrent submissions credit once; amounts out of range are refused.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodePaymentResponseHeader, encodePaymentSignatureHeader } from '@x402/core/http';
import type { PaymentPayload, PaymentRequired } from '@x402/core/types';
import { wrapFetchWithPayment } from '@x402/fetch';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { Services } from '../../server/services.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { startServer as startTestServer } from '../support/server.ts';
import { BASE_USDC, installTestUsdc, mintUsdc, usdcBalance } from '../support/x402/contracts.ts';
import { evmPayingClient } from '../support/x402/payments.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-topup-'));
const FACILITATOR_KEY = ANVIL_PRIVATE_KEYS[0];
const MINTER_KEY = ANVIL_PRIVATE_KEYS[1];
const PAY_TO = privateKeyToAccount(generatePrivateKey()).address;

// biome-ignore lint/suspicious/noExplicitAny: a response body as tests read it; the assertions check its shape.
type Json = any;

let anvil: StartedAnvil;
let services: Services;
let base: string;
let closeServer: () => Promise<void>;

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  await installTestUsdc(anvil.rpc);
  const server = await startTestServer(`sqlite:${join(scratch, 'topup.db')}`, {
    PUBLIC_ORIGIN: 'https://api.example.test',
    X402_PAY_TO_BASE: PAY_TO,
    X402_BASE_RPC_URL: anvil.url,
    X402_FACILITATOR_PRIVATE_KEY: FACILITATOR_KEY,
  });
  ({ services, base } = server);
  closeServer = server.close;
});

afterAll(async () => {
  await closeServer?.();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

async function fundedPayer(usdc: bigint) {
  const account = privateKeyToAccount(generatePrivateKey());
  await mintUsdc(anvil.url, MINTER_KEY, account.address, usdc);
  return account;
}

async function topUp(body: unknown, headers: Record<string, string> = {}) {
  const response = await fetch(`${base}/x402/top-up`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, body: (await response.json()) as Json };
}

/** A signed payment for `amountUsd`, made by the stock client from the server's own 402. */
async function signedPayment(account: ReturnType<typeof privateKeyToAccount>, amountUsd: number) {
  const offer = await topUp({ amountUsd });
  expect(offer.status).toBe(402);
  const paymentRequired = offer.body as PaymentRequired;
  const payload: PaymentPayload = await evmPayingClient(account).createPaymentPayload(paymentRequired);
  return encodePaymentSignatureHeader(payload);
}

async function walletEntries(address: string) {
  const wallet = await services.accounts.findWalletAccount(address);
  return wallet ? services.ledger.listEntries(wallet.id) : [];
}

describe('POST /x402/top-up on a real EVM node', () => {
  test('behavior: without a payment header -> 402 whose body equals the PAYMENT-REQUIRED header', async () => {
    const response = await topUp({ amountUsd: 7.5 });
    expect(response.status).toBe(402);
    const header = JSON.parse(
      Buffer.from(response.headers.get('payment-required') ?? '', 'base64').toString(),
    );
    expect(header).toEqual(response.body);
    expect(response.body).toMatchObject({
      x402Version: 2,
      resource: { url: 'https://api.example.test/api/v1/x402/top-up' },
      accepts: [
        {
          scheme: 'exact',
          network: 'eip155:8453',
          asset: BASE_USDC,
          amount: '7500000',
          payTo: PAY_TO,
          maxTimeoutSeconds: 300,
          extra: { name: 'USD Coin', version: '2' },
        },
      ],
      extensions: { 'sign-in-with-x': { info: { domain: 'api.example.test', version: '1' } } },
    });
    // Only the rails the facilitator settles are offered (no Solana here).
    expect(response.body.accepts).toHaveLength(1);
  });

  test('behavior: the stock @x402/fetch client tops up 5 USD; tokens move; one TOP_UP; a replay is refused', async () => {
    const payer = await fundedPayer(20_000_000n);
    let sentHeader = '';
    const client = evmPayingClient(payer).onAfterPaymentCreation(async ({ paymentPayload }) => {
      sentHeader = encodePaymentSignatureHeader(paymentPayload);
    });
    const payFetch = wrapFetchWithPayment(fetch, client);
    const response = await payFetch(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amountUsd: 5 }),
    });
    const body = (await response.json()) as Json;
    expect(response.status, JSON.stringify(body)).toBe(200);
    expect(body.data).toMatchObject({
      walletAddress: payer.address,
      amountCredited: 5,
      newBalance: 5,
      network: 'eip155:8453',
    });
    const receipt = decodePaymentResponseHeader(response.headers.get('payment-response') ?? '');
    expect(receipt).toMatchObject({
      success: true,
      network: 'eip155:8453',
      transaction: body.data.transaction,
    });

    expect(await usdcBalance(anvil.url, payer.address)).toBe(15_000_000n);
    expect(await usdcBalance(anvil.url, PAY_TO)).toBe(5_000_000n);
    const entries = await walletEntries(payer.address);
    expect(entries.map((e) => [e.type, e.amountNano, e.txHash])).toEqual([
      ['TOP_UP', 5_000_000_000n, body.data.transaction],
    ]);
    expect(entries[0]?.id).toBe(body.data.paymentId);

    const replay = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': sentHeader });
    expect(replay.status).toBe(409);
    expect(replay.body.code).toBe('PAYMENT_ALREADY_SETTLED');
    expect(await walletEntries(payer.address)).toHaveLength(1);
    expect(await usdcBalance(anvil.url, payer.address)).toBe(15_000_000n);
  });

  test('behavior: two concurrent submissions of one payment settle and credit once', async () => {
    const payer = await fundedPayer(20_000_000n);
    const header = await signedPayment(payer, 6);
    const results = await Promise.all([
      topUp({ amountUsd: 6 }, { 'PAYMENT-SIGNATURE': header }),
      topUp({ amountUsd: 6 }, { 'X-PAYMENT': header }),
    ]);
    expect(results.map((r) => r.status).sort()).toEqual([200, 409]);
    const refused = results.find((r) => r.status === 409);
    expect(['PAYMENT_IN_PROGRESS', 'PAYMENT_ALREADY_SETTLED']).toContain(refused?.body.code);
    expect((await walletEntries(payer.address)).map((e) => e.amountNano)).toEqual([6_000_000_000n]);
    expect(await usdcBalance(anvil.url, payer.address)).toBe(14_000_000n);
  });

  test('behavior: the legacy X-402-Payment header is accepted, and credit accumulates', async () => {
    const payer = await fundedPayer(20_000_000n);
    const first = await topUp({ amountUsd: 5 }, { 'X-402-Payment': await signedPayment(payer, 5) });
    expect(first.status).toBe(200);
    const second = await topUp({ amountUsd: 5.5 }, { 'X-402-Payment': await signedPayment(payer, 5.5) });
    expect(second.status).toBe(200);
    expect(second.body.data.newBalance).toBe(10.5);
    expect(await usdcBalance(anvil.url, PAY_TO)).toBeGreaterThanOrEqual(10_500_000n);
  });

  test('behavior: 4.99 USD and 10,000.01 USD are refused with 400, by the stock client too', async () => {
    expect((await topUp({ amountUsd: 4.99 })).status).toBe(400);
    expect((await topUp({ amountUsd: 10_000.01 })).status).toBe(400);
    expect((await topUp({ amountUsd: 5.0000001 })).status).toBe(400);
    const payer = await fundedPayer(20_000_000n);
    const response = await wrapFetchWithPayment(fetch, evmPayingClient(payer))(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amountUsd: 4.99 }),
    });
    expect(response.status).toBe(400);
    expect(await usdcBalance(anvil.url, payer.address)).toBe(20_000_000n);
    expect(await walletEntries(payer.address)).toHaveLength(0);
  });

  test('behavior: a payment for another amount, a malformed header, or an unfunded payer is refused', async () => {
    const payer = await fundedPayer(20_000_000n);
    const forFive = await signedPayment(payer, 5);
    const mismatch = await topUp({ amountUsd: 6 }, { 'PAYMENT-SIGNATURE': forFive });
    expect(mismatch.status).toBe(400);
    expect(mismatch.body.code).toBe('INVALID_AMOUNT');

    const garbage = await topUp(
      { amountUsd: 5 },
      { 'PAYMENT-SIGNATURE': Buffer.from('{"x":1}').toString('base64') },
    );
    expect(garbage.status).toBe(400);
    expect(garbage.body.code).toBe('INVALID_PAYMENT_FORMAT');

    const broke = privateKeyToAccount(generatePrivateKey());
    const unfunded = await topUp({ amountUsd: 5 }, { 'PAYMENT-SIGNATURE': await signedPayment(broke, 5) });
    expect(unfunded.status).toBe(400);
    expect(unfunded.body.code).toBe('PAYMENT_VERIFICATION_FAILED');
    expect(await walletEntries(broke.address)).toHaveLength(0);
  });
});
