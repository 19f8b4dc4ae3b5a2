/**
 * The race the scale-out suite can hit when one x402 payment reaches two instances at once, made deterministic:
 * the second submission is verified only after the first one settled on chain (a real EVM node), so the
 * chain already refuses its authorisation. It must be answered like a known payment (409
 * `PAYMENT_ALREADY_SETTLED`), not as an invalid one (400), and the payment is credited once.
 */
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import type { Facilitator } from '../../server/providers/x402/facilitator.ts';
import { createInProcessFacilitator } from '../../server/providers/x402/in-process.ts';
import { createServices, type Services } from '../../server/services.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { withCoverage } from '../support/coverage.ts';
import { checkInvariants } from '../support/invariants.ts';
import { installTestUsdc, mintUsdc, usdcBalance } from '../support/x402/contracts.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';

// biome-ignore lint/suspicious/noExplicitAny: response bodies as tests read them; assertions check their shape.
type Json = any;

const PAY_TO = privateKeyToAccount(generatePrivateKey()).address;
let anvil: StartedAnvil;
let services: Services;
let base = '';
let close = async () => {};
/** Resolves when the first settlement finished; the second verification waits for it. */
let firstSettled: Promise<void> = Promise.resolve();

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  await installTestUsdc(anvil.rpc);
  const real = await createInProcessFacilitator({
    evm: { rpcUrl: anvil.url, privateKey: ANVIL_PRIVATE_KEYS[0] },
  });
  let verifications = 0;
  let markSettled = () => {};
  firstSettled = new Promise((resolve) => {
    markSettled = resolve;
  });
  const facilitator: Facilitator = {
    async verify(payload, requirements) {
      verifications++;
      if (verifications === 2) await firstSettled;
      return real.verify(payload, requirements);
    },
    async settle(payload, requirements) {
      try {
        return await real.settle(payload, requirements);
      } finally {
        markSettled();
      }
    },
    supported: () => real.supported(),
  };
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: 'sqlite::memory:',
    PUBLIC_ORIGIN: 'https://api.example.test',
    X402_PAY_TO_BASE: PAY_TO,
  });
  services = await createServices(config, pino({ level: 'silent' }), { facilitator });
  const server = createApp(withCoverage(services.app)).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`;
  close = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await services.close();
  };
}, 120_000);

afterAll(async () => {
  await close();
  await anvil?.stop();
});

async function topUp(headers: Record<string, string> = {}) {
  const response = await fetch(`${base}/x402/top-up`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ amountUsd: 6 }),
  });
  return { status: response.status, body: (await response.json()) as Json };
}

describe('x402 top-up: a submission verified after a concurrent one settled', () => {
  test('behavior: answers 409 PAYMENT_ALREADY_SETTLED (not 400) and the payment is credited once', async () => {
    const payer = privateKeyToAccount(generatePrivateKey());
    await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], payer.address, 20_000_000n);
    const offer = await topUp();
    expect(offer.status).toBe(402);
    const header = await evmPaymentHeader(offer.body, payer);
    const [first, second] = await Promise.all([
      topUp({ 'PAYMENT-SIGNATURE': header }),
      topUp({ 'PAYMENT-SIGNATURE': header }),
    ]);
    expect([first.status, second.status].sort(), JSON.stringify([first.body, second.body])).toEqual([
      200, 409,
    ]);
    expect([first, second].find((r) => r.status === 409)?.body).toMatchObject({
      code: 'PAYMENT_ALREADY_SETTLED',
    });
    const wallet = await services.accounts.findWalletAccount(payer.address);
    const entries = wallet ? await services.ledger.listEntries(wallet.id) : [];
    expect(entries.map((e) => [e.type, e.amountNano])).toEqual([['TOP_UP', 6_000_000_000n]]);
    expect(await usdcBalance(anvil.url, PAY_TO)).toBe(6_000_000n);
    expect((await checkInvariants(services.database)).violations).toEqual([]);
  });
});
