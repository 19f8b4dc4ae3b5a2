/**
 * The Solana top-up rail: the real `@x402/svm` client (through the stock `@x402/fetch` wrapper) pays, the
 * server's in-process `@x402/svm` facilitator co-signs as fee payer, verifies and sends, against a loopback
 * stand-in for the Solana RPC methods they call. The paying wallet is credited once; a replay is refused. The
 * crash window: a transfer sent by a process that records nothing more is found by its transaction id
 * (`getSignatureStatuses`) and credited once by fresh instances; one never sent stays pending while its
 * blockhash is valid and fails after.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createKeyPairSignerFromBytes } from '@solana/kit';
import { decodePaymentResponseHeader, encodePaymentSignatureHeader } from '@x402/core/http';
import type { PaymentRequired } from '@x402/core/types';
import { wrapFetchWithPayment, x402Client } from '@x402/fetch';
import { ExactSvmScheme } from '@x402/svm/exact/client';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { Facilitator } from '../../server/providers/x402/facilitator.ts';
import { createInProcessFacilitator } from '../../server/providers/x402/in-process.ts';
import type { Services } from '../../server/services.ts';
import { createX402Payments } from '../../server/storage/x402-payments.ts';
import { startServer as startTestServer } from '../support/server.ts';
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
  const server = await startTestServer(`sqlite:${join(scratch, 'solana.db')}`, {
    PUBLIC_ORIGIN: 'https://api.example.test',
    X402_PAY_TO_SOLANA: payTo,
    X402_SOLANA_RPC_URL: rpc.url,
    X402_SOLANA_FACILITATOR_PRIVATE_KEY: facilitatorKey.secretKeyBase58,
  });
  ({ services, base } = server);
  closeServer = server.close;
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

describe('Solana top-up crash window', () => {
  let facilitatorKey: Awaited<ReturnType<typeof solanaKeyPair>>;
  const closers: Array<() => Promise<void>> = [];
  beforeAll(async () => {
    facilitatorKey = await solanaKeyPair();
  });
  afterAll(async () => {
    for (const close of closers) await close();
  });

  async function instance(db: string, facilitator?: Facilitator) {
    const server = await startTestServer(
      `sqlite:${join(scratch, `${db}.db`)}`,
      {
        PUBLIC_ORIGIN: 'https://api.example.test',
        X402_PAY_TO_SOLANA: payTo,
        X402_SOLANA_RPC_URL: rpc.url,
        X402_SOLANA_FACILITATOR_PRIVATE_KEY: facilitatorKey.secretKeyBase58,
      },
      { services: facilitator ? { facilitator } : {} },
    );
    closers.push(server.close);
    const started = server.services;
    const url = `${server.base}/x402/top-up`;
    const topUp = async (headers: Record<string, string> = {}) => {
      const response = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ amountUsd: 5 }),
      });
      return { status: response.status, body: (await response.json()) as Record<string, unknown> };
    };
    return { services: started, topUp };
  }

  /** The real facilitator; `settle` runs `before` (true: it then really sends) and throws as a crash would. */
  async function crashing(sendFirst: boolean): Promise<Facilitator> {
    const real = await createInProcessFacilitator({
      solana: { rpcUrl: rpc.url, secretKeyBase58: facilitatorKey.secretKeyBase58 },
    });
    return {
      verify: (payload, requirements) => real.verify(payload, requirements),
      supported: () => real.supported(),
      settle: async (payload, requirements) => {
        if (sendFirst) await real.settle(payload, requirements);
        throw new Error('the process died');
      },
    };
  }

  async function pay(topUp: Awaited<ReturnType<typeof instance>>['topUp']) {
    const payerKey = await solanaKeyPair();
    const signer = await createKeyPairSignerFromBytes(payerKey.secretKey);
    const client = new x402Client()
      .register(SOLANA, new ExactSvmScheme(signer, { rpcUrl: rpc.url }))
      .setSpendControls({ maxAmountPerPayment: '$100' });
    const offer = await topUp();
    const payload = await client.createPaymentPayload(offer.body as unknown as PaymentRequired);
    const answer = await topUp({ 'PAYMENT-SIGNATURE': encodePaymentSignatureHeader(payload) });
    expect(answer.status).toBe(504);
    return payerKey.address;
  }

  const later = () => Date.now() + 6 * 60_000;
  const entriesOf = async (services: Services, address: string) => {
    const wallet = await services.accounts.findWalletAccount(address);
    return wallet ? services.ledger.listEntries(wallet.id) : [];
  };

  test('behavior: sent before the crash -> found by its transaction id and credited once, also by two instances at once', async () => {
    const first = await instance('solana-crash', await crashing(true));
    const sentBefore = rpc.sent.length;
    const payer = await pay(first.topUp);
    expect(rpc.sent).toHaveLength(sentBefore + 1);
    expect(await entriesOf(first.services, payer)).toHaveLength(0);

    const second = await instance('solana-crash');
    const third = await instance('solana-crash');
    const at = later();
    await Promise.all([second.services.wallet.housekeeping(at), third.services.wallet.housekeeping(at)]);
    await second.services.wallet.housekeeping(at + 6 * 60_000);
    const entries = await entriesOf(second.services, payer);
    expect(entries.map((e) => [e.type, e.amountNano, e.network])).toEqual([
      ['TOP_UP', 5_000_000_000n, SOLANA],
    ]);
    const wallet = await second.services.accounts.findWalletAccount(payer);
    expect((await second.services.ledger.getBalance(wallet?.id ?? '')).usdNano).toBe(5_000_000_000n);
    // The credited transaction is the one the node received; nothing was sent again.
    const [row] = await second.services.database.db.selectFrom('x402_payments').selectAll().execute();
    expect(row).toMatchObject({ status: 'settled', tx_hash: entries[0]?.txHash });
    expect(rpc.sent).toHaveLength(sentBefore + 1);
  });

  test('behavior: never sent -> pending while the blockhash is valid; failed once it expired; nothing credited', async () => {
    const first = await instance('solana-unsent', await crashing(false));
    const sentBefore = rpc.sent.length;
    const payer = await pay(first.topUp);
    const second = await instance('solana-unsent');
    const at = later();
    expect(await second.services.wallet.topUp?.reconcile(at)).toEqual({ credited: 0, pending: 1, failed: 0 });
    rpc.expireBlockhashes();
    expect(await second.services.wallet.topUp?.reconcile(at + 6 * 60_000)).toEqual({
      credited: 0,
      pending: 0,
      failed: 1,
    });
    const [row] = await second.services.database.db.selectFrom('x402_payments').selectAll().execute();
    expect(row?.status).toBe('failed');
    expect(await createX402Payments(second.services.database).due(50, at + 60 * 60_000)).toHaveLength(0);
    expect(await entriesOf(second.services, payer)).toHaveLength(0);
    expect(rpc.sent).toHaveLength(sentBefore);
  });
});
