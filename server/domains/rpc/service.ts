/**
 * The JSON-RPC proxy: checks and prices every item of a call, replays or claims its idempotency key, then in
 * one transaction (on PostgreSQL one round trip, see admission) counts it under the per-minute cap, takes the
 * worst case from the rolling 24-hour credit cap and reserves it on the ledger (one SQLite process holds the
 * count, the credits and the hold in memory: then all three are decided at once, with no transaction, once
 * the caller's windows are held, `admitNow`; what was counted is taken back if the hold is refused), forwards
 * the bytes to the network's nodes (with failover), then returns the node's bytes unchanged while what the
 * answer really cost is charged (the capture is not waited for: Charges.captureDetached). Everything that does
 * not depend on the request is prepared at start.
 */
import type { Transaction } from 'kysely';
import type { components } from '../../../generated/api.d.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError } from '../../http/errors.ts';
import { timeOrderedHex } from '../../http/random-hex.ts';
import type { AbortLike } from '../../http/request-abort.ts';
import { formatUsdFixed } from '../../money.ts';
import { extend } from '../../objects.ts';
import { type RpcUpstream, UpstreamError } from '../../providers/rpc/port.ts';
import { hashRequestBody, type IdempotencyScope, type IdempotencyStore } from '../../storage/idempotency.ts';
import type { Reservation, ReserveWithin } from '../../storage/ledger.ts';
import type { HitInput, HitResult, RateLimitsRepository } from '../../storage/rate-limits.ts';
import type { CreditTakeResult, RpcCreditsRepository } from '../../storage/rpc-credits.ts';
import type { Tables } from '../../storage/schema.ts';
import type { Charges } from '../billing/charges.ts';
import { billAnswer, planRequest, type RpcPlan } from './billing.ts';
import type { RpcNetwork } from './networks.ts';

const MINUTE_MS = 60_000;
const OPERATION = 'callCryptoRpc';

/** The part of the shared idempotency store the proxy uses. */
export type IdempotencyPort = Pick<IdempotencyStore, 'begin' | 'complete' | 'abandon'>;

export type RpcLimits = {
  requestsPerMinute: number;
  staffRequestsPerMinute: number;
  /** Account ids on the staff tier. */
  staffAccounts: ReadonlySet<string>;
  creditsPerDay: number;
};

export type RpcServiceDeps = {
  networks: ReadonlyMap<string, RpcNetwork>;
  /** One upstream per served network. */
  upstreams: ReadonlyMap<string, RpcUpstream>;
  charges: Charges;
  rateLimits: RateLimitsRepository;
  credits: RpcCreditsRepository;
  idempotency?: IdempotencyPort;
  pricePerCreditNano: bigint;
  limits: RpcLimits;
  now?: () => number;
};

export type RpcCallInput = {
  principal: Principal;
  network: string;
  body: unknown;
  idempotencyKey?: string | undefined;
  signal?: AbortLike;
};

export type RpcCallResult = { headers: Record<string, string>; body: Buffer | string };

/**
 * What a reservation's admission counted in this process (the minute as `admitMinute` counted it; the credits,
 * when the windows are held), to take back if the reservation is refused or does not commit.
 */
type Counted = { minute?: HitInput; credits?: { subject: string; bucketMs: number; credits: number } };

const CREDIT_HEADER = 'X-Service-RPC-Credits';
const COST_HEADER = 'X-Service-RPC-Cost-USD';
const REQUEST_ID_HEADER = 'X-Request-ID';

const formatCount = (n: number) => n.toLocaleString('en-US');

export type RpcService = ReturnType<typeof createRpcService>;

