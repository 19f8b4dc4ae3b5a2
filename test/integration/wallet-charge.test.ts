/**
 * The wallet charge path through the real server, with a test-only chat handler that spends like an inference
 * handler does (reserve through `services.charges`, then capture): a SIWX-signed request is charged to the
 * wallet's credit, `/x402/transactions` lists the CHARGE with its request id and model id, `X-Balance-Remaining`
 * and the balance endpoint agree with the ledger, too little credit gives the wallet 402 with `PAYMENT-REQUIRED`,
 * and a sixth concurrent request of one wallet gets 429.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import type { Handler } from '../../server/http/contract.ts';
import { createServices, type Services } from '../../server/services.ts';
import { withCoverage } from '../support/coverage.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-charge-'));
const ORIGIN = 'https://api.example.test';
const MODEL = 'test-model';

// biome-ignore lint/suspicious/noExplicitAny: a response body as tests read it; the assertions check its shape.
type Json = any;

let services: Services;
let base: string;
let closeServer: () => Promise<void>;
/** Requests the test handler is holding, and the way to let them finish. */
let holding = 0;
let releaseHeld: () => void = () => {};
let held = new Promise<void>((resolve) => {
  releaseHeld = resolve;
});
let handlerCalls = 0;

/** Spends like an inference handler: reserve the worst case, do the work, capture the real cost. */
const chatHandler: Handler<'createChatCompletion'> = async (ctx) => {
  handlerCalls++;
  if (!ctx.principal) throw new Error('no principal');
  const worstCase = (ctx.body as { max_completion_tokens?: number }).max_completion_tokens ?? 10;
  const reservation = await services.charges.reserve(ctx.principal, {
    amountNano: BigInt(worstCase) * 1_000_000n,
    requestId: ctx.requestId,
    modelId: MODEL,
  });
  if (ctx.body.messages[0]?.content === 'hold') {
    holding++;
    await held;
  }
  await services.charges.capture(reservation, [{ sku: 'output_tokens', amountNano: 4_200_000n }]);
  return {
    status: 200,
    body: {
      id: 'chatcmpl-test',
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: MODEL,
      choices: [
        { index: 0, finish_reason: 'stop', logprobs: null, message: { role: 'assistant', content: 'hi' } },
      ],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
    },
  };
};

