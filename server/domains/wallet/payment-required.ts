/**
 * The 402 for a signed-in wallet whose credit cannot cover a request (the interface's third 402 variant):
 * `{error: "Payment required", code: PAYMENT_REQUIRED, reason, topUpInstructions, supportedTokens,
 * supportedChains, siwxChallenge, …}`, with the x402 v2 payment requirements of a suggested top-up,
 * base64-encoded, in `PAYMENT-REQUIRED` so that a stock x402 client can buy credit straight away.
 */
import type { X402WalletPaymentRequired } from '../../../generated/api.d.ts';
import { ApiError } from '../../http/errors.ts';
import { nanoToUsdNumber } from '../../money.ts';
import {
  BASE_NETWORK,
  BASE_USDC,
  type DiscoveryOptions,
  signInChallenge,
  topUpRequirements,
} from './discovery.ts';

/** Smallest and largest top-up, in USD. */
export const MINIMUM_TOP_UP_USD = 5;
export const MAXIMUM_TOP_UP_USD = 10_000;
/** The default and suggested top-up, in USD. */
export const SUGGESTED_TOP_UP_USD = 10;
/** Credit a wallet needs to be admitted to a paid request (nano-USD): 0.10 USD. */
export const MINIMUM_BALANCE_NANO = 100_000_000n;

export function walletPaymentRequired(
  options: DiscoveryOptions,
  input: { currentBalanceNano?: bigint; requiredNano?: bigint },
): ApiError {
  const challenge = signInChallenge(options);
  const body: X402WalletPaymentRequired = {
    error: 'Payment required',
    code: 'PAYMENT_REQUIRED',
    reason: 'insufficient_balance',
    message: 'Insufficient x402 balance',
    ...(input.currentBalanceNano === undefined
      ? {}
      : { currentBalanceUsd: nanoToUsdNumber(input.currentBalanceNano) }),
    minimumBalanceUsd: nanoToUsdNumber(MINIMUM_BALANCE_NANO),
    ...(input.requiredNano === undefined ? {} : { requiredUsd: nanoToUsdNumber(input.requiredNano) }),
    suggestedTopUpUsd: SUGGESTED_TOP_UP_USD,
    minimumTopUpUsd: MINIMUM_TOP_UP_USD,
    supportedTokens: ['USDC'],
    supportedChains: ['base', 'solana'],
    topUpInstructions: {
      step1: 'POST /api/v1/x402/top-up without a payment header to receive the payment options.',
      step2: 'Sign a USDC payment for one option with your wallet (x402 exact scheme).',
      step3: 'POST /api/v1/x402/top-up again with the signed payment in the PAYMENT-SIGNATURE header.',
      receiverWallet: options.payToBase ?? '',
      tokenAddress: BASE_USDC,
      tokenDecimals: 6,
      network: BASE_NETWORK,
      minimumAmountUsd: MINIMUM_TOP_UP_USD,
    },
    siwxChallenge: challenge,
  };
  const paymentRequired = {
    x402Version: 2,
    error: 'Insufficient x402 balance',
    resource: {
      url: `${options.publicOrigin}/api/v1/x402/top-up`,
      description: 'Wallet credit top-up',
      mimeType: 'application/json',
    },
    accepts: topUpRequirements(options, String(SUGGESTED_TOP_UP_USD * 1_000_000)),
    extensions: { 'sign-in-with-x': challenge },
  };
  return new ApiError(402, body.error, {
    code: body.code,
    body,
    headers: { 'PAYMENT-REQUIRED': Buffer.from(JSON.stringify(paymentRequired)).toString('base64') },
  });
}
