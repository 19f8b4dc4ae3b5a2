/**
 * Sign-In-With-X end to end through HTTP on the real server (SQLite, and PostgreSQL for the cross-process
 * nonce race): both header names and both payload shapes, EVM and Solana, every refusal code, the wallet
 * mismatch, the balance and transaction history endpoints, and payment headers on other routes.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { Services } from '../../server/services.ts';
import { type StartedPostgres, startPostgres } from '../support/postgres.ts';
import { startServer as startTestServer } from '../support/server.ts';
import {
  evmSignIn,
  evmSignInFields,
  freshNonce,
  solanaSignIn,
  solanaWallet,
  toBase64Json,
} from '../support/x402/siwx.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-siwx-'));
const ORIGIN = 'https://api.example.test';

const startServer = (databaseUrl: string) =>
  startTestServer(databaseUrl, {
    PUBLIC_ORIGIN: ORIGIN,
    X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
  });

type Server = Awaited<ReturnType<typeof startServer>>;

// biome-ignore lint/suspicious/noExplicitAny: a response body as tests read it; the assertions check its shape.
type Json = any;

async function call(server: Server, path: string, headers: Record<string, string> = {}) {
  const response = await fetch(`${server.base}${path}`, { headers });
  return { status: response.status, headers: response.headers, body: (await response.json()) as Json };
}

describe('Sign-In-With-X on SQLite', () => {
  let server: Server;
  let services: Services;
  const account = privateKeyToAccount(generatePrivateKey());
  const other = privateKeyToAccount(generatePrivateKey());
  const balancePath = `/x402/balance/${account.address}`;

  beforeAll(async () => {
    server = await startServer(`sqlite:${join(scratch, 'siwx.db')}`);
    services = server.services;
  });
  afterAll(async () => {
    await server?.close();
  });

  const signIn = (options: Parameters<typeof evmSignIn>[1] extends infer O ? Partial<O> : never = {}) =>
    evmSignIn(account, { origin: ORIGIN, ...options });

  test('behavior: an EOA signed EIP-4361 message signs in, under both header names, with every chainId form', async () => {
    for (const chainId of [8453, '8453', 'eip155:8453']) {
      const ok = await call(server, balancePath, { 'SIGN-IN-WITH-X': await signIn({ chainId }) });
      expect(ok.status).toBe(200);
      expect(ok.body.data).toMatchObject({
        walletAddress: account.address,
        balanceUsd: 0,
        canConsume: false,
        minimumTopUpUsd: 5,
        suggestedTopUpUsd: 10,
        diemBalanceUsd: 0,
      });
    }
    const legacy = await call(server, balancePath, { 'X-Sign-In-With-X': await signIn() });
    expect(legacy.status).toBe(200);
    // The same wallet is one account however it signs in.
    const wallet = await services.accounts.findWalletAccount(account.address);
    expect(wallet?.kind).toBe('wallet');
    expect(await services.accounts.list({ kind: 'wallet' })).toHaveLength(1);
  });

  test('behavior: the x402 extension shape from the stock client helper signs in', async () => {
    const header = await evmSignInFields(account, { origin: ORIGIN });
    const response = await call(server, balancePath, { 'SIGN-IN-WITH-X': header });
    expect(response.status).toBe(200);
    const replay = await call(server, balancePath, { 'SIGN-IN-WITH-X': header });
    expect(replay.body.code).toBe('X402_SIGN_IN_NONCE_REUSED');
  });

  test('behavior: a Solana wallet signs in with a base58 or a base64 signature', async () => {
    const wallet = solanaWallet();
    for (const encoding of ['base58', 'base64'] as const) {
      const response = await call(server, `/x402/balance/${wallet.address}`, {
        'SIGN-IN-WITH-X': solanaSignIn(wallet, { origin: ORIGIN, encoding }),
      });
      expect(response.status, JSON.stringify(response.body)).toBe(200);
      expect(response.body.data.walletAddress).toBe(wallet.address);
    }
    const forged = solanaSignIn(wallet, { origin: ORIGIN, address: solanaWallet().address });
    const refused = await call(server, `/x402/balance/${wallet.address}`, { 'SIGN-IN-WITH-X': forged });
    expect(refused.status).toBe(401);
    expect(refused.body.code).toBe('X402_SIGN_IN_ADDRESS_MISMATCH');
    const wrongChain = solanaSignIn(wallet, {
      origin: ORIGIN,
      chainReference: 'EtWTRABZaYq6iMfeYKouRu166VU2xqa1',
    });
    expect(
      (await call(server, `/x402/balance/${wallet.address}`, { 'SIGN-IN-WITH-X': wrongChain })).body.code,
    ).toBe('X402_SIGN_IN_CHAIN_MISMATCH');
  });

  const refusals: Array<[string, () => Promise<string>, string]> = [
    ['wrong domain', () => signIn({ domain: 'evil.example.test' }), 'X402_SIGN_IN_DOMAIN_MISMATCH'],
    ['wrong URI', () => signIn({ uri: 'https://evil.example.test' }), 'X402_SIGN_IN_DOMAIN_MISMATCH'],
    [
      'chain other than Base',
      () => signIn({ chainId: 1, messageChainId: 1 }),
      'X402_SIGN_IN_UNSUPPORTED_CHAIN',
    ],
    [
      'message chain differs from the header',
      () => signIn({ messageChainId: 1 }),
      'X402_SIGN_IN_CHAIN_MISMATCH',
    ],
    ['unparseable chainId', () => signIn({ chainId: 'base-mainnet' }), 'X402_SIGN_IN_INVALID_CHAIN_ID'],
    [
      'issued too long ago',
      () => signIn({ issuedAt: new Date(Date.now() - 10 * 60_000) }),
      'X402_SIGN_IN_EXPIRED',
    ],
    [
      'expiration time passed',
      () => signIn({ issuedAt: new Date(Date.now() - 60_000), expirationTime: new Date(Date.now() - 1000) }),
      'X402_SIGN_IN_EXPIRED',
    ],
    [
      'issued in the future',
      () => signIn({ issuedAt: new Date(Date.now() + 5 * 60_000) }),
      'X402_SIGN_IN_FUTURE_TIMESTAMP',
    ],
    [
      'not valid before a later time',
      () => signIn({ notBefore: new Date(Date.now() + 5 * 60_000) }),
      'X402_SIGN_IN_NOT_BEFORE',
    ],
    [
      'timestamp far from Issued At',
      () => signIn({ timestamp: Date.now() - 60 * 60_000 }),
      'X402_SIGN_IN_TIMESTAMP_MISMATCH',
    ],
    [
      'signed by another key',
      async () => {
        const forged = JSON.parse(Buffer.from(await signIn(), 'base64').toString());
        const byOther = JSON.parse(
          Buffer.from(await evmSignIn(other, { origin: ORIGIN }), 'base64').toString(),
        );
        return toBase64Json({ ...forged, signature: byOther.signature });
      },
      'X402_SIGN_IN_INVALID_SIGNATURE',
    ],
    [
      'address differs from the message',
      () => signIn({ address: other.address }),
      'X402_SIGN_IN_ADDRESS_MISMATCH',
    ],
    ['not base64', async () => '%%%not-base64%%%', 'X402_SIGN_IN_PARSE_ERROR'],
    ['not JSON', async () => Buffer.from('{nope').toString('base64'), 'X402_SIGN_IN_PARSE_ERROR'],
    ['wrong fields', async () => toBase64Json({ address: 1, message: 2 }), 'X402_SIGN_IN_INVALID_PAYLOAD'],
    [
      'not a sign-in message',
      async () =>
        toBase64Json({ address: account.address, message: 'hello', signature: '0x00', chainId: 8453 }),
      'X402_SIGN_IN_INVALID_MESSAGE',
    ],
  ];

  test.each(refusals)('behavior: %s -> 401 %s', async (_name, make, code) => {
    const response = await call(server, balancePath, { 'SIGN-IN-WITH-X': await make() });
    expect(response.status).toBe(401);
    expect(response.body.code).toBe(code);
    expect(typeof response.body.error).toBe('string');
  });

  test('behavior: a nonce is accepted once; a refused signature does not burn it', async () => {
    const nonce = freshNonce();
    const forged = JSON.parse(Buffer.from(await signIn({ nonce }), 'base64').toString());
    forged.signature = JSON.parse(
      Buffer.from(await evmSignIn(other, { origin: ORIGIN, nonce }), 'base64').toString(),
    ).signature;
    expect((await call(server, balancePath, { 'SIGN-IN-WITH-X': toBase64Json(forged) })).status).toBe(401);
    const header = await signIn({ nonce });
    expect((await call(server, balancePath, { 'SIGN-IN-WITH-X': header })).status).toBe(200);
    const again = await call(server, balancePath, { 'SIGN-IN-WITH-X': header });
    expect(again.status).toBe(401);
    expect(again.body.code).toBe('X402_SIGN_IN_NONCE_REUSED');
    // Another wallet may use the same nonce value: nonces are per wallet.
    const theirs = await evmSignIn(other, { origin: ORIGIN, nonce });
    expect((await call(server, `/x402/balance/${other.address}`, { 'SIGN-IN-WITH-X': theirs })).status).toBe(
      200,
    );
  });

  test('behavior: a signer other than the wallet in the path -> 403 X402_WALLET_MISMATCH', async () => {
    for (const path of [`/x402/balance/${other.address}`, `/x402/transactions/${other.address}`]) {
      const response = await call(server, path, { 'SIGN-IN-WITH-X': await signIn() });
      expect(response.status).toBe(403);
      expect(response.body.code).toBe('X402_WALLET_MISMATCH');
    }
    // The path address is compared without regard to EVM checksum case.
    const lower = await call(server, `/x402/balance/${account.address.toLowerCase()}`, {
      'SIGN-IN-WITH-X': await signIn(),
    });
    expect(lower.status).toBe(200);
  });

  test('behavior: API keys and missing proofs are refused on the wallet endpoints', async () => {
    const bearer = await call(server, balancePath, { authorization: 'Bearer svc_some_key_1234567890' });
    expect([401, 402]).toContain(bearer.status);
    const none = await call(server, balancePath);
    expect([401, 402]).toContain(none.status);
  });

  test('behavior: balance and transactions agree with the ledger, newest first, paginated', async () => {
    const wallet = await services.accounts.findWalletAccount(account.address);
    if (!wallet) throw new Error('no wallet account');
    await services.ledger.topUp({
      accountId: wallet.id,
      amountNano: 5_000_000_000n,
      network: 'eip155:8453',
      txHash: '0x01',
    });
    await services.ledger.topUp({
      accountId: wallet.id,
      amountNano: 2_500_000_000n,
      network: 'eip155:8453',
      txHash: '0x02',
    });
    const reservation = await services.charges.reserve(
      { kind: 'wallet', accountId: wallet.id, walletAddress: account.address },
      { amountNano: 1_000_000_000n, requestId: 'req-1', modelId: 'model-a' },
    );
    await services.charges.capture(reservation, [{ sku: 'tokens', amountNano: 250_000_000n }]);

    const balance = await call(server, balancePath, { 'SIGN-IN-WITH-X': await signIn() });
    expect(balance.body.data).toMatchObject({ balanceUsd: 7.25, canConsume: true });

    const page1 = await call(server, `/x402/transactions/${account.address}?limit=2`, {
      'SIGN-IN-WITH-X': await signIn(),
    });
    expect(page1.status).toBe(200);
    expect(page1.body.data.currentBalance).toBe(7.25);
    expect(page1.body.data.pagination).toEqual({ limit: 2, offset: 0, hasMore: true });
    expect(page1.body.data.transactions).toMatchObject([
      { type: 'CHARGE', amount: -0.25, balanceAfter: 7.25, requestId: 'req-1', modelId: 'model-a' },
      { type: 'TOP_UP', amount: 2.5, balanceAfter: 7.5, requestId: null, modelId: null },
    ]);
    const page2 = await call(server, `/x402/transactions/${account.address}?limit=2&offset=2`, {
      'SIGN-IN-WITH-X': await signIn(),
    });
    expect(page2.body.data.transactions).toMatchObject([{ type: 'TOP_UP', amount: 5, balanceAfter: 5 }]);
    expect(page2.body.data.pagination).toEqual({ limit: 2, offset: 2, hasMore: false });
    const ledger = await services.ledger.getBalance(wallet.id);
    expect(ledger.usdNano).toBe(7_250_000_000n);

    const tooMany = await call(server, `/x402/transactions/${account.address}?limit=101`, {
      'SIGN-IN-WITH-X': await signIn(),
    });
    expect(tooMany.status).toBe(400);
  });

  test('behavior: a payment header on any route but the top-up -> 400 PAYMENT_HEADER_NOT_ACCEPTED', async () => {
    for (const name of ['PAYMENT-SIGNATURE', 'X-PAYMENT', 'X-402-Payment']) {
      const response = await call(server, balancePath, {
        'SIGN-IN-WITH-X': await signIn(),
        [name]: toBase64Json({ x402Version: 2 }),
      });
      expect(response.status).toBe(400);
      expect(response.body.code).toBe('PAYMENT_HEADER_NOT_ACCEPTED');
    }
    const models = await fetch(`${server.base}/models`, { headers: { 'X-PAYMENT': 'e30=' } });
    expect(models.status).toBe(400);
  });
});

describe('Sign-In-With-X nonces on PostgreSQL shared by two server processes', () => {
  let postgres: StartedPostgres | undefined;
  let a: Server;
  let b: Server;
  beforeAll(async () => {
    postgres = await startPostgres();
    const url = await postgres.createDatabase('siwx');
    a = await startServer(url);
    b = await startServer(url);
  });
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await postgres?.stop();
    rmSync(scratch, { recursive: true, force: true });
  });

  test('behavior: one signed message sent concurrently to both servers is accepted exactly once', async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    const header = await evmSignIn(account, { origin: ORIGIN });
    const path = `/x402/balance/${account.address}`;
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => call(i % 2 ? a : b, path, { 'SIGN-IN-WITH-X': header })),
    );
    expect(results.filter((r) => r.status === 200)).toHaveLength(1);
    expect(results.filter((r) => r.body.code === 'X402_SIGN_IN_NONCE_REUSED')).toHaveLength(7);
  });
});