export function createRpcService(deps: RpcServiceDeps) {
  const now = deps.now ?? Date.now;
  const { limits } = deps;
  const price = deps.pricePerCreditNano;

  /**
   * Counts the request in the caller's minute, in the reservation's transaction (a request refused later in it
   * is not counted: in the rows the count rolls back with it; a count held by the process is taken back by
   * `forward`, which `counted` tells), or throws the 429 with the `X-RateLimit-*` headers.
   */
  async function admitMinute(
    principal: Principal,
    trx: Transaction<Tables>,
    counted: Counted,
  ): Promise<void> {
    const at = now();
    const minute = minuteHit(principal, at);
    if (await deps.rateLimits.count(minute, trx)) {
      counted.minute = minute;
      return;
    }
    throw minuteCapError(principal, await deps.rateLimits.refused(minute, trx), at);
  }

  /** The 429 of a call over its caller's per-minute cap, with the `X-RateLimit-*` headers. */
  function minuteCapError(principal: Principal, hit: HitResult, at: number): ApiError {
    const staff = limits.staffAccounts.has(principal.accountId);
    const retryAfter = Math.max(1, Math.ceil((hit.resetAtMs - at) / 1000));
    return new ApiError(429, 'Rate limit exceeded', {
      body: {
        error: 'Rate limit exceeded',
        code: 'RPC_RATE_LIMIT_EXCEEDED',
        customMessage: `Request rate cap exceeded: ${formatCount(hit.limit)} requests per minute on the ${
          staff ? 'staff' : 'standard'
        } tier. Retry after the window resets in ${retryAfter} s.`,
      },
      headers: {
        'X-RateLimit-Limit': String(hit.limit),
        'X-RateLimit-Remaining': String(hit.remaining),
        'X-RateLimit-Reset': String(Math.ceil(hit.resetAtMs / 1000)),
        'Retry-After': String(retryAfter),
      },
    });
  }

  /** The count of a request in its caller's minute. */
  function minuteHit(principal: Principal, at: number) {
    const limit = limits.staffAccounts.has(principal.accountId)
      ? limits.staffRequestsPerMinute
      : limits.requestsPerMinute;
    return { bucket: `rpc:${principal.accountId}:RPM`, windowMs: MINUTE_MS, limit, now: at };
  }

  /**
   * What admits a call under the account's lock, before its hold: the count in the caller's minute, then the
   * worst case taken from the rolling 24-hour credit cap (the bucket it went to is the result). On PostgreSQL
   * also as the two writes of the reservation's one round trip (ReserveWithin.embedded) when both can be.
   */
  function admission(principal: Principal, plan: RpcPlan, counted: Counted): ReserveWithin<number> {
    const take = { subject: principal.accountId, credits: plan.worstCase, limit: limits.creditsPerDay };
    const within = async (trx: Transaction<Tables>) => {
      await admitMinute(principal, trx, counted);
      const taken = await deps.credits.takeIn(trx, take);
      if (!taken.allowed) throw creditCapError(taken.nextReleaseAtMs);
      if (deps.credits.holds)
        counted.credits = { subject: take.subject, bucketMs: taken.bucketMs, credits: take.credits };
      return taken.bucketMs;
    };
    // Both held in this process (one SQLite process): decided at once, and the hold with them (ledger.ts
    // holdNow), once the caller's windows are held.
    if (deps.credits.holds && deps.rateLimits.holds) {
      return Object.assign(within, { now: () => admitNow(principal, take, counted) });
    }
    const at = now();
    const minute = deps.rateLimits.hitAlong(minuteHit(principal, at));
    if (!minute) return within;
    const credits = deps.credits.takeAlong(extend(take, { now: at }));
    if (!credits) return within;
    return Object.assign(within, {
      embedded: { writes: [minute, ...credits.writes], result: credits.bucketMs },
    });
  }

  /**
   * `admission` decided at once, on the minute and the credits held in this process (ReserveWithin.now): the
   * bucket the credits went to, or undefined when either window is not held yet (nothing counted; the
   * transaction reads them). What it counted is in `counted`, for `forward` to take back.
   */
  function admitNow(
    principal: Principal,
    take: { subject: string; credits: number; limit: number },
    counted: Counted,
  ): number | undefined {
    if (!deps.credits.holdsNow(take.subject)) return undefined;
    const at = now();
    const minute = minuteHit(principal, at);
    const hit = deps.rateLimits.countNow(minute);
    if (!hit) return undefined;
    if (!hit.allowed) throw minuteCapError(principal, hit, at);
    counted.minute = minute;
    const taken = deps.credits.takeNow(extend(take, { now: at })) as CreditTakeResult;
    if (!taken.allowed) throw creditCapError(taken.nextReleaseAtMs);
    counted.credits = { subject: take.subject, bucketMs: taken.bucketMs, credits: take.credits };
    return taken.bucketMs;
  }

  function creditCapError(nextReleaseAtMs: number | undefined): ApiError {
    const retryAfter =
      nextReleaseAtMs === undefined ? undefined : Math.max(1, Math.ceil((nextReleaseAtMs - now()) / 1000));
    return new ApiError(429, 'Rate limit exceeded', {
      body: {
        error: 'Rate limit exceeded',
        code: 'RPC_CREDIT_CAP_EXCEEDED',
        customMessage: `Credit cap exceeded: ${formatCount(limits.creditsPerDay)} credits per rolling 24 hours.${
          retryAfter === undefined ? '' : ` Credits start freeing up in ${retryAfter} s.`
        }`,
      },
      headers: retryAfter === undefined ? {} : { 'Retry-After': String(retryAfter) },
    });
  }

  function upstreamFailure(network: RpcNetwork, error: UpstreamError): ApiError {
    const tried = `${error.attempts} node${error.attempts === 1 ? '' : 's'} tried`;
    switch (error.kind) {
      case 'timeout':
        return new ApiError(
          504,
          `The ${network.slug} node did not answer in time (${tried}); nothing was charged`,
          {
            code: 'UPSTREAM_TIMEOUT',
            cause: error,
          },
        );
      case 'too_large':
        return new ApiError(502, `The ${network.slug} node's answer is too large; nothing was charged`, {
          code: 'UPSTREAM_RESPONSE_TOO_LARGE',
          cause: error,
        });
      case 'bad_body':
        return new ApiError(
          502,
          `The ${network.slug} node answered something that is not JSON-RPC (${tried}); nothing was charged`,
          { code: 'UPSTREAM_INVALID_RESPONSE', cause: error },
        );
      case 'aborted':
        return new ApiError(499, 'The client closed the request', { code: 'CLIENT_CLOSED', cause: error });
      default:
        return new ApiError(
          502,
          `No ${network.slug} node could be reached (${tried}); nothing was charged. Retry later`,
          { code: 'UPSTREAM_UNAVAILABLE', cause: error },
        );
    }
  }

  /**
   * The billed call, in two transactions around the upstream call: the per-minute cap, the credit cap and the
   * reservation in one (under the account's lock; `admission`), the capture and the unspent credits' return
   * in the other, which the answer does not wait for.
   * Undoes its holds when it fails.
   */
  async function forward(
    principal: Principal,
    network: RpcNetwork,
    upstream: RpcUpstream,
    payload: Buffer,
    plan: RpcPlan,
    signal: AbortLike | undefined,
  ): Promise<RpcCallResult> {
    const subject = principal.accountId;
    // Time-ordered, as README documents (random-hex.ts timeOrderedHex).
    const requestId = timeOrderedHex(16);
    const worstNano = BigInt(plan.worstCase) * price;
    // Also when the worst case is free (a zero price): in the rows, the reservation's account lock serialises
    // the count (held, the process's one thread does).
    const counted: Counted = {};
    let reserved: { reservation: Reservation; within: number };
    try {
      reserved = await deps.charges.reserveWith(
        principal,
        { amountNano: worstNano, requestId, modelId: network.slug },
        admission(principal, plan, counted),
      );
    } catch (error) {
      // Refused after its count (the credit cap, the balance) or not committed: not counted in the minute,
      // nor in the credits. Should a row be unreadable, the window keeps it: one too many, never one too few.
      if (counted.minute) await deps.rateLimits.takeBack(counted.minute).catch(() => undefined);
      if (counted.credits) await deps.credits.giveBack(counted.credits).catch(() => undefined);
      throw error;
    }
    const { reservation, within: bucketMs } = reserved;
    let held = true;
    try {
      const answer = await upstream
        .forward({ payload, signal, parse: (_status, body) => billAnswer(plan, body) })
        .catch((error: unknown) => {
          throw error instanceof UpstreamError ? upstreamFailure(network, error) : error;
        });
      const credits = answer.parsed;
      const costNano = BigInt(credits) * price;
      const unspent = plan.worstCase - credits;
      const returned = { subject, bucketMs, credits: unspent };
      const giveBack =
        unspent > 0
          ? (runner?: Parameters<RpcCreditsRepository['giveBack']>[1]) =>
              deps.credits.giveBack(returned, runner)
          : undefined;
      if (costNano > 0n) {
        // The answer need not wait for its capture (captureDetached): the reservation already holds the
        // money, and a capture that fails gives back everything this call took. Held credits are given back
        // at once (whatever becomes of the capture's transaction): then a failed capture gives back the rest.
        const heldCredits = deps.credits.holds;
        deps.charges.captureDetached(
          reservation,
          [
            {
              sku: 'rpc_credit',
              amountNano: costNano,
              units: credits,
              unitPriceNano: price,
              modelId: network.slug,
            },
          ],
          heldCredits ? undefined : giveBack,
          () => deps.credits.giveBack({ subject, bucketMs, credits: heldCredits ? credits : plan.worstCase }),
        );
        held = false;
        if (heldCredits) giveBack?.().catch(() => undefined);
      } else {
        await deps.charges.release(reservation);
        held = false;
        await giveBack?.();
      }
      return {
        headers: {
          [CREDIT_HEADER]: String(credits),
          [COST_HEADER]: formatUsdFixed(costNano, 8),
          [REQUEST_ID_HEADER]: requestId,
        },
        body: answer.body,
      };
    } catch (error) {
      if (held) {
        await deps.charges.release(reservation).catch(() => undefined);
        await deps.credits.giveBack({ subject, bucketMs, credits: plan.worstCase }).catch(() => undefined);
      }
      throw error;
    }
  }

  return {
    /** The networks with an upstream, sorted by slug. */
    listNetworks(): components['schemas']['RpcNetworkList'] {
      const served = [...deps.networks.values()].filter((n) => deps.upstreams.has(n.slug));
      const slug = (n: RpcNetwork) => n.slug as components['schemas']['RpcNetwork'];
      return {
        networks: served.map(slug),
        details: served.map((n) => ({
          network: slug(n),
          family: n.family,
          chainId: n.chainId,
          testnet: n.testnet,
          baseCredits: n.baseCredits,
        })),
      };
    },

    /** Proxies one JSON-RPC request or batch; throws the ApiError to answer with. */
    async call(input: RpcCallInput): Promise<RpcCallResult> {
      const network = deps.networks.get(input.network);
      if (!network) throw new ApiError(400, 'Unsupported RPC network', { code: 'UNSUPPORTED_NETWORK' });
      const upstream = deps.upstreams.get(network.slug);
      if (!upstream) {
        throw new ApiError(
          503,
          `No upstream node is configured for ${network.slug}; GET /crypto/rpc/networks lists the networks served`,
          { code: 'RPC_NETWORK_UNAVAILABLE' },
        );
      }
      const plan = planRequest(network, input.body);
      const payload = Buffer.from(JSON.stringify(input.body));
      if (input.idempotencyKey === undefined || !deps.idempotency) {
        return forward(input.principal, network, upstream, payload, plan, input.signal);
      }

      const store = deps.idempotency;
      const scope: IdempotencyScope = {
        principal: input.principal.accountId,
        operation: OPERATION,
        key: input.idempotencyKey,
      };
      // The network is part of the request: the same key and body sent to another network is another request.
      const requestHash = hashRequestBody({ network: network.slug, body: input.body });
      const begun = await store.begin(scope, { requestHash });
      switch (begun.kind) {
        case 'replay':
          return {
            headers: extend(begun.response.headers, { 'Idempotent-Replayed': 'true' }),
            body: begun.response.body,
          };
        case 'in_flight':
          throw new ApiError(409, 'A request with this Idempotency-Key is still in progress', {
            code: 'IDEMPOTENCY_KEY_IN_FLIGHT',
          });
        case 'mismatch':
          throw new ApiError(
            400,
            'This Idempotency-Key was already used with a different request body (or network) in the last 24 hours',
            { code: 'IDEMPOTENCY_KEY_REUSED' },
          );
      }
      let result: RpcCallResult;
      try {
        result = await forward(input.principal, network, upstream, payload, plan, input.signal);
      } catch (error) {
        await store.abandon(scope).catch(() => undefined);
        throw error;
      }
      await store.complete(scope, { status: 200, headers: result.headers, body: result.body.toString() });
      return result;
    },
  };
}
