/**
 * Wallet-paid chat end to end on the real handlers (local engine): a SIWX-signed chat request is charged to
 * the wallet; `/x402/transactions` lists the CHARGE with the request id and the model id; `X-Balance-Remaining`,
 * the balance endpoint and the ledger agree with the `cost` the answer reports; a streamed answer is billed the
 * same way; a wallet under the admission minimum gets the wallet 402. The JSON-RPC proxy takes the wallet
 * scheme too.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readChatCompletionChunks } from '../../client/index.ts';
import { formatUsdFixed, parseUsdToNano } from '../../server/money.ts';
import { type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { type StartedServer, startServer } from '../support/server.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const ORIGIN = 'https://api.example.test';
const scratch = mkdtempSync(join(tmpdir(), 'wallet-inference-'));
let server: StartedServer;
let anvil: StartedAnvil;

beforeAll(async () => {
  anvil = await startAnvil();
  server = await startServer(`sqlite:${join(scratch, 'wallet-inference.db')}`, {
    PUBLIC_ORIGIN: ORIGIN,
    X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
    RPC_UPSTREAM_BASE_MAINNET: anvil.url,
  });
});

afterAll(async () => {
  await server?.close();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

type Account = ReturnType<typeof privateKeyToAccount>;

async function walletWithCredit(nano: bigint) {
  const account = privateKeyToAccount(generatePrivateKey());
  const { account: wallet } = await server.services.accounts.findOrCreateWalletAccount(account.address);
  if (nano > 0n) {
    await server.services.ledger.topUp({
      accountId: wallet.id,
      amountNano: nano,
      network: 'eip155:8453',
      txHash: `0x${account.address.slice(2).toLowerCase()}`,
    });
  }
  return { account, wallet };
}

async function signed(account: Account) {
  return { 'SIGN-IN-WITH-X': await evmSignIn(account, { origin: ORIGIN }) };
}

async function chat(account: Account, body: Record<string, unknown>) {
  return fetch(`${server.directBase}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(await signed(account)) },
    body: JSON.stringify({
      model: 'llama-3.3-70b',
      seed: 11,
      max_completion_tokens: 40,
      messages: [{ role: 'user', content: 'Tell me about wallets.' }],
      ...body,
    }),
  });
}

async function getJson(account: Account, path: string) {
  const response = await fetch(`${server.directBase}${path}`, { headers: await signed(account) });
  expect(response.status).toBe(200);
  // biome-ignore lint/suspicious/noExplicitAny: the assertions check the shape.
  return (await response.json()) as any;
}

describe('wallet-paid chat on the real handlers', () => {
  test('behavior: a SIWX-signed chat is charged to the wallet; transactions, header, balance and ledger agree', async () => {
    const { account, wallet } = await walletWithCredit(2_000_000_000n);
    const response = await chat(account, {});
    expect(response.status).toBe(200);
    const body = (await response.json()) as { cost: { usd: number }; model: string };
    const requestId = response.headers.get('cf-ray');
    const costNano = parseUsdToNano(String(body.cost.usd));
    expect(costNano).toBeGreaterThan(0n);

    const ledger = await server.services.ledger.getBalance(wallet.id);
    expect(ledger.usdNano).toBe(2_000_000_000n - costNano);
    expect(ledger.usdReservedNano).toBe(0n);
    const remaining = response.headers.get('x-balance-remaining');
    // The header shows the balance to the micro-dollar, as USDC does.
    expect(remaining).toBe(formatUsdFixed(ledger.usdNano, 6));

    const history = await getJson(account, `/x402/transactions/${account.address}`);
    const charges = history.data.transactions.filter((t: { type: string }) => t.type === 'CHARGE');
    // One CHARGE line per priced item (input, output tokens), all with the request id and model id.
    expect(charges.length).toBeGreaterThanOrEqual(1);
    for (const charge of charges) expect(charge).toMatchObject({ requestId, modelId: 'llama-3.3-70b' });
    const charged = charges.reduce(
      (sum: bigint, charge: { amount: number }) => sum + parseUsdToNano(String(-charge.amount)),
      0n,
    );
    expect(charged).toBe(costNano);
    const balance = await getJson(account, `/x402/balance/${account.address}`);
    expect(parseUsdToNano(String(balance.data.balanceUsd))).toBe(ledger.usdNano);
  });

  test('behavior: a streamed wallet chat is billed what its final chunk reports', async () => {
    const { account, wallet } = await walletWithCredit(2_000_000_000n);
    const response = await chat(account, { stream: true, stream_options: { include_usage: true } });
    expect(response.status).toBe(200);
    let costUsd: number | undefined;
    for await (const chunk of readChatCompletionChunks(response.body as ReadableStream<Uint8Array>)) {
      const cost = (chunk as { cost?: { usd: number } }).cost;
      if (cost) costUsd = cost.usd;
    }
    expect(costUsd).toBeGreaterThan(0);
    // A stream's end does not wait for its capture (Charges.captureDetached): read the ledger once it is done.
    await server.services.charges.idle();
    const ledger = await server.services.ledger.getBalance(wallet.id);
    expect(ledger.usdNano).toBe(2_000_000_000n - parseUsdToNano(String(costUsd)));
    expect(ledger.usdReservedNano).toBe(0n);
  });

  test('behavior: a wallet under the admission minimum gets the wallet 402 with PAYMENT-REQUIRED; nothing charged', async () => {
    const { account, wallet } = await walletWithCredit(50_000_000n);
    const response = await chat(account, {});
    expect(response.status).toBe(402);
    expect(await response.json()).toMatchObject({ code: 'PAYMENT_REQUIRED', supportedTokens: ['USDC'] });
    expect(response.headers.get('payment-required')).toBeTruthy();
    expect((await server.services.ledger.getBalance(wallet.id)).usdNano).toBe(50_000_000n);
  });

  test('behavior: a SIWX-signed JSON-RPC call is forwarded and its credits charged to the wallet', async () => {
    const { account, wallet } = await walletWithCredit(1_000_000_000n);
    const response = await fetch(`${server.directBase}/crypto/rpc/base-mainnet`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(await signed(account)) },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_chainId', params: [] }),
    });
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ jsonrpc: '2.0', id: 1, result: '0x2105' });
    expect(response.headers.get('x-service-rpc-credits')).toBe('20');
    expect(response.headers.get('x-service-rpc-cost-usd')).toBe('0.00001400');
    // 20 credits at 7e-7 USD: 14,000 nano-USD.
    const ledger = await server.services.ledger.getBalance(wallet.id);
    expect(ledger.usdNano).toBe(1_000_000_000n - 14_000n);
    expect(response.headers.get('x-balance-remaining')).toBe(formatUsdFixed(ledger.usdNano, 6));
    const history = await getJson(account, `/x402/transactions/${account.address}`);
    expect(history.data.transactions[0]).toMatchObject({
      type: 'CHARGE',
      requestId: response.headers.get('x-request-id'),
    });
  });
});
