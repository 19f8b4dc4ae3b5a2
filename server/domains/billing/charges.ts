/**
 * How every paid operation spends money: reserve the worst case before any work is delivered, capture what
 * was really used, release the rest. Storage refusals become the interface's 402 bodies here, once, for every
 * domain.
 */
// From node:perf_hooks, not the global: fake timers in tests replace the globals.
import { performance } from 'node:perf_hooks';
import type { Principal } from '../../http/auth.ts';
import { ApiError } from '../../http/errors.ts';
import { whenReady } from '../../objects.ts';
import { InsufficientBalanceError, KeySpendLimitError } from '../../storage/errors.ts';
import {
  type BalanceBefore,
  type CaptureItem,
  type CaptureResult,
  type CaptureWithin,
  captureAmounts,
  type LedgerRepository,
  type Reservation,
  type ReserveResult,
  type ReserveWithin,
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
  /** Told of a detached capture that failed (captureDetached): it was undone; nothing was charged. */
  detachedFailed?(reservation: Reservation, error: unknown): void;
  /** A monotonic clock in ms (default `performance.now`): how old what `holdsAhead` judges by is. */
  now?(): number;
};

/** How many times a hold must fit in what its account had left for `holdsAhead` to say yes. */
export const AHEAD_MARGIN = 2n;
/** For how long what a reservation found of its account is trusted by `holdsAhead` (ms). */
export const AHEAD_TTL_MS = 10_000;
/** At most this many accounts are remembered for `holdsAhead` (emptied when full). */
const AHEAD_ACCOUNTS = 10_000;

/**
 * A capture started without its caller waiting (captureDetached): what it charges, known from the reservation
 * and the items before it runs; its completion (never rejects: a capture that fails is undone and reported).
 */
