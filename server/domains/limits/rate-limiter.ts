/**
 * Rate limits per caller (API key, or wallet account) and model, from the catalogue's tier limits: requests
 * per minute and per day, and tokens per minute. Counters live in the shared database, so the limits hold in
 * total across server instances. Every refusal is a 429 `{error}` and an entry of the rate-limit log.
 * Admitting a request is one database statement (`RateLimitsRepository.admit`); a refused request is counted
 * in none of its windows.
 */
import type { CatalogService } from '../../catalog/service.ts';
import type { Principal } from '../../http/auth.ts';
import type { ReplyHeaders } from '../../http/contract.ts';
import { ApiError } from '../../http/errors.ts';
import type { EmbeddedWrite, StatementRunner } from '../../storage/internal.ts';
import type { ReserveWithin } from '../../storage/ledger.ts';
import type {
  AdmitInput,
  AdmitResult,
  AdmitWindow,
  HitResult,
  RateLimitsRepository,
  RateLimitType,
} from '../../storage/rate-limits.ts';
import type { AdmissionAlong } from '../billing/charges.ts';

const MINUTE = 60_000;
const DAY = 86_400_000;

export type RateLimiterDeps = {
  rateLimits: RateLimitsRepository;
  catalog: CatalogService;
  /** Requests per minute for operations without a model (key management, billing, listings). */
  managementRequestsPerMinute?: number;
  now?: () => number;
};

export type Admission = { headers: ReplyHeaders };

/** What the reservation's count found: the admission and when it was made. */
type Counted = { admission: AdmitResult; at: number };

/** A count refused in the reservation's transaction: thrown to roll it back, answered as the 429 after. */
class RateLimitRefusal extends Error {
  constructor(
    readonly admission: AdmitResult,
    readonly at: number,
  ) {
    super('rate limit reached');
  }
}

/**
 * A request's count against its model's rate limits, made by the request's reservation (Charges.reserve; it
 * implements the billing domain's AdmissionAlong): on PostgreSQL, writes of the reservation's one round trip,
 * so that admitting and holding the money cost one round trip instead of two. When that round trip refuses,
 * the reservation's transaction runs `within` under the account's lock before the hold is decided, so a
 * request over its limit is refused 429 before its balance is looked at, as when it was counted first, with
 * nothing held; what the handler refuses before reserving (a 400, a 404) is answered before the count. The
 * request's `x-ratelimit-*` headers come from `settle`, once the handler is done: it counts on its own a
 * request that never reserved (a 402, an idempotent replay), so that every admitted request is counted once.
 */
export type DeferredAdmission = AdmissionAlong<Counted> & {
  /** The `x-ratelimit-*` headers, after counting the request on its own if its reservation did not. */
  settle(): Promise<ReplyHeaders>;
};

const subjectOf = (p: Principal) => (p.kind === 'apiKey' ? `key:${p.keyId}` : `wallet:${p.accountId}`);
const typeOf = (p: Principal) => (p.kind === 'apiKey' ? 'api_key' : 'user');

export type RateLimiter = ReturnType<typeof createRateLimiter>;

/**
 * A request's token count, run on its own (no argument) or in the caller's transaction (`runner`); `embedded`
 * is the same count as a write another statement can make (the capture's, on PostgreSQL: one round trip).
 */
export type TokenCount = ((runner?: StatementRunner) => Promise<void>) & { embedded?: EmbeddedWrite };

