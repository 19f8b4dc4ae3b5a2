/**
 * The x402 facilitator port: verifies a signed payment against requirements and settles it on chain. Two
 * implementations: in-process (`in-process.ts`, the `@x402/*` schemes with our own keys and RPCs) and over
 * HTTP (`http.ts`, any facilitator speaking the x402 `/verify`, `/settle`, `/supported` API).
 */
import type {
  PaymentPayload,
  PaymentRequirements,
  SettleResponse,
  SupportedResponse,
  VerifyResponse,
} from '@x402/core/types';

export type { PaymentPayload, PaymentRequirements, SettleResponse, SupportedResponse, VerifyResponse };

export type Facilitator = {
  /** Checks a payment without moving money. */
  verify(payload: PaymentPayload, requirements: PaymentRequirements): Promise<VerifyResponse>;
  /**
   * Submits the payment and waits for it. `success: false` with `errorReason: "settlement_pending"` and a
   * `transaction` means it was broadcast but not confirmed yet: settling the same payload again later
   * reconciles against that transaction instead of paying twice. A throw is indeterminate.
   */
  settle(payload: PaymentPayload, requirements: PaymentRequirements): Promise<SettleResponse>;
  /** The networks and schemes it handles; Solana kinds carry `extra.feePayer`. */
  supported(): Promise<SupportedResponse>;
  /**
   * The id the network knows (or will know) the payment's transaction by, sent or not, when this facilitator
   * can tell without sending anything (Solana: the fee payer's ed25519 signature, which is deterministic).
   * Lets the reconciler look a payment up on chain after a crash; undefined when it cannot tell.
   */
  transactionId?(payload: PaymentPayload, requirements: PaymentRequirements): Promise<string | undefined>;
};

/** The Solana fee payer a facilitator advertises for a network, if any. */
export async function feePayerOf(facilitator: Facilitator, network: string): Promise<string | undefined> {
  const supported = await facilitator.supported();
  const kind = supported.kinds.find((k) => k.network === network && k.scheme === 'exact');
  const feePayer = (kind?.extra as { feePayer?: unknown } | undefined)?.feePayer;
  return typeof feePayer === 'string' ? feePayer : undefined;
}
