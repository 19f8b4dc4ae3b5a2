/**
 * A payer as a stock x402 client builds one: the `PAYMENT-SIGNATURE` header for the exact USDC option on Base of
 * a server's 402 body, signed by an EVM account (an EOA, or a smart wallet's signer) with `@x402/evm`.
 */
import { encodePaymentSignatureHeader } from '@x402/core/http';
import type { PaymentRequired } from '@x402/core/types';
import type { ClientEvmSigner } from '@x402/evm';
import { ExactEvmScheme } from '@x402/evm/exact/client';
import { x402Client } from '@x402/fetch';

/** The stock client for Base, refusing to pay more than `maxAmountPerPayment` (a `$` amount). */
export function evmPayingClient(signer: ClientEvmSigner, maxAmountPerPayment = '$100') {
  return new x402Client()
    .register('eip155:8453', new ExactEvmScheme(signer))
    .setSpendControls({ maxAmountPerPayment });
}

/** The `PAYMENT-SIGNATURE` header paying `paymentRequired` (a 402 body) from `signer`. */
export async function evmPaymentHeader(
  paymentRequired: unknown,
  signer: ClientEvmSigner,
  maxAmountPerPayment = '$100',
): Promise<string> {
  const payload = await evmPayingClient(signer, maxAmountPerPayment).createPaymentPayload(
    paymentRequired as PaymentRequired,
  );
  return encodePaymentSignatureHeader(payload);
}