export type DetachedCapture = {
  usdNano: bigint;
  diemNano: bigint;
  done: Promise<void>;
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
  /** The detached captures under way, by account (see captureDetached). */
  const detached = new Map<string, Set<Promise<void>>>();
  const now = deps.now ?? (() => performance.now());
  /**
   * By account: what it could still hold after its latest reservation made in this process, when (never:
   * -Infinity), with which key (null: none) and the storage's stamp of it (ReserveResult.stamp); and the sum
   * of the holds asked for and not yet made or refused. One record per account, updated in place (a
   * reservation allocates nothing here); emptied when AHEAD_ACCOUNTS are kept.
   */
  const seen = new Map<
    string,
    {
      availableNano: bigint;
      atMs: number;
      makingNano: bigint;
      keyId: string | null;
      stamp: string | undefined;
    }
  >();
  const keyOf = (principal: Principal) => (principal.kind === 'apiKey' ? principal.keyId : null);

  /** What a failed reservation answers: a wallet short of balance gets the 402 with what to pay. */
  const refusal = (principal: Principal, amountNano: bigint, error: unknown): unknown =>
    principal.kind === 'wallet' && error instanceof InsufficientBalanceError && deps.walletPaymentRequired
      ? deps.walletPaymentRequired(principal, amountNano, error)
      : (paymentError(error) ?? error);

  /** The ledger's reservation of `amountNano` for the caller (charged to its key, when it used one). */
  const reserveInput = (principal: Principal, input: HoldInput) => ({
    accountId: principal.accountId,
    apiKeyId: keyOf(principal),
    amountNano: input.amountNano,
    requestId: input.requestId,
    modelId: input.modelId ?? null,
    ttlMs: deps.reservationTtlMs,
    keySpendLimited: principal.kind === 'apiKey' && principal.spendLimited === true,
  });

  /**
   * A reservation being made for the caller: its refusal as the 402 to answer with, its balance told. Counted
   * among the account's holds being made from the moment it is asked for (this runs before its statements do)
   * until it is decided; a reservation made records what its account has left, a refused one forgets it.
   */
  async function held<R extends ReserveResult>(
    principal: Principal,
    input: HoldInput,
    reserving: Promise<R>,
  ) {
    const accountId = principal.accountId;
    let record = seen.get(accountId);
    if (!record) {
      if (seen.size >= AHEAD_ACCOUNTS) seen.clear();
      record = {
        availableNano: 0n,
        atMs: Number.NEGATIVE_INFINITY,
        makingNano: 0n,
        keyId: null,
        stamp: undefined,
      };
      seen.set(accountId, record);
    }
    record.makingNano += input.amountNano;
    let reserved: R;
    try {
      reserved = await reserving;
    } catch (error) {
      record.atMs = Number.NEGATIVE_INFINITY;
      throw refusal(principal, input.amountNano, error);
    } finally {
      record.makingNano -= input.amountNano;
    }
    record.availableNano = reserved.availableNano;
    record.atMs = now();
    record.keyId = keyOf(principal);
    record.stamp = reserved.stamp;
    deps.reserved?.(principal, reserved.before);
    return reserved;
  }

  return {
    /**
     * Whether a hold of `amountNano` for the caller is as good as certain, so that the work it pays for may
     * start while the hold is being made (the chat's upstream call: ChatService). Yes when the account's latest
     * reservation made in this process, at most AHEAD_TTL_MS ago and with the caller's own key, left it at
     * least AHEAD_MARGIN times this amount beyond the holds being made meanwhile (counted from the moment they
     * are asked for, so that a burst of requests is judged against what the burst takes). Never for a key with
     * a spend limit: its limit, not the account, may refuse.
     *
     * Where the storage can tell (SQLite: LedgerRepository.unchangedSince), also only when nothing has changed
     * since that reservation but writes that add to what the account may hold: no other connection (the
     * operator CLI, another worker) has committed, and this process has made no later hold of the account and
     * changed no key limit or DIEM stake. Then the account can still hold what that reservation left (its hold was not
     * stamped when a DIEM allowance or a spend limit also decided it), and only a writer elsewhere committing
     * between this judgement and the hold, a fraction of a millisecond, can still make it wrong. PostgreSQL,
     * shared by instances that each see their own reservations only, has no such stamp: there the judgement
     * trusts what it saw for AHEAD_TTL_MS.
     *
     * A judgement only: the hold itself decides, as ever, and the caller delivers nothing and charges nothing
     * before it is made; what a wrong judgement costs is work started and cancelled. What the account gets back
     * meanwhile (captures, top-ups) is not counted: the judgement errs on the side of no.
     */
    holdsAhead(principal: Principal, amountNano: bigint): boolean {
      if (principal.kind === 'apiKey' && principal.spendLimited === true) return false;
      const record = seen.get(principal.accountId);
      if (!record || now() - record.atMs > AHEAD_TTL_MS || record.keyId !== keyOf(principal)) return false;
      if (record.availableNano - record.makingNano < AHEAD_MARGIN * amountNano) return false;
      const unchangedSince = deps.ledger.unchangedSince;
      return (
        !unchangedSince || (record.stamp !== undefined && unchangedSince(principal.accountId, record.stamp))
      );
    },

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

    /**
     * `captureWith` without the caller waiting for it (`within` may still be on its way: a promise of it, which
     * must not reject). It charges exactly what `captureWith` would, and those amounts are known from the
     * reservation and the items, so the answer that reports them is written while the capture commits, alone
     * or under load. (Until the forty-fourth round, answers waited for their captures while other requests
     * were in flight: measured in the tenth round, their shared commits kept the most requests per second;
     * since reservations and rate-limit counts are held in memory, answers that do not wait serve as many
     * chats and about 5% more JSON-RPC calls and adapter chats: bench/HISTORY.md.) It starts once the caller's
     * turn is over (its microtasks run out, `process.nextTick`): the answer, written in them, leaves before the
     * capture's statements are built, about 10 µs sooner (bench/HISTORY.md, thirty-first round). The
     * reservation already holds the money, so nothing can be overspent meanwhile. Should the capture fail, the
     * reservation is released and `undo` runs (the caller's own holds): nothing is charged, and
     * `detachedFailed` is told. Until it is done, `settled(accountId)` waits for it: whatever must see the
     * account as the request left it (the next request of the account, a balance read, a header reporting the
     * balance after the request) waits there.
     */
    captureDetached<T>(
      reservation: Reservation,
      items: CaptureItem[],
      within?: CaptureWithin<T> | Promise<CaptureWithin<T> | undefined>,
      undo?: () => Promise<unknown>,
    ): DetachedCapture {
      const amounts = captureAmounts(reservation, { items });
      const accountId = reservation.accountId;
      const capture = (statements: CaptureWithin<T> | undefined) =>
        deps.ledger.captureWith(reservation, { items }, statements);
      const done = new Promise<void>((resolve) => process.nextTick(resolve))
        // The caller's statements awaited only when they are a promise.
        .then(() => whenReady(within, capture))
        .then(
          () => undefined,
          async (error: unknown) => {
            await deps.ledger.release(reservation.id).catch(() => undefined);
            await undo?.().catch(() => undefined);
            deps.detachedFailed?.(reservation, error);
          },
        );
      let pending = detached.get(accountId);
      if (!pending) {
        pending = new Set();
        detached.set(accountId, pending);
      }
      pending.add(done);
      const forget = () => {
        pending.delete(done);
        if (pending.size === 0 && detached.get(accountId) === pending) detached.delete(accountId);
      };
      void done.then(forget);
      return {
        usdNano: amounts.usdNano,
        diemNano: amounts.diemNano,
        done,
      };
    },

    /**
     * Resolves once the account's detached captures started so far are done; undefined (no wait at all) when
     * there are none.
     */
    settled(accountId: string): Promise<void> | undefined {
      const pending = detached.get(accountId);
      return pending ? Promise.all(pending).then(() => undefined) : undefined;
    },

    /** Resolves once every detached capture started so far is done (shutdown drains them before closing). */
    async idle(): Promise<void> {
      while (detached.size > 0) await Promise.all([...detached.values()].flatMap((set) => [...set]));
    },
  };
}
