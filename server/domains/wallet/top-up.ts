/**
 * Buying wallet credit with an x402 payment (`POST /x402/top-up`).
 *
 * Without a payment: the x402 v2 requirements for the requested amount (Base, then Solana) plus a
 * Sign-In-With-X challenge, as the 402 body and base64 in `PAYMENT-REQUIRED`. With one: decode, match it to
 * the requirements recomputed from the same amount, verify, claim it in the database (one settlement per
 * payment across processes), settle through the facilitator, then credit the paying wallet; the ledger's
 * TOP_UP is unique per (network, transaction), so a payment is credited once whatever happens. A settlement
 * that is broadcast but not confirmed is answered 202 and reconciled later (`reconcile`), never answered
 * with a fresh 402 and never credited twice.
 */
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { ApiError, badRequest } from '../../http/errors.ts';
import { nanoToUsdNumber, usdNumberToNano } from '../../money.ts';
import type { Eip3009Chain } from '../../providers/x402/evm-authorizations.ts';
import type {
  Facilitator,
  PaymentPayload,
  PaymentRequirements,
  SettleResponse,
} from '../../providers/x402/facilitator.ts';
import { feePayerOf } from '../../providers/x402/facilitator.ts';
import type { SolanaChain } from '../../providers/x402/solana-status.ts';
import type { AccountsRepository } from '../../storage/accounts.ts';
import type { LedgerRepository } from '../../storage/ledger.ts';
import type { X402PaymentsRepository } from '../../storage/x402-payments.ts';
import { type DiscoveryOptions, SOLANA_NETWORK, signInChallenge, topUpRequirements } from './discovery.ts';
import { MAXIMUM_TOP_UP_USD, MINIMUM_TOP_UP_USD, SUGGESTED_TOP_UP_USD } from './payment-required.ts';

/** How long one settlement attempt owns a payment before the reconciler may take it over. */
const SETTLE_LEASE_MS = 5 * 60_000;

export type TopUpDeps = {
  facilitator: Facilitator;
  payments: X402PaymentsRepository;
  ledger: LedgerRepository;
  accounts: AccountsRepository;
  discovery: DiscoveryOptions;
  logger: Logger;
  /** The Base node the reconciler asks about EIP-3009 authorizations; without it, Base payments are re-settled. */
  chain?: Eip3009Chain | undefined;
  /** The Solana node the reconciler asks about settlement transactions (with the facilitator's `transactionId`). */
  solana?: SolanaChain | undefined;
};

export type TopUpOutcome =
  | {
      status: 200;
      body: {
        success: true;
        data: {
          walletAddress: string;
          amountCredited: number;
          newBalance: number;
          paymentId: string;
          network: string;
          transaction: string;
        };
      };
      headers: Record<string, string>;
    }
  | {
      status: 202;
      body: {
        success: true;
        data: {
          status: 'pending';
          walletAddress: string;
          network: string;
          transaction: string;
          amountUsd: number;
        };
      };
    };

const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64');

function decodePayment(header: string): PaymentPayload {
  const text = header.trim();
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(text)) {
    throw badRequest('Invalid payment header: not base64', 'INVALID_PAYMENT_FORMAT');
  }
  let payload: unknown;
  try {
    payload = JSON.parse(Buffer.from(text, 'base64').toString('utf8'));
  } catch (cause) {
    throw new ApiError(400, 'Invalid payment header: not base64 JSON', {
      code: 'INVALID_PAYMENT_FORMAT',
      cause,
    });
  }
  const p = payload as Partial<PaymentPayload> | null;
  if (
    typeof p !== 'object' ||
    p === null ||
    p.x402Version !== 2 ||
    typeof p.accepted !== 'object' ||
    p.accepted === null ||
    typeof p.payload !== 'object' ||
    p.payload === null
  ) {
    throw badRequest(
      'Invalid payment header: expected an x402 v2 PaymentPayload {x402Version: 2, accepted, payload}',
      'INVALID_PAYMENT_FORMAT',
    );
  }
  return p as PaymentPayload;
}

/** Deterministic identity of a signed payment, before it settles. */
export function paymentKey(payload: PaymentPayload): string {
  const authorization = (payload.payload as { authorization?: { from?: unknown; nonce?: unknown } })
    .authorization;
  if (
    payload.accepted.network.startsWith('eip155:') &&
    typeof authorization?.from === 'string' &&
    typeof authorization.nonce === 'string'
  ) {
    // EIP-3009: the token accepts each (authorizer, nonce) once, however the signature is encoded.
    return `${payload.accepted.network}:${authorization.from.toLowerCase()}:${authorization.nonce.toLowerCase()}`;
  }
  const digest = createHash('sha256').update(JSON.stringify(payload.payload)).digest('hex');
  return `${payload.accepted.network}:${digest}`;
}