beforeAll(async () => {
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: `sqlite:${join(scratch, 'charge.db')}`,
    PUBLIC_ORIGIN: ORIGIN,
    X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
  });
  services = await createServices(config, pino({ level: 'silent' }));
  const app = createApp({
    ...withCoverage(services.app),
    handlers: { ...services.app.handlers, createChatCompletion: chatHandler },
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`;
  closeServer = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await services.close();
  };
});

afterAll(async () => {
  releaseHeld();
  await closeServer?.();
  rmSync(scratch, { recursive: true, force: true });
});

async function walletWithCredit(nano: bigint) {
  const account = privateKeyToAccount(generatePrivateKey());
  const { account: wallet } = await services.accounts.findOrCreateWalletAccount(account.address);
  if (nano > 0n) {
    await services.ledger.topUp({
      accountId: wallet.id,
      amountNano: nano,
      network: 'eip155:8453',
      txHash: `0x${account.address.slice(2)}`,
    });
  }
  return { account, wallet };
}

async function chat(account: ReturnType<typeof privateKeyToAccount>, content = 'hello', maxTokens?: number) {
  const response = await fetch(`${base}/chat/completions`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'SIGN-IN-WITH-X': await evmSignIn(account, { origin: ORIGIN }),
    },
    body: JSON.stringify({
      model: MODEL,
      messages: [{ role: 'user', content }],
      ...(maxTokens ? { max_completion_tokens: maxTokens } : {}),
    }),
  });
  return { status: response.status, headers: response.headers, body: (await response.json()) as Json };
}

async function get(account: ReturnType<typeof privateKeyToAccount>, path: string) {
  const response = await fetch(`${base}${path}`, {
    headers: { 'SIGN-IN-WITH-X': await evmSignIn(account, { origin: ORIGIN }) },
  });
  return (await response.json()) as Json;
}

describe('wallet-paid inference', () => {
  test('behavior: a SIWX-signed request is charged to the wallet; history, header and balance agree', async () => {
    const { account, wallet } = await walletWithCredit(1_000_000_000n);
    const response = await chat(account);
    expect(response.status, JSON.stringify(response.body)).toBe(200);
    expect(response.headers.get('x-balance-remaining')).toBe('0.995800');
    const requestId = response.headers.get('cf-ray');

    const history = await get(account, `/x402/transactions/${account.address}`);
    expect(history.data.transactions[0]).toMatchObject({
      type: 'CHARGE',
      amount: -0.0042,
      balanceAfter: 0.9958,
      requestId,
      modelId: MODEL,
    });
    const balance = await get(account, `/x402/balance/${account.address}`);
    expect(balance.data.balanceUsd).toBe(0.9958);
    expect(history.data.currentBalance).toBe(0.9958);
    const ledger = await services.ledger.getBalance(wallet.id);
    expect(ledger.usdNano).toBe(995_800_000n);
    expect(ledger.usdReservedNano).toBe(0n);
  });

  test('behavior: credit below the request worst case -> the wallet 402 with PAYMENT-REQUIRED; nothing charged', async () => {
    const { account, wallet } = await walletWithCredit(200_000_000n);
    const response = await chat(account, 'hello', 500);
    expect(response.status).toBe(402);
    expect(response.body).toMatchObject({
      error: 'Payment required',
      code: 'PAYMENT_REQUIRED',
      reason: 'insufficient_balance',
      currentBalanceUsd: 0.2,
      requiredUsd: 0.5,
      supportedTokens: ['USDC'],
      supportedChains: ['base', 'solana'],
      topUpInstructions: { network: 'eip155:8453', tokenDecimals: 6, minimumAmountUsd: 5 },
      siwxChallenge: { info: { domain: 'api.example.test', uri: ORIGIN, version: '1' } },
    });
    const header = JSON.parse(
      Buffer.from(response.headers.get('payment-required') ?? '', 'base64').toString(),
    );
    expect(header).toMatchObject({
      x402Version: 2,
      accepts: [{ network: 'eip155:8453', amount: '10000000' }],
      extensions: { 'sign-in-with-x': { info: { domain: 'api.example.test' } } },
    });
    expect((await services.ledger.getBalance(wallet.id)).usdNano).toBe(200_000_000n);
  });

  test('behavior: a wallet under the 0.10 USD admission minimum gets the wallet 402 before any work', async () => {
    const { account } = await walletWithCredit(50_000_000n);
    const calls = handlerCalls;
    const response = await chat(account);
    expect(response.status).toBe(402);
    expect(response.body.code).toBe('PAYMENT_REQUIRED');
    expect(response.body.currentBalanceUsd).toBe(0.05);
    expect(handlerCalls).toBe(calls);
  });

  test('behavior: the admission 402 frees the slot it was checked with: requests in a row are never 429', async () => {
    const { account, wallet } = await walletWithCredit(99_999_999n);
    const statuses: number[] = [];
    for (let i = 0; i < 7; i++) statuses.push((await chat(account)).status);
    expect(statuses).toEqual([402, 402, 402, 402, 402, 402, 402]);
    const slots = await services.database.db
      .selectFrom('wallet_request_slots')
      .select('id')
      .where('account_id', '=', wallet.id)
      .execute();
    expect(slots).toEqual([]);
    // One nano more than the minimum's shortfall, and the wallet is admitted.
    await services.ledger.topUp({ accountId: wallet.id, amountNano: 1n });
    expect((await chat(account)).status).toBe(200);
  });

  test('behavior: at most 5 requests of one wallet in flight; the 6th -> 429, and slots come back', async () => {
    const { account } = await walletWithCredit(1_000_000_000n);
    const other = await walletWithCredit(1_000_000_000n);
    holding = 0;
    held = new Promise<void>((resolve) => {
      releaseHeld = resolve;
    });
    const inFlight = Array.from({ length: 5 }, () => chat(account, 'hold'));
    while (holding < 5) await new Promise((resolve) => setTimeout(resolve, 20));
    const sixth = await chat(account);
    expect(sixth.status).toBe(429);
    expect(sixth.body.code).toBe('X402_CONCURRENCY_LIMIT');
    // Another wallet is not affected.
    expect((await chat(other.account)).status).toBe(200);
    releaseHeld();
    expect((await Promise.all(inFlight)).map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
    expect((await chat(account)).status).toBe(200);
  });
});
