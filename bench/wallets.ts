/**
 * The wallet-paid targets' wallets and headers: funded wallets (EVM private keys, Solana key pairs), each with
 * a wallet account credited before the server starts, their `SIGN-IN-WITH-X` headers (a fresh one for every
 * request: the server accepts each proof's nonce once, and a message issued at most five minutes before), the
 * environment a server needs to take them, and the wallet-paid chat. A module of its own, not part of
 * setup.ts: its signing stacks (viem, `@x402/extensions`; about 60 MB and a second to load) then stay out of
 * the processes that do not sign, among them bench/inproc.ts's, where the server measured shares the process.
 */
import { randomBytes } from 'node:crypto';
import { secp256k1 } from '@noble/curves/secp256k1';
import { encodeBase58 } from '@x402/extensions/sign-in-with-x';
import { type Hex, hashMessage, numberToHex, serializeSignature } from 'viem';
import { generatePrivateKey, privateKeyToAddress } from 'viem/accounts';
import { parseUsdToNano } from '../server/money.ts';
import { createAccounts, createDatabase, createLedger, migrate } from '../server/storage/index.ts';
import {
  evmSignInHeader,
  evmSignInMessage,
  freshNonce,
  SOLANA_MAINNET,
  type SolanaWallet,
  solanaSignIn,
  solanaWallet,
} from '../test/support/x402/siwx.ts';
import type { Target } from './measure.ts';
import { json, localChatTarget } from './setup.ts';

/**
 * The public origin of a server that takes wallet sign-ins (`PUBLIC_ORIGIN`): a sign-in message's domain and
 * URI must be the server's own origin, never one a request names, so the harness signs for this one.
 */
export const WALLET_ORIGIN = 'https://bench.example.test';

/**
 * What a server needs in its environment for the wallet targets (as the wallet integration tests start theirs):
 * its public origin, and a Base address to be paid at, which the wallet 402 names. A Solana sign-in needs no
 * more: the Solana pay-to address and facilitator are for top-ups, which the harness does not make.
 */
export const walletEnv = {
  PUBLIC_ORIGIN: WALLET_ORIGIN,
  X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
};

/** A wallet that signs in: an EVM private key (an EOA, checked offline), or a Solana ed25519 key pair. */
export type Wallet =
  | { kind: 'evm'; address: string; privateKey: Hex }
  | { kind: 'solana'; address: string; keyPair: SolanaWallet };

/** The chain each kind of wallet is credited on, as its top-ups are. */
const WALLET_NETWORK = { evm: 'eip155:8453', solana: SOLANA_MAINNET } as const;

/**
 * `count` wallets of `kind` (one unless told), each with a wallet account credited 100,000,000 USD as a top-up
 * on its chain would credit it (a transaction id of its own), written through the storage API before the
 * server starts, in one session of the database.
 */
export async function fundedWallets(databaseUrl: string, kind: Wallet['kind'], count = 1): Promise<Wallet[]> {
  const database = await createDatabase(databaseUrl);
  try {
    await migrate(database);
    const accounts = createAccounts(database);
    const ledger = createLedger(database);
    const wallets: Wallet[] = [];
    for (let n = 0; n < count; n++) {
      const wallet = newWallet(kind);
      const { account } = await accounts.findOrCreateWalletAccount(wallet.address);
      await ledger.topUp({
        accountId: account.id,
        amountNano: parseUsdToNano('100000000'),
        network: WALLET_NETWORK[kind],
        // A transaction hash on Base, a signature (64 bytes, base58) on Solana.
        txHash: kind === 'evm' ? `0x${randomBytes(32).toString('hex')}` : encodeBase58(randomBytes(64)),
      });
      wallets.push(wallet);
    }
    return wallets;
  } finally {
    await database.close();
  }
}

/** One funded wallet of `kind` (`fundedWallets`). */
export async function fundedWallet(databaseUrl: string, kind: Wallet['kind']): Promise<Wallet> {
  const [wallet] = await fundedWallets(databaseUrl, kind);
  if (!wallet) throw new Error('no wallet funded');
  return wallet;
}

function newWallet(kind: Wallet['kind']): Wallet {
  if (kind === 'solana') {
    const keyPair = solanaWallet();
    return { kind, address: keyPair.address, keyPair };
  }
  const privateKey = generatePrivateKey();
  return { kind, address: privateKeyToAddress(privateKey), privateKey };
}

/**
 * A fresh `SIGN-IN-WITH-X` header of `wallet` for the server at `origin` (a new nonce, issued now; or the
 * `nonce` and `issuedAt` given), in the interface's shape, built by the tests' helpers
 * (test/support/x402/siwx.ts: the EVM message and header, the Solana sign-in). Synchronous, so that a header
 * can be signed for a request autocannon is building: an EVM message is signed as viem's `signMessage` signs
 * it (the same deterministic signature; it is asynchronous only in name), with `@noble/curves` directly.
 */
export function signIn(
  wallet: Wallet,
  origin = WALLET_ORIGIN,
  options: { nonce?: string; issuedAt?: Date } = {},
): string {
  const issuedAt = options.issuedAt ?? new Date();
  const nonce = options.nonce ?? freshNonce();
  if (wallet.kind === 'solana') return solanaSignIn(wallet.keyPair, { origin, issuedAt, nonce });
  const { message } = evmSignInMessage(wallet.address as Hex, { origin, issuedAt, nonce });
  const { r, s, recovery } = secp256k1.sign(hashMessage(message).slice(2), wallet.privateKey.slice(2), {
    lowS: true,
  });
  const signature = serializeSignature({
    r: numberToHex(r, { size: 32 }),
    s: numberToHex(s, { size: 32 }),
    yParity: recovery,
  });
  return evmSignInHeader(wallet.address, { message, issuedAt, signature }, { origin });
}

/**
 * The chat of setup.ts's `localChatTarget` (the same body) paid by wallets: no key, a `SIGN-IN-WITH-X` header
 * of its own on every request, signed by one of `wallets` (see measure.ts, `Target.signed`).
 */
export const walletChatTarget = (origin: string, wallets: readonly Wallet[]): Target => ({
  ...localChatTarget(origin, ''),
  // No authorization header: the sign-in is the credential.
  headers: json(),
  signed: { header: 'SIGN-IN-WITH-X', signers: wallets.map((wallet) => () => signIn(wallet)) },
});
