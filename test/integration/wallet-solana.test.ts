/**
 * The Solana top-up rail: the real `@x402/svm` client (through the stock `@x402/fetch` wrapper) pays, the
 * server's in-process `@x402/svm` facilitator co-signs as fee payer, verifies and sends, against a loopback
 * stand-in for the Solana RPC methods they call. The paying wallet is credited once; a replay is refused.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createKeyPairSignerFromBytes } from '@solana/kit';
import { decodePaymentResponseHeader, encodePaymentSignatureHeader } from '@x402/core/http';
import { wrapFetchWithPayment, x402Client } from '@x402/fetch';
import { ExactSvmScheme } from '@x402/svm/exact/client';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import { createServices, type Services } from '../../server/services.ts';
import { type SolanaRpcStandIn, solanaKeyPair, startSolanaRpcStandIn } from '../support/x402/solana-rpc.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-solana-'));
const SOLANA = 'solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp';

let rpc: SolanaRpcStandIn;
let services: Services;
let base: string;
let feePayer: string;
let payTo: string;
let closeServer: () => Promise<void>;

beforeAll(async () => {
  rpc = await startSolanaRpcStandIn();
  const facilitatorKey = await solanaKeyPair();
  feePayer = facilitatorKey.address;
  payTo = (await solanaKeyPair()).address;
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: `sqlite:${join(scratch, 'solana.db')}`,
    PUBLIC_ORIGIN: 'https://api.example.test',
    X402_PAY_TO_SOLANA: payTo,
    X402_SOLANA_RPC_URL: rpc.url,
    X402_SOLANA_FACILITATOR_PRIVATE_KEY: facilitatorKey.secretKeyBase58,
  });
  services = await createServices(config, pino({ level: 'silent' }));
  const server = createApp(services.app).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`;
  closeServer = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await services.close();
  };
});

afterAll(async () => {
  await closeServer?.();
  await rpc?.close();
  rmSync(scratch, { recursive: true, force: true });
});

describe('Solana top-up', () => {
  test('behavior: the 402 offers Solana USDC with the facilitator as fee payer', async () => {
    const response = await fetch(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amountUsd: 5 }),
    });
    expect(response.status).toBe(402);
    const body = (await response.json()) as { accepts: unknown[] };
    expect(body.accepts).toEqual([
      {
        scheme: 'exact',
        network: SOLANA,
        asset: 'EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v',
        amount: '5000000',
        payTo,
        maxTimeoutSeconds: 300,
        extra: { feePayer },
      },
    ]);
  });

  test('behavior: the stock client pays 5 USD on Solana; the payer is credited once; a replay is refused', async () => {
    const payerKey = await solanaKeyPair();
    const signer = await createKeyPairSignerFromBytes(payerKey.secretKey);
    let sentHeader = '';
    const client = new x402Client()
      .register(SOLANA, new ExactSvmScheme(signer, { rpcUrl: rpc.url }))
      .setSpendControls({ maxAmountPerPayment: '$100' })
      .onAfterPaymentCreation(async ({ paymentPayload }) => {
        sentHeader = encodePaymentSignatureHeader(paymentPayload);
      });
    const response = await wrapFetchWithPayment(fetch, client)(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amountUsd: 5 }),
    });
    const body = (await response.json()) as { data: Record<string, unknown> };
    expect(response.status, JSON.stringify(body)).toBe(200);
    expect(body.data).toMatchObject({
      walletAddress: payerKey.address,
      amountCredited: 5,
      newBalance: 5,
      network: SOLANA,
    });
    const receipt = decodePaymentResponseHeader(response.headers.get('payment-response') ?? '');
    expect(receipt).toMatchObject({ success: true, network: SOLANA, payer: payerKey.address });
    expect(rpc.sent).toHaveLength(1);

    const wallet = await services.accounts.findWalletAccount(payerKey.address);
    const entries = wallet ? await services.ledger.listEntries(wallet.id) : [];
    expect(entries.map((e) => [e.type, e.amountNano, e.network, e.txHash])).toEqual([
      ['TOP_UP', 5_000_000_000n, SOLANA, receipt.transaction],
    ]);

    const replay = await fetch(`${base}/x402/top-up`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'PAYMENT-SIGNATURE': sentHeader },
      body: JSON.stringify({ amountUsd: 5 }),
    });
    expect(replay.status).toBe(409);
    expect(rpc.sent).toHaveLength(1);
    expect(wallet ? await services.ledger.listEntries(wallet.id) : []).toHaveLength(1);
  });
});
