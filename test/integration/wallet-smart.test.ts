/**
 * Sign-In-With-X from an EIP-1271 smart wallet deployed on a real EVM node: accepted when the server has a
 * Base RPC to ask the wallet contract, refused (offline EOA check only) without one, and refused when the
 * signer is not the wallet's owner.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { getAddress, type Hex, type LocalAccount } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import { createServices } from '../../server/services.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { deploySmartWallet } from '../support/x402/contracts.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-smart-'));
const ORIGIN = 'https://api.example.test';

let anvil: StartedAnvil;
const closers: Array<() => Promise<void>> = [];

async function startServer(env: Record<string, string>) {
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: `sqlite:${join(scratch, `${closers.length}.db`)}`,
    PUBLIC_ORIGIN: ORIGIN,
    ...env,
  });
  const services = await createServices(config, pino({ level: 'silent' }));
  const server = createApp(services.app).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  closers.push(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await services.close();
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`;
}

/** The owner signs the SIWE message, but the proof names the smart wallet as the signer. */
function asSmartWallet(owner: LocalAccount, wallet: Hex): LocalAccount {
  return { ...owner, address: wallet, signMessage: owner.signMessage } as LocalAccount;
}

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
});

afterAll(async () => {
  for (const close of closers) await close();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

describe('Sign-In-With-X from an EIP-1271 smart wallet', () => {
  test('behavior: accepted through the Base RPC; refused without it, and refused for a non-owner', async () => {
    const owner = privateKeyToAccount(generatePrivateKey());
    const wallet = await deploySmartWallet(anvil.url, ANVIL_PRIVATE_KEYS[0], owner.address);
    expect((await anvil.rpc<string>('eth_getCode', [wallet, 'latest'])).length).toBeGreaterThan(4);
    const withRpc = await startServer({ X402_BASE_RPC_URL: anvil.url });
    const withoutRpc = await startServer({});
    const path = `/x402/balance/${wallet}`;
    const call = async (base: string, signer: LocalAccount) => {
      const response = await fetch(`${base}${path}`, {
        headers: { 'SIGN-IN-WITH-X': await evmSignIn(asSmartWallet(signer, wallet), { origin: ORIGIN }) },
      });
      return { status: response.status, body: (await response.json()) as { code?: string; data?: unknown } };
    };

    const accepted = await call(withRpc, owner);
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(200);
    expect(accepted.body.data).toMatchObject({ walletAddress: getAddress(wallet) });

    const offline = await call(withoutRpc, owner);
    expect(offline.status).toBe(401);
    expect(offline.body.code).toBe('X402_SIGN_IN_INVALID_SIGNATURE');

    const stranger = await call(withRpc, privateKeyToAccount(generatePrivateKey()));
    expect(stranger.status).toBe(401);
    expect(stranger.body.code).toBe('X402_SIGN_IN_INVALID_SIGNATURE');
  });
});