function sameExtra(server: Record<string, unknown> | undefined, client: Record<string, unknown> | undefined) {
  return Object.entries(server ?? {}).every(
    ([key, value]) => JSON.stringify(client?.[key]) === JSON.stringify(value),
  );
}

/** The offered requirement the payment signed, or the 400 that says what differs. */
function match(requirements: PaymentRequirements[], accepted: PaymentRequirements): PaymentRequirements {
  const sameNetwork = requirements.filter((r) => r.network === accepted.network);
  const [candidate] = sameNetwork;
  if (!candidate) throw badRequest(`Unsupported network ${accepted.network}`, 'UNSUPPORTED_NETWORK');
  if (accepted.scheme !== candidate.scheme) {
    throw badRequest(`Unsupported scheme ${accepted.scheme}: use exact`, 'UNSUPPORTED_SCHEME');
  }
  if (accepted.asset !== candidate.asset) throw badRequest('The payment is not in USDC', 'UNSUPPORTED_TOKEN');
  if (accepted.payTo !== candidate.payTo) {
    throw badRequest('The payment is not to this service', 'INVALID_PAYMENT_RECIPIENT');
  }
  if (accepted.amount !== candidate.amount) {
    throw badRequest(
      `The payment amount ${accepted.amount} does not match the requested top-up (${candidate.amount} USDC base units); send the same amountUsd as for the offer`,
      'INVALID_AMOUNT',
    );
  }
  if (
    accepted.maxTimeoutSeconds !== candidate.maxTimeoutSeconds ||
    !sameExtra(candidate.extra, accepted.extra)
  ) {
    throw badRequest('The payment does not match the offered requirements', 'INVALID_PAYMENT');
  }
  return candidate;
}

export type TopUpService = ReturnType<typeof createTopUpService>;

