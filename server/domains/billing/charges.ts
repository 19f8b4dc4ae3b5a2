/**
 * How every paid operation spends money: reserve the worst case before any work, capture what was really
 * used, release the rest. Storage refusals become the interface's 402 bodies here, once, for every domain.
 */
import type { Principal } from '../../http/auth.ts';
import { ApiError } from '../../http/errors.ts';
import { InsufficientBalanceError, KeySpendLimitError } from '../../storage/errors.ts';
import type {
  BalanceBefore,
  CaptureItem,
  CaptureResult,
  CaptureWithin,
  LedgerRepository,
  Reservation,
  ReserveResult,
  ReserveWithin,
} from '../../storage/ledger.ts';

export type ChargesDeps = {
  ledger: LedgerRepository;
  /** How long a reservation may stay open before the sweep releases it. */
  reservationTtlMs: number;
  /** The 402 body for a wallet that cannot cover a request (the wallet domain builds it). */
  walletPaymentRequired?(
    principal: Principal,
    requiredNano: bigint,
    refusal: InsufficientBalanceError,
  ): ApiError;
  /** Told of every reservation made: the caller it was made for, and the balance the hold found. */
  reserved?(principal: Principal, before: BalanceBefore): void;
};

export const INSUFFICIENT_BALANCE_MESSAGE =
  'Insufficient USD or DIEM balance to complete request. Add credit to the account and retry.';

/** The 402 for an API-key account that cannot cover a reservation. */
export function paymentError(error: unknown): ApiError | undefined {
  if (error instanceof KeySpendLimitError) {
    const currency = error.currency;
    return new ApiError(
      402,
      `API key ${currency} spend limit exceeded. Your account may still have ${currency} balance, but this API key has reached its configured ${currency} spending limit.`,
      { code: `API_KEY_${currency}_SPEND_LIMIT_EXCEEDED`, cause: error },
    );
  }
  if (error instanceof InsufficientBalanceError) {
    return new ApiError(402, INSUFFICIENT_BALANCE_MESSAGE, { code: 'INSUFFICIENT_BALANCE', cause: error });
  }
  return undefined;
}

export type Charges = ReturnType<typeof createCharges>;

/** What a caller holds money for. */
type HoldInput = { amountNano: bigint; requestId: string; modelId?: string | null };

export function createCharges(deps: ChargesDeps) {
  /** What a failed reservation answers: a wallet short of balance gets the 402 with what to pay. */
  const refusal = (principal: Principal, amountNano: bigint, error: unknown): unknown =>
    principal.kind === 'wallet' && error instanceof InsufficientBalanceError && deps.walletPaymentRequired
      ? deps.walletPaymentRequired(principal, amountNano, error)
      : (paymentError(error) ?? error);

  /** The ledger's reservation of `amountNano` for the caller (charged to its key, when it used one). */
  const reserveInput = (principal: Principal, input: HoldInput) => ({
    accountId: principal.accountId,
    apiKeyId: principal.kind === 'apiKey' ? principal.keyId : null,
    amountNano: input.amountNano,
    requestId: input.requestId,
    modelId: input.modelId ?? null,
    ttlMs: deps.reservationTtlMs,
    keySpendLimited: principal.kind === 'apiKey' && principal.spendLimited === true,
  });

  /** A reservation being made for the caller: its refusal as the 402 to answer with, its balance told. */
  async function held<R extends ReserveResult>(
    principal: Principal,
    input: HoldInput,
    reserving: Promise<R>,
  ) {
    let reserved: R;
    try {
      reserved = await reserving;
    } catch (error) {
      throw refusal(principal, input.amountNano, error);
    }
    deps.reserved?.(principal, reserved.before);
    return reserved;
  }

  return {
    /** Reserves `amountNano` for the caller, or throws the 402 to answer with. */
    async reserve(principal: Principal, input: HoldInput): Promise<Reservation> {
      return (await held(principal, input, deps.ledger.reserve(reserveInput(principal, input)))).reservation;
    },

    /** Charges what was used (never more than reserved) and releases the rest. */
    capture(reservation: Reservation, items: CaptureItem[]): Promise<CaptureResult> {
      return deps.ledger.capture(reservation.id, { items });
    },

    /** Gives the whole reservation back (the work failed or was not done). */
    async release(reservation: Reservation): Promise<void> {
      await deps.ledger.release(reservation.id);
    },

    /**
     * `reserve` with the caller's own statements in the same transaction (LedgerRepository.reserveWith): run
     * under the account's lock before the hold is decided; what they throw is thrown as it is, with nothing
     * written.
     */
    async reserveWith<T>(
      principal: Principal,
      input: HoldInput,
      within: ReserveWithin<T>,
    ): Promise<{ reservation: Reservation; within: T }> {
      return held(principal, input, deps.ledger.reserveWith(reserveInput(principal, input), within));
    },

    /** `capture` with the caller's own statements in the same transaction (LedgerRepository.captureWith). */
    captureWith<T>(
      reservation: Reservation,
      items: CaptureItem[],
      within?: CaptureWithin<T>,
    ): Promise<CaptureResult> {
      return deps.ledger.captureWith(reservation, { items }, within);
    },
  };
}
