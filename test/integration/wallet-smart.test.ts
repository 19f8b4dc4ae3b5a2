/**
 * Sign-In-With-X from smart wallets on a real EVM node. EIP-1271 (deployed): accepted when the server has a Base
 * RPC to ask the wallet contract, refused (offline EOA check only) without one, and refused when the signer is
 * not the wallet's owner. ERC-6492 (counterfactual, deployed later by a CREATE2 factory): accepted when the
 * factory is in `X402_EIP6492_FACTORIES`, without deploying the wallet; refused with a wrong inner signature or
 * an untrusted factory; once deployed, the same wallet signs in with plain EIP-1271. The same allow-list governs
 * payments: a counterfactual payer tops up only through a listed factory (the facilitator deploys it).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getAddress, type Hex, type LocalAccount, toHex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { startServer as startTestServer } from '../support/server.ts';
import {
  counterfactualWallet,
  deploySmartWallet,
  deployWalletFactory,
  installTestUsdc,
  mintUsdc,
  usdcBalance,
} from '../support/x402/contracts.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const scratch = mkdtempSync(join(tmpdir(), 'wallet-smart-'));
const ORIGIN = 'https://api.example.test';

let anvil: StartedAnvil;
const closers: Array<() => Promise<void>> = [];

async function startServer(env: Record<string, string>) {
  const server = await startTestServer(`sqlite:${join(scratch, `${closers.length}.db`)}`, {
    PUBLIC_ORIGIN: ORIGIN,
    ...env,
  });
  closers.push(server.close);
  return server.base;
}

/**
 * The owner signs the SIWE message, but the proof names the smart wallet as the signer (`wrap`: the signature as
 * a counterfactual wallet sends it, ERC-6492-wrapped).
 */
function asSmartWallet(owner: LocalAccount, wallet: Hex, wrap?: (signature: Hex) => Hex): LocalAccount {
  const signMessage: LocalAccount['signMessage'] = async (args) => {
    const signature = await owner.signMessage(args);
    return wrap ? wrap(signature) : signature;
  };
  return { ...owner, address: wallet, signMessage } as LocalAccount;
}

async function balanceCall(base: string, account: LocalAccount) {
  const response = await fetch(`${base}/x402/balance/${account.address}`, {
    headers: { 'SIGN-IN-WITH-X': await evmSignIn(account, { origin: ORIGIN }) },
  });
  return { status: response.status, body: (await response.json()) as { code?: string; data?: unknown } };
}

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  await installTestUsdc(anvil.rpc);
});

