/**
 * The wallet journey as an Arazzo workflow (test/workflows/wallet-topup-chat.arazzo.yaml) run by Redocly
 * Respect against the real server, paid for real: anvil as Base (chain 8453) with the EIP-3009 test token, the
 * server's facilitator settling through it. Respect cannot sign, so this harness signs what a wallet would (the
 * USDC payment for the server's own 402 requirements, one Sign-In-With-X proof per signed step) and passes them
 * as workflow inputs.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { runWorkflows } from '../support/respect.ts';
import { type StartedServer, startServer } from '../support/server.ts';
import { installTestUsdc, mintUsdc, usdcBalance } from '../support/x402/contracts.ts';
import { walletInputs } from '../support/x402/wallet-journey.ts';

const ORIGIN = 'https://api.example.test';
const PAY_TO = privateKeyToAccount(generatePrivateKey()).address;
const scratch = mkdtempSync(join(tmpdir(), 'wallet-workflow-'));
let anvil: StartedAnvil;
let server: StartedServer;

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  await installTestUsdc(anvil.rpc);
  server = await startServer(
    `sqlite:${join(scratch, 'wallet-workflow.db')}`,
    {
      PUBLIC_ORIGIN: ORIGIN,
      X402_PAY_TO_BASE: PAY_TO,
      X402_BASE_RPC_URL: anvil.url,
      X402_FACILITATOR_PRIVATE_KEY: ANVIL_PRIVATE_KEYS[0],
    },
    { proxy: false },
  );
});

afterAll(async () => {
  await server?.close();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

describe('the wallet journey (Redocly Respect) against the real server', () => {
  test('behavior: a wallet tops up (402, then paid), signs in, calls chat and sees the CHARGE and its balance', async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], account.address, 10_000_000n);
    const result = await runWorkflows('wallet-topup-chat.arazzo.yaml', {
      server: server.directBase,
      inputs: await walletInputs(server.directBase, account, ORIGIN),
    });
    expect(result.failedSteps, result.output).toEqual([]);
    expect(result.passedSteps).toEqual([
      'challenge',
      'topUp',
      'signIn',
      'chat',
      'transactions',
      'balanceAfter',
    ]);
    expect(result.code, result.output).toBe(0);
    // The USDC moved on chain, once.
    expect(await usdcBalance(anvil.url, account.address)).toBe(5_000_000n);
    expect(await usdcBalance(anvil.url, PAY_TO)).toBe(5_000_000n);
  });

  test('fault: the journey fails when the chat is not charged to the wallet (its signed proof is replayed)', async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], account.address, 10_000_000n);
    const inputs = await walletInputs(server.directBase, account, ORIGIN);
    // The chat step reuses the sign-in proof of the balance step: its nonce is spent, so the server refuses it.
    const result = await runWorkflows('wallet-topup-chat.arazzo.yaml', {
      server: server.directBase,
      inputs: { ...inputs, signInChat: inputs.signInBalance as string },
    });
    expect(result.failedSteps).toContain('chat');
    expect(result.code).not.toBe(0);
  });
});
