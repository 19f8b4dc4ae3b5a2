/**
 * A signed x402 payment while the Base node fails (answers garbage, or 500): the top-up answers in the error
 * shape and the process lives on. @x402/evm checks the token in the background and may not await that check;
 * the node failure must not become an unhandled rejection, which ends a Node process
 * (server/providers/x402/in-process.ts guards it).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type RpcStandIn, startRpcStandIn } from '../support/rpc-upstream.ts';
import { type StartedServer, startServer } from '../support/server.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';

const scratch = mkdtempSync(join(tmpdir(), 'x402-node-'));
const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown) => unhandled.push(reason);

describe.each<['garbage' | 'error500']>([['garbage'], ['error500']])('a Base node answering %s', (mode) => {
  let node: RpcStandIn;
  let server: StartedServer;

  beforeAll(async () => {
    process.on('unhandledRejection', onUnhandled);
    node = await startRpcStandIn(mode);
    server = await startServer(`sqlite:${join(scratch, `${mode}.db`)}`, {
      PUBLIC_ORIGIN: 'https://api.example.test',
      X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
      X402_BASE_RPC_URL: node.url,
      X402_FACILITATOR_PRIVATE_KEY: generatePrivateKey(),
    });
  });

  afterAll(async () => {
    await server?.close();
    await node?.close();
    process.off('unhandledRejection', onUnhandled);
  });

  test('behavior: a signed payment is refused in the error shape, nothing is credited, nothing is left unhandled', async () => {
    const topUp = (headers: Record<string, string> = {}) =>
      fetch(`${server.directBase}/x402/top-up`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ amountUsd: 5 }),
      });
    const offer = await topUp();
    expect(offer.status).toBe(402);
    const payer = privateKeyToAccount(generatePrivateKey());
    const paid = await topUp({ 'payment-signature': await evmPaymentHeader(await offer.json(), payer) });
    const body = (await paid.json()) as { error?: unknown };
    expect(paid.status).toBeGreaterThanOrEqual(400);
    expect(typeof body.error).toBe('string');
    // The node was asked (the failure is real), and the background check had time to settle.
    expect(node.requests.length).toBeGreaterThan(0);
    await new Promise((resolve) => setImmediate(resolve));
    expect(unhandled).toEqual([]);
    expect(await server.services.accounts.findWalletAccount(payer.address)).toBeUndefined();
    // Still serving.
    expect((await topUp()).status).toBe(402);
  });
});

afterAll(() => rmSync(scratch, { recursive: true, force: true }));
