/**
 * The x402 discovery answer: what a caller without credentials gets from an inference operation. It says how
 * to buy wallet credit (x402 v2 `accepts`: exact USDC payments on Base and on Solana), how to sign in with a
 * wallet (a fresh Sign-In-With-X challenge), and how to use an API key instead. The `PAYMENT-REQUIRED` header
 * carries the x402 part of the same object, base64-encoded, for stock x402 clients.
 */
import { randomBytes } from 'node:crypto';
import type {
  SiwxChallenge,
  X402DiscoveryPaymentRequired,
  X402PaymentRequirement,
} from '../../../generated/api.d.ts';

export const BASE_NETWORK = 'eip155:8453';
export const SOLANA_NETWORK = 'solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp';
export const BASE_USDC = '0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913';
export const SOLANA_USDC = 'EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v';
/** How long a sign-in challenge stays valid. */
export const CHALLENGE_TTL_MS = 5 * 60_000;

export type DiscoveryOptions = {
  publicOrigin: string;
  payToBase?: string | undefined;
  payToSolana?: string | undefined;
  solanaFeePayer?: string | undefined;
  /** Amount offered in `accepts`, in USDC base units (6 decimals). */
  suggestedAmount?: string;
  now?: () => number;
  nonce?: () => string;
};

/** The payment options: Base first, then Solana; an option is offered only when its pay-to is configured. */
export function topUpRequirements(options: DiscoveryOptions, amount: string): X402PaymentRequirement[] {
  const accepts: X402PaymentRequirement[] = [];
  if (options.payToBase) {
    accepts.push({
      scheme: 'exact',
      network: BASE_NETWORK,
      asset: BASE_USDC,
      amount,
      payTo: options.payToBase,
      maxTimeoutSeconds: 300,
      extra: { name: 'USD Coin', version: '2' },
    });
  }
  if (options.payToSolana && options.solanaFeePayer) {
    accepts.push({
      scheme: 'exact',
      network: SOLANA_NETWORK,
      asset: SOLANA_USDC,
      amount,
      payTo: options.payToSolana,
      maxTimeoutSeconds: 300,
      extra: { feePayer: options.solanaFeePayer },
    });
  }
  return accepts;
}

/** A fresh Sign-In-With-X challenge bound to the public origin (never to request headers). */
export function signInChallenge(options: DiscoveryOptions): SiwxChallenge {
  const now = options.now?.() ?? Date.now();
  const origin = new URL(options.publicOrigin);
  return {
    info: {
      domain: origin.host,
      uri: origin.origin,
      version: '1',
      nonce: options.nonce?.() ?? randomBytes(8).toString('hex'),
      issuedAt: new Date(now).toISOString(),
      expirationTime: new Date(now + CHALLENGE_TTL_MS).toISOString(),
      statement: 'Sign in to the Service API with your wallet.',
    },
    supportedChains: [
      { chainId: BASE_NETWORK, type: 'eip191' },
      { chainId: BASE_NETWORK, type: 'eip1271' },
      { chainId: SOLANA_NETWORK, type: 'ed25519' },
    ],
  };
}

/** The 402 body for an unauthenticated call of `path`, and its `PAYMENT-REQUIRED` header. */
export function discoveryPaymentRequired(
  options: DiscoveryOptions,
  resource: { path: string; description: string },
): { body: X402DiscoveryPaymentRequired; header: string } {
  const body: X402DiscoveryPaymentRequired = {
    x402Version: 2,
    error: 'Authentication required',
    resource: {
      url: `${options.publicOrigin}${resource.path}`,
      description: resource.description,
      mimeType: 'application/json',
    },
    accepts: topUpRequirements(options, options.suggestedAmount ?? '10000000'),
    extensions: { 'sign-in-with-x': signInChallenge(options) },
    authOptions: {
      apiKey: {
        header: 'Authorization: Bearer YOUR_API_KEY',
        getKey: 'POST /api/v1/api_keys with an ADMIN key, or npm run admin -- create-account',
        docs: `${options.publicOrigin}/docs`,
      },
      x402Wallet: {
        header: 'SIGN-IN-WITH-X',
        legacyHeader: 'X-Sign-In-With-X',
        topUp: 'POST /api/v1/x402/top-up',
        docs: `${options.publicOrigin}/docs`,
      },
    },
  };
  const { authOptions: _authOptions, ...paymentRequired } = body;
  return { body, header: Buffer.from(JSON.stringify(paymentRequired)).toString('base64') };
}
