/**
 * Builds Sign-In-With-X headers the way wallets do, for tests: the interface's message shape (EIP-4361 text
 * or the Solana sign-in text, signed) and the x402 extension's field shape (through the stock
 * `@x402/extensions` client helpers).
 */
import { generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import {
  createSIWxPayload,
  encodeBase58,
  encodeSIWxHeader,
  formatSIWSMessage,
} from '@x402/extensions/sign-in-with-x';
import type { LocalAccount } from 'viem';
import { createSiweMessage } from 'viem/siwe';

export const SOLANA_MAINNET = 'solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp';

export type SignInOptions = {
  origin: string;
  /** Defaults: domain/uri from origin, chain 8453, a fresh nonce, issued now, expiring in 10 minutes. */
  domain?: string;
  uri?: string;
  chainId?: number | string;
  messageChainId?: number;
  nonce?: string;
  issuedAt?: Date;
  expirationTime?: Date | null;
  notBefore?: Date;
  timestamp?: number;
  /** Address written in the JSON (defaults to the signer's). */
  address?: string;
};

export const freshNonce = () => randomBytes(8).toString('hex');

export const toBase64Json = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64');

/**
 * The interface's shape, EVM, in two halves for signers of either kind: the EIP-4361 message `address` signs
 * (`issuedAt` the time it names), then the header of that message with its signature.
 */
export function evmSignInMessage(
  address: `0x${string}`,
  options: SignInOptions,
): { message: string; issuedAt: Date } {
  const origin = new URL(options.origin);
  const issuedAt = options.issuedAt ?? new Date();
  const message = createSiweMessage({
    domain: options.domain ?? origin.host,
    address,
    statement: 'Sign in to the Service API with your wallet.',
    uri: options.uri ?? origin.origin,
    version: '1',
    chainId: options.messageChainId ?? 8453,
    nonce: options.nonce ?? freshNonce(),
    issuedAt,
    ...(options.expirationTime === null
      ? {}
      : { expirationTime: options.expirationTime ?? new Date(issuedAt.getTime() + 10 * 60_000) }),
    ...(options.notBefore ? { notBefore: options.notBefore } : {}),
  });
  return { message, issuedAt };
}

/** The header of `evmSignInMessage`'s message signed by `address`: `{address, message, signature, timestamp, chainId}`. */
export function evmSignInHeader(
  address: string,
  signed: { message: string; issuedAt: Date; signature: string },
  options: SignInOptions,
): string {
  return toBase64Json({
    address: options.address ?? address,
    message: signed.message,
    signature: signed.signature,
    timestamp: options.timestamp ?? signed.issuedAt.getTime(),
    chainId: options.chainId ?? 8453,
  });
}

/** The interface's shape, EVM: `{address, message, signature, timestamp, chainId}`. */
export async function evmSignIn(account: LocalAccount, options: SignInOptions): Promise<string> {
  const { message, issuedAt } = evmSignInMessage(account.address, options);
  const signature = await account.signMessage({ message });
  return evmSignInHeader(account.address, { message, issuedAt, signature }, options);
}

/** The x402 extension's shape, built by the stock client helper from a challenge. */
export async function evmSignInFields(account: LocalAccount, options: SignInOptions): Promise<string> {
  const origin = new URL(options.origin);
  const issuedAt = options.issuedAt ?? new Date();
  const payload = await createSIWxPayload(
    {
      domain: options.domain ?? origin.host,
      uri: options.uri ?? origin.origin,
      statement: 'Sign in to the Service API with your wallet.',
      version: '1',
      chainId: String(options.chainId ?? 'eip155:8453'),
      type: 'eip191',
      nonce: options.nonce ?? freshNonce(),
      issuedAt: issuedAt.toISOString(),
      expirationTime: new Date(issuedAt.getTime() + 10 * 60_000).toISOString(),
    },
    account,
    options.uri ?? origin.origin,
  );
  return encodeSIWxHeader(payload);
}

export type SolanaWallet = { address: string; sign(message: string): Uint8Array };

/** An ed25519 wallet from node:crypto; its address is the base58 public key. */
export function solanaWallet(): SolanaWallet {
  const { publicKey, privateKey } = generateKeyPairSync('ed25519');
  const raw = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url');
  return {
    address: encodeBase58(new Uint8Array(raw)),
    sign: (message) => new Uint8Array(sign(null, Buffer.from(message, 'utf8'), privateKey)),
  };
}

/** The interface's shape, Solana: the SIWS text, signature base58 (or base64). */
export function solanaSignIn(
  wallet: SolanaWallet,
  options: SignInOptions & { encoding?: 'base58' | 'base64'; chainReference?: string },
): string {
  const origin = new URL(options.origin);
  const issuedAt = options.issuedAt ?? new Date();
  const message = formatSIWSMessage(
    {
      domain: options.domain ?? origin.host,
      uri: options.uri ?? origin.origin,
      statement: 'Sign in to the Service API with your wallet.',
      version: '1',
      chainId: options.chainReference ? `solana:${options.chainReference}` : SOLANA_MAINNET,
      type: 'ed25519',
      nonce: options.nonce ?? freshNonce(),
      issuedAt: issuedAt.toISOString(),
      expirationTime: new Date(issuedAt.getTime() + 10 * 60_000).toISOString(),
    } as Parameters<typeof formatSIWSMessage>[0],
    wallet.address,
  );
  const bytes = wallet.sign(message);
  const signature =
    options.encoding === 'base64' ? Buffer.from(bytes).toString('base64') : encodeBase58(bytes);
  return toBase64Json({
    address: options.address ?? wallet.address,
    message,
    signature,
    timestamp: options.timestamp ?? issuedAt.getTime(),
    chainId: options.chainId ?? SOLANA_MAINNET,
    type: 'ed25519',
  });
}
