/**
 * What a wallet signs for the wallet journey (test/workflows/wallet-topup-chat.arazzo.yaml), which Respect
 * cannot sign itself: the x402 payment for a 5 USD top-up, made by the stock client from the server's own 402,
 * and one Sign-In-With-X proof per signed step (a proof's nonce is single-use).
 */
import type { LocalAccount } from 'viem';
import { evmPaymentHeader } from './payments.ts';
import { evmSignIn } from './siwx.ts';

/** What the wallet signs: the payment for a 5 USD top-up (from the server's own 402) and four sign-ins. */
export async function walletInputs(
  base: string,
  account: LocalAccount,
  origin: string,
): Promise<Record<string, string>> {
  const offer = await fetch(`${base}/x402/top-up`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ amountUsd: 5 }),
  });
  if (offer.status !== 402)
    throw new Error(`POST /x402/top-up without payment answered ${offer.status}, not 402`);
  const payment = await evmPaymentHeader(await offer.json(), account, '$10');
  const signIn = () => evmSignIn(account, { origin });
  return {
    wallet: account.address,
    payment,
    signInBalance: await signIn(),
    signInChat: await signIn(),
    signInTransactions: await signIn(),
    signInBalanceAfter: await signIn(),
  };
}