afterAll(async () => {
  for (const close of closers) await close();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

describe('Smart wallets (EIP-1271, ERC-6492): sign-in and payment', () => {
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

  test('behavior: ERC-6492 counterfactual wallet: accepted for a listed factory without deploying; refused otherwise; plain 1271 once deployed', async () => {
    const factory = await deployWalletFactory(anvil.url, ANVIL_PRIVATE_KEYS[0]);
    const otherFactory = await deployWalletFactory(anvil.url, ANVIL_PRIVATE_KEYS[0]);
    const owner = privateKeyToAccount(generatePrivateKey());
    const wallet = await counterfactualWallet(anvil.url, factory, owner.address, toHex(7n, { size: 32 }));
    const code = () => anvil.rpc<string>('eth_getCode', [wallet.address, 'latest']);
    expect(await code()).toBe('0x');

    const trusting = await startServer({ X402_BASE_RPC_URL: anvil.url, X402_EIP6492_FACTORIES: factory });
    const untrusting = await startServer({
      X402_BASE_RPC_URL: anvil.url,
      X402_EIP6492_FACTORIES: otherFactory,
    });
    const unlisted = await startServer({ X402_BASE_RPC_URL: anvil.url });
    const counterfactual = asSmartWallet(owner, wallet.address, wallet.wrap);

    const accepted = await balanceCall(trusting, counterfactual);
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(200);
    expect(accepted.body.data).toMatchObject({ walletAddress: getAddress(wallet.address) });
    // Verification simulated the factory; it did not deploy the wallet.
    expect(await code()).toBe('0x');

    const stranger = privateKeyToAccount(generatePrivateKey());
    const forged = await balanceCall(trusting, asSmartWallet(stranger, wallet.address, wallet.wrap));
    expect(forged.status).toBe(401);
    expect(forged.body.code).toBe('X402_SIGN_IN_INVALID_SIGNATURE');

    for (const base of [untrusting, unlisted]) {
      const refused = await balanceCall(base, counterfactual);
      expect(refused.status).toBe(401);
      expect(refused.body.code).toBe('X402_SIGN_IN_FACTORY_NOT_ALLOWED');
    }
    // An unwrapped signature for a wallet that does not exist yet is no proof.
    const bare = await balanceCall(trusting, asSmartWallet(owner, wallet.address));
    expect(bare.body.code).toBe('X402_SIGN_IN_INVALID_SIGNATURE');
    expect(await code()).toBe('0x');

    // Deployed (by anyone, through the factory): the same wallet signs in with plain EIP-1271, and a
    // still-wrapped signature no longer needs a trusted factory.
    await wallet.deploy(ANVIL_PRIVATE_KEYS[2]);
    expect((await code()).length).toBeGreaterThan(4);
    for (const base of [trusting, unlisted]) {
      expect((await balanceCall(base, asSmartWallet(owner, wallet.address))).status).toBe(200);
      expect((await balanceCall(base, counterfactual)).status).toBe(200);
    }
    expect((await balanceCall(unlisted, asSmartWallet(stranger, wallet.address))).body.code).toBe(
      'X402_SIGN_IN_INVALID_SIGNATURE',
    );
  });

  test('behavior: X402_EIP6492_FACTORIES for payments: a counterfactual payer of a listed factory tops up (deployed by the facilitator); of an unlisted one it is refused', async () => {
    const factory = await deployWalletFactory(anvil.url, ANVIL_PRIVATE_KEYS[0]);
    const payTo = privateKeyToAccount(generatePrivateKey()).address;
    const env = {
      X402_BASE_RPC_URL: anvil.url,
      X402_FACILITATOR_PRIVATE_KEY: ANVIL_PRIVATE_KEYS[3],
      X402_PAY_TO_BASE: payTo,
    };
    const listed = await startServer({ ...env, X402_EIP6492_FACTORIES: factory });
    const unlisted = await startServer(env);
    const owner = privateKeyToAccount(generatePrivateKey());
    const wallet = await counterfactualWallet(anvil.url, factory, owner.address, toHex(11n, { size: 32 }));
    await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], wallet.address, 20_000_000n);
    // The wallet's signer: the owner signs the EIP-3009 typed data, sent ERC-6492-wrapped as the wallet.
    const signer = {
      address: wallet.address,
      signTypedData: async (typedData: Parameters<typeof owner.signTypedData>[0]) =>
        wallet.wrap(await owner.signTypedData(typedData)),
    };
    const topUp = async (base: string, headers: Record<string, string> = {}) => {
      const response = await fetch(`${base}/x402/top-up`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ amountUsd: 5 }),
      });
      return { status: response.status, body: (await response.json()) as Record<string, unknown> };
    };
    const pay = async (base: string) => {
      const offer = await topUp(base);
      expect(offer.status).toBe(402);
      return topUp(base, { 'PAYMENT-SIGNATURE': await evmPaymentHeader(offer.body, signer as never) });
    };

    const refused = await pay(unlisted);
    expect(refused.status).toBe(400);
    expect(refused.body.code).toBe('PAYMENT_VERIFICATION_FAILED');
    expect(String(refused.body.error)).toContain('factory');
    expect(await anvil.rpc<string>('eth_getCode', [wallet.address, 'latest'])).toBe('0x');
    expect(await usdcBalance(anvil.url, wallet.address)).toBe(20_000_000n);

    const paid = await pay(listed);
    expect(paid.status, JSON.stringify(paid.body)).toBe(200);
    expect(paid.body.data).toMatchObject({ walletAddress: getAddress(wallet.address), amountCredited: 5 });
    expect((await anvil.rpc<string>('eth_getCode', [wallet.address, 'latest'])).length).toBeGreaterThan(4);
    expect(await usdcBalance(anvil.url, wallet.address)).toBe(15_000_000n);
    expect(await usdcBalance(anvil.url, payTo)).toBe(5_000_000n);
  });
});