export function createTopUpService(deps: TopUpDeps) {
  const { facilitator, payments, ledger, accounts, logger } = deps;
  let capabilities: Promise<{ networks?: Set<string>; solanaFeePayer?: string }> | undefined;

  /** What the facilitator settles (asked once); without an answer, the configuration is trusted. */
  function facilitatorCapabilities() {
    capabilities ??= facilitator.supported().then(
      async (supported) => ({
        networks: new Set(supported.kinds.filter((k) => k.scheme === 'exact').map((k) => k.network)),
        solanaFeePayer: await feePayerOf(facilitator, SOLANA_NETWORK),
      }),
      (error: unknown) => {
        capabilities = undefined;
        logger.warn({ err: error }, 'x402 facilitator /supported failed');
        return {};
      },
    );
    return capabilities;
  }

  async function requirementsFor(amountAtomic: string): Promise<PaymentRequirements[]> {
    const { networks, solanaFeePayer } = await facilitatorCapabilities();
    const options = { ...deps.discovery, solanaFeePayer: solanaFeePayer ?? deps.discovery.solanaFeePayer };
    return (topUpRequirements(options, amountAtomic) as PaymentRequirements[]).filter(
      (r) => !networks || networks.has(r.network),
    );
  }

  /** The top-up amount: USD with at most 6 decimals, within the limits. */
  function amountOf(amountUsd: number | undefined) {
    const usd = amountUsd ?? SUGGESTED_TOP_UP_USD;
    if (!(usd >= MINIMUM_TOP_UP_USD && usd <= MAXIMUM_TOP_UP_USD)) {
      throw badRequest(
        `amountUsd must be from ${MINIMUM_TOP_UP_USD} to ${MAXIMUM_TOP_UP_USD} USD`,
        usd < MINIMUM_TOP_UP_USD ? 'AMOUNT_TOO_LOW' : 'AMOUNT_TOO_HIGH',
      );
    }
    const nano = usdNumberToNano(usd);
    if (nano % 1000n !== 0n) throw badRequest('amountUsd has more than 6 decimal places', 'INVALID_AMOUNT');
    return { nano, atomic: String(nano / 1000n), usd: nanoToUsdNumber(nano) };
  }

  async function paymentRequired(amountAtomic: string, resourceUrl: string, error: string) {
    const body = {
      x402Version: 2 as const,
      error,
      resource: { url: resourceUrl, description: 'Wallet credit top-up', mimeType: 'application/json' },
      accepts: await requirementsFor(amountAtomic),
      extensions: { 'sign-in-with-x': signInChallenge(deps.discovery) },
    };
    return { body, header: encode(body) };
  }

  /** Credits a settled payment to its payer (once per transaction) and records it. */
  async function credit(input: {
    key: string;
    network: string;
    payer: string;
    amountNano: bigint;
    settle: SettleResponse;
  }): Promise<TopUpOutcome> {
    const { account } = await accounts.findOrCreateWalletAccount(input.payer);
    const { entry } = await ledger.topUp({
      accountId: account.id,
      amountNano: input.amountNano,
      network: input.network,
      txHash: input.settle.transaction,
      onRecorded: (executor, recorded) =>
        payments.markSettled(input.key, input.settle.transaction, recorded.id, executor),
    });
    return {
      status: 200,
      body: {
        success: true,
        data: {
          walletAddress: input.payer,
          amountCredited: nanoToUsdNumber(entry.amountNano),
          newBalance: nanoToUsdNumber(entry.balanceAfterNano),
          paymentId: entry.id,
          network: input.network,
          transaction: input.settle.transaction,
        },
      },
      headers: { 'PAYMENT-RESPONSE': encode(input.settle) },
    };
  }

  function pendingOutcome(row: {
    payer: string;
    network: string;
    txHash: string | null;
    amountNano: bigint;
  }) {
    if (!row.txHash) {
      return new ApiError(
        504,
        'Settlement of this payment timed out; it may still confirm and will then be credited once. Check the balance before paying again.',
        { code: 'SETTLEMENT_TIMEOUT' },
      );
    }
    return {
      status: 202 as const,
      body: {
        success: true as const,
        data: {
          status: 'pending' as const,
          walletAddress: row.payer,
          network: row.network,
          transaction: row.txHash,
          amountUsd: nanoToUsdNumber(row.amountNano),
        },
      },
    };
  }

  /** What an already known payment answers instead of being settled again. */
  function known(row: Awaited<ReturnType<typeof payments.get>>): TopUpOutcome | ApiError | undefined {
    if (!row) return undefined;
    if (row.status === 'settled') {
      return new ApiError(
        409,
        'This payment was already settled and credited; sign a new payment to top up again',
        {
          code: 'PAYMENT_ALREADY_SETTLED',
        },
      );
    }
    if (row.status === 'pending') return pendingOutcome(row);
    if (row.status === 'settling') {
      return new ApiError(409, 'This payment is being settled; do not pay again', {
        code: 'PAYMENT_IN_PROGRESS',
      });
    }
    return undefined;
  }

  function raise(outcome: TopUpOutcome | ApiError): TopUpOutcome {
    if (outcome instanceof ApiError) throw outcome;
    return outcome;
  }

  async function settleClaimed(
    key: string,
    payload: PaymentPayload,
    requirements: PaymentRequirements,
    expected: { payer: string; amountNano: bigint },
  ): Promise<TopUpOutcome | ApiError | SettleResponse> {
    let settle: SettleResponse;
    try {
      settle = await facilitator.settle(payload, requirements);
    } catch (error) {
      logger.warn({ err: error, network: requirements.network }, 'x402 settlement outcome unknown');
      await payments.markPending(key, null, error instanceof Error ? error.message : 'settle failed');
      return pendingOutcome({ ...expected, network: requirements.network, txHash: null });
    }
    if (settle.success && settle.transaction) {
      return credit({
        key,
        network: requirements.network,
        payer: settle.payer ?? expected.payer,
        amountNano: expected.amountNano,
        settle,
      });
    }
    if (settle.errorReason === 'settlement_pending' && settle.transaction) {
      await payments.markPending(key, settle.transaction, settle.errorReason);
      return pendingOutcome({ ...expected, network: requirements.network, txHash: settle.transaction });
    }
    return settle;
  }

  type Row = NonNullable<Awaited<ReturnType<typeof payments.get>>>;

  /** The EIP-3009 authorization a Base payment carries, if it is one. */
  function authorizationOf(row: Row) {
    const requirements = row.requirements as PaymentRequirements;
    const authorization = (row.payload as PaymentPayload).payload?.authorization as
      | { from?: unknown; to?: unknown; nonce?: unknown; validBefore?: unknown }
      | undefined;
    if (
      !requirements.network.startsWith('eip155:') ||
      typeof authorization?.from !== 'string' ||
      typeof authorization.nonce !== 'string' ||
      !/^0x[0-9a-fA-F]{64}$/.test(authorization.nonce) ||
      typeof authorization.validBefore !== 'string' ||
      !/^\d+$/.test(authorization.validBefore)
    ) {
      return undefined;
    }
    return {
      token: requirements.asset,
      payTo: requirements.payTo,
      authorizer: authorization.from,
      nonce: authorization.nonce as `0x${string}`,
      validBefore: BigInt(authorization.validBefore),
    };
  }

  async function reconcileFromChain(
    row: Row,
    chain: Eip3009Chain,
    authorization: NonNullable<ReturnType<typeof authorizationOf>>,
  ): Promise<'credited' | 'pending' | 'failed'> {
    if (await chain.authorizationUsed(authorization)) {
      const use = await chain.findAuthorizationUse({
        ...authorization,
        // The broadcast came after the claim; ten minutes of margin for clocks that differ.
        sinceSeconds: BigInt(Math.floor(row.createdAtMs / 1000) - 600),
      });
      const paid = use?.transfers.some(
        (t) =>
          t.from.toLowerCase() === authorization.authorizer.toLowerCase() &&
          t.to.toLowerCase() === authorization.payTo.toLowerCase() &&
          t.value === BigInt(row.amountAtomic),
      );
      if (!use || !paid) {
        logger.error(
          { paymentKey: row.paymentKey, transaction: use?.transaction },
          'x402 authorization used without a matching transfer to us: left pending for review',
        );
        await payments.markPending(
          row.paymentKey,
          use?.transaction ?? row.txHash,
          'authorization used elsewhere',
        );
        return 'pending';
      }
      await credit({
        key: row.paymentKey,
        network: row.network,
        payer: row.payer,
        amountNano: row.amountNano,
        settle: {
          success: true,
          transaction: use.transaction,
          network: row.network as never,
          payer: row.payer,
        },
      });
      return 'credited';
    }
    if ((await chain.latestTimestamp()) >= authorization.validBefore) {
      await payments.markFailed(row.paymentKey, 'authorization expired unused');
      return 'failed';
    }
    await payments.markPending(row.paymentKey, row.txHash, row.error ?? 'not on chain yet');
    return 'pending';
  }

  /** A Solana payment by the id its transaction has (or would have): landed, failed, or expired unsent. */
  async function reconcileFromSolana(
    row: Row,
    solana: SolanaChain,
    transactionId: string,
    transaction: string,
  ): Promise<'credited' | 'pending' | 'failed'> {
    const status = await solana.status(transactionId);
    if (status === 'confirmed') {
      await credit({
        key: row.paymentKey,
        network: row.network,
        payer: row.payer,
        amountNano: row.amountNano,
        settle: {
          success: true,
          transaction: transactionId,
          network: row.network as never,
          payer: row.payer,
        },
      });
      return 'credited';
    }
    if (status === 'failed') {
      // A failed Solana transaction moves nothing but its fee (ours).
      await payments.markFailed(row.paymentKey, 'transaction failed on chain');
      return 'failed';
    }
    if (
      status === 'unknown' &&
      !(await solana.blockhashValid(
        // Loaded here only: it needs the Solana stack.
        (await import('../../providers/x402/solana-status.ts')).transactionBlockhash(transaction),
      ))
    ) {
      await payments.markFailed(row.paymentKey, 'transaction expired unsent (blockhash no longer valid)');
      return 'failed';
    }
    await payments.markPending(row.paymentKey, transactionId, row.error ?? 'not confirmed yet');
    return 'pending';
  }

  async function reconcileOne(row: Row): Promise<'credited' | 'pending' | 'failed'> {
    const authorization = authorizationOf(row);
    if (authorization && deps.chain) return reconcileFromChain(row, deps.chain, authorization);
    const payload = row.payload as PaymentPayload;
    const transaction = (payload.payload as { transaction?: unknown }).transaction;
    if (row.network.startsWith('solana:') && deps.solana && typeof transaction === 'string') {
      const id = await facilitator.transactionId?.(payload, row.requirements as PaymentRequirements);
      if (id) return reconcileFromSolana(row, deps.solana, id, transaction);
    }
    const result = await settleClaimed(
      row.paymentKey,
      row.payload as PaymentPayload,
      row.requirements as PaymentRequirements,
      { payer: row.payer, amountNano: row.amountNano },
    );
    if (result instanceof ApiError) return 'pending';
    if ('status' in result) return result.status === 200 ? 'credited' : 'pending';
    // The outcome of the first attempt is unknown (it may have been broadcast): keep it for a human.
    await payments.markPending(row.paymentKey, row.txHash, result.errorReason ?? 'reconciliation failed');
    return 'pending';
  }

  return {
    /** The 402 with payment options for `amountUsd` (default 10). */
    async offer(amountUsd: number | undefined, resourceUrl: string) {
      const offer = await paymentRequired(amountOf(amountUsd).atomic, resourceUrl, 'Payment required');
      if (offer.body.accepts.length === 0) {
        throw new ApiError(
          503,
          'No payment rail is available: the facilitator settles none of the configured networks',
          {
            code: 'X402_NOT_CONFIGURED',
          },
        );
      }
      return offer;
    },

    /** Verifies, settles and credits a signed payment for `amountUsd`; throws the ApiError to answer with. */
    async pay(header: string, amountUsd: number | undefined, resourceUrl: string): Promise<TopUpOutcome> {
      const amount = amountOf(amountUsd);
      const payload = decodePayment(header);
      const requirements = match(await requirementsFor(amount.atomic), payload.accepted);
      const key = paymentKey(payload);
      const seen = known(await payments.get(key));
      if (seen) return raise(seen);

      const verified = await facilitator.verify(payload, requirements);
      if (!verified.isValid || !verified.payer) {
        // A concurrent submission (on any instance) may have claimed and settled it since the check above:
        // its transfer is why verification fails now. Answer what that one answers.
        const claimedMeanwhile = known(await payments.get(key));
        if (claimedMeanwhile) return raise(claimedMeanwhile);
        throw new ApiError(
          400,
          `Payment verification failed: ${verified.invalidMessage ?? verified.invalidReason ?? 'invalid payment'}`,
          { code: 'PAYMENT_VERIFICATION_FAILED' },
        );
      }
      const claimed = await payments.claim({
        paymentKey: key,
        network: requirements.network,
        payer: verified.payer,
        amountAtomic: amount.atomic,
        amountNano: amount.nano,
        payload,
        requirements,
        leaseMs: SETTLE_LEASE_MS,
      });
      if (!claimed) {
        return raise(
          known(await payments.get(key)) ??
            new ApiError(409, 'This payment is being settled; do not pay again', {
              code: 'PAYMENT_IN_PROGRESS',
            }),
        );
      }

      const result = await settleClaimed(key, payload, requirements, {
        payer: verified.payer,
        amountNano: amount.nano,
      });
      if (result instanceof ApiError || 'status' in result) return raise(result);
      await payments.markFailed(key, result.errorReason ?? 'settlement failed');
      const fresh = await paymentRequired(amount.atomic, resourceUrl, 'Payment settlement failed');
      logger.warn({ reason: result.errorReason, detail: result.errorMessage }, 'x402 settlement failed');
      throw new ApiError(
        402,
        `Payment settlement failed (${result.errorReason ?? 'the transfer was not settled'}); nothing was charged: sign a new payment`,
        { code: 'SETTLEMENT_FAILED', headers: { 'PAYMENT-REQUIRED': fresh.header } },
      );
    },

    /**
     * Resolves every pending payment (and every one whose settling process died), across processes: each
     * payment is leased to one of them per attempt, and the credit is unique per (network, transaction).
     *
     * A Base payment is resolved from the chain when a Base RPC is configured, never by settling again: the
     * process may have died after broadcasting, and then a second settlement fails (the authorization is
     * used) although the money moved. If the token used the authorization, the transaction that used it is
     * found from its `AuthorizationUsed` log and credited once, when it moved the payment's amount from the
     * payer to our pay-to address. If the authorization is unused and the latest block is stamped at or after
     * its `validBefore`, it can never move: the payment fails, nothing credited. If it is unused and still valid
     * (the transaction may be waiting in a mempool), the payment stays pending and is looked at again next time;
     * it is not submitted again, because a second submission racing the first would revert and read as a
     * failure. A Solana payment is looked up by its transaction id (the fee payer's deterministic signature,
     * from an in-process facilitator) through `X402_SOLANA_RPC_URL`: confirmed is credited once, failed on chain
     * fails, unknown with an expired blockhash fails (it can never land), anything else stays pending. Other
     * payments (Base without an RPC, a facilitator over HTTP) are settled again through the facilitator, which
     * answers for a transaction it broadcast before; a payment whose outcome is still unknown is kept pending,
     * never marked failed on a guess.
     */
    async reconcile(at?: number): Promise<{ credited: number; pending: number; failed: number }> {
      const counts = { credited: 0, pending: 0, failed: 0 };
      for (const row of await payments.due(50, at)) {
        if (!(await payments.lease(row.paymentKey, SETTLE_LEASE_MS, at))) continue;
        const outcome = await reconcileOne(row).catch((error: unknown) => {
          logger.warn({ err: error, paymentKey: row.paymentKey }, 'x402 reconciliation failed');
          return 'pending' as const;
        });
        counts[outcome]++;
      }
      return counts;
    },
  };
}