export function createRateLimiter(deps: RateLimiterDeps) {
  const now = deps.now ?? Date.now;

  async function refuse(
    principal: Principal,
    modelId: string | null,
    tier: string,
    type: RateLimitType,
    resetAtMs: number,
  ) {
    await deps.rateLimits.logEvent({
      accountId: principal.accountId,
      apiKeyId: principal.kind === 'apiKey' ? principal.keyId : null,
      modelId,
      tier,
      limitType: type,
    });
    const retryAfter = Math.max(1, Math.ceil((resetAtMs - now()) / 1000));
    return new ApiError(
      429,
      `Rate limit exceeded (${type}${modelId ? ` for ${modelId}` : ''}); retry in ${retryAfter} s`,
      {
        code: 'RATE_LIMIT_EXCEEDED',
        headers: { 'Retry-After': String(retryAfter), 'x-ratelimit-type': typeOf(principal) },
      },
    );
  }

  /**
   * The statement of `consumeTokens`, to run later on its own (no argument) or in the caller's transaction
   * (`runner`), where it commits or rolls back with the caller's writes: the capture runs it so that a
   * request's charge and its tokens cost one commit. Undefined when there is nothing to count: no tokens,
   * no token limit for the model and tier, or a count that is not a whole number (an upstream's odd usage
   * figure is not counted, and cannot fail the transaction it would join).
   */
  function tokenCount(
    principal: Principal,
    tier: string,
    modelId: string,
    tokens: number,
  ): TokenCount | undefined {
    const limit = deps.catalog.getModel(modelId)?.rateLimits[tier]?.tokensPerMinute;
    if (!limit || !Number.isSafeInteger(tokens) || tokens <= 0) return undefined;
    // The window is the one the request finished in, whenever the statement runs.
    const input = {
      bucket: `${subjectOf(principal)}:model:${modelId}:TPM`,
      windowMs: MINUTE,
      // Counted even past the limit: the work is done; the next request is the one refused.
      limit: Number.MAX_SAFE_INTEGER,
      cost: tokens,
      now: now(),
    };
    const count: TokenCount = async (runner) => {
      await deps.rateLimits.hit(input, runner);
    };
    const embedded = deps.rateLimits.hitAlong(input);
    if (embedded) count.embedded = embedded;
    return count;
  }

  /**
   * What admits a request of the caller: its windows (per model when the request names a catalogue model with
   * limits for the tier, otherwise the caller's management window), the headers of an admission, and the 429
   * of a refusal (logged).
   */
  function planOf(principal: Principal, tier: string, requestedModel: string | undefined) {
    const subject = subjectOf(principal);
    const model = requestedModel ? deps.catalog.resolveModel(requestedModel)?.model : undefined;
    const limits = model?.rateLimits[tier];
    // Checked in this order, which is also the order of precedence when several refuse: the tokens (room
    // left, counted after the request), the day's requests, the minute's requests. One statement counts
    // the request in all of them, or in none when one refuses.
    const windows: (AdmitWindow & { type: RateLimitType })[] = [];
    if (!model || !limits) {
      const limit = deps.managementRequestsPerMinute ?? 600;
      windows.push({ type: 'RPM', bucket: `${subject}:manage:RPM`, windowMs: MINUTE, limit });
    } else {
      const base = `${subject}:model:${model.id}`;
      if (limits.tokensPerMinute)
        windows.push({
          type: 'TPM',
          bucket: `${base}:TPM`,
          windowMs: MINUTE,
          limit: limits.tokensPerMinute,
          peek: true,
        });
      if (limits.requestsPerDay)
        windows.push({ type: 'RPD', bucket: `${base}:RPD`, windowMs: DAY, limit: limits.requestsPerDay });
      windows.push({ type: 'RPM', bucket: `${base}:RPM`, windowMs: MINUTE, limit: limits.requestsPerMinute });
    }
    const modelId = model && limits ? model.id : null;
    return {
      /** Whether the request counts against a model's limits (not the management window). */
      modelId,
      input: (): AdmitInput => ({ windows, now: now() }),
      headers(admission: AdmitResult, at: number): ReplyHeaders {
        const minute = admission.windows.at(-1) as HitResult;
        const headers: ReplyHeaders = {
          'x-ratelimit-limit-requests': minute.limit,
          'x-ratelimit-remaining-requests': minute.remaining,
          'x-ratelimit-reset-requests': Math.ceil(minute.resetAtMs / 1000),
          'x-ratelimit-type': typeOf(principal),
        };
        const tokens = windows[0]?.type === 'TPM' ? admission.windows[0] : undefined;
        if (tokens) {
          headers['x-ratelimit-limit-tokens'] = tokens.limit;
          headers['x-ratelimit-remaining-tokens'] = tokens.remaining;
          headers['x-ratelimit-reset-tokens'] = Math.max(0, Math.ceil((tokens.resetAtMs - at) / 1000));
        }
        return headers;
      },
      refusal(admission: AdmitResult, at: number): Promise<ApiError> {
        const refused = admission.windows.findIndex((window) => !window.allowed);
        const type = windows[refused]?.type ?? 'RPM';
        return refuse(principal, modelId, tier, type, admission.windows[refused]?.resetAtMs ?? at);
      },
    };
  }

  return {
    /**
     * Counts this request for the caller: per model when the request names a catalogue model, otherwise in
     * the caller's management window. Throws 429 when a limit is reached; returns the `x-ratelimit-*` headers.
     */
    async admit(principal: Principal, tier: string, requestedModel: string | undefined): Promise<Admission> {
      const plan = planOf(principal, tier, requestedModel);
      const input = plan.input();
      const at = input.now ?? now();
      const admission = await deps.rateLimits.admit(input);
      if (!admission.allowed) throw await plan.refusal(admission, at);
      return { headers: plan.headers(admission, at) };
    },

    /**
     * `admit` of a request against a model's limits, left for the request's reservation to make (Charges.reserve):
     * on PostgreSQL a write of the reservation's one round trip. Undefined (the caller runs `admit`) on SQLite,
     * for a request counted in the management window, and when some window cannot fit at all. See
     * DeferredAdmission.
     */
    defer(
      principal: Principal,
      tier: string,
      requestedModel: string | undefined,
    ): DeferredAdmission | undefined {
      const plan = planOf(principal, tier, requestedModel);
      if (!plan.modelId) return undefined;
      const input = plan.input();
      const at = input.now ?? now();
      // Only where the count rides the reservation's one round trip (PostgreSQL): on SQLite a statement costs
      // no round trip, and a count of its own keeps more requests per commit group (measured: 5 to 7% more
      // chats per second than the count in the reservation's transaction).
      const along = deps.rateLimits.admitAlong(input);
      if (!along) return undefined;
      let headers: ReplyHeaders | undefined;
      /** The count as the reservation's statements (refused: the transaction is rolled back). */
      const within: ReserveWithin<Counted> = async (trx) => {
        const admission = await deps.rateLimits.admit(input, trx);
        if (!admission.allowed) throw new RateLimitRefusal(admission, at);
        return { admission, at };
      };
      within.embedded = { writes: along.writes, read: (written) => ({ admission: along.read(written), at }) };
      return {
        get within() {
          return headers ? undefined : within;
        },
        admitted(counted) {
          headers = plan.headers(counted.admission, counted.at);
        },
        async refused(error) {
          if (!(error instanceof RateLimitRefusal)) return error;
          // Refused: answered 429, counted nowhere.
          headers = {};
          return plan.refusal(error.admission, error.at);
        },
        async settle() {
          if (headers) return headers;
          // Never reserved (refused before it, or answered without a charge): counted now, on its own. The
          // answer is given; a refusal only means nothing is counted.
          const late = plan.input();
          const admission = await deps.rateLimits.admit(late);
          headers = admission.allowed ? plan.headers(admission, late.now ?? now()) : {};
          return headers;
        },
      };
    },

    /**
     * Adds the tokens a finished request used to the caller's tokens-per-minute window for the model: on its
     * own, or through `tokenCount` as a statement of the transaction that captures the request's charge.
     */
    async consumeTokens(principal: Principal, tier: string, modelId: string, tokens: number): Promise<void> {
      await tokenCount(principal, tier, modelId, tokens)?.();
    },

    tokenCount,
  };
}
