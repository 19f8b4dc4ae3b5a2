/**
 * Rate limits per caller (API key, or wallet account) and model, from the catalogue's tier limits: requests
 * per minute and per day, and tokens per minute. Counters live in the shared database, so the limits hold in
 * total across server instances (one SQLite process holds its own in memory and writes them behind:
 * held-counts.ts). Every refusal is a 429 `{error}` and an entry of the rate-limit log. Admitting a request is
 * one database statement, or none when the counts are held (`RateLimitsRepository.admit`); a refused request
 * is counted in none of its windows.
 */
import type { CatalogService } from '../../catalog/service.ts';
import type { Principal } from '../../http/auth.ts';
import type { ReplyHeaders } from '../../http/contract.ts';
import { ApiError } from '../../http/errors.ts';
import { whenReady } from '../../objects.ts';
import type { EmbeddedWrite, StatementRunner } from '../../storage/internal.ts';
import type {
  AdmitResult,
  AdmitWindow,
  HitResult,
  RateLimitsRepository,
  RateLimitType,
} from '../../storage/rate-limits.ts';

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

const subjectOf = (p: Principal) => (p.kind === 'apiKey' ? `key:${p.keyId}` : `wallet:${p.accountId}`);
const typeOf = (p: Principal) => (p.kind === 'apiKey' ? 'api_key' : 'user');

/** A caller's buckets for one model. */
type ModelBuckets = { tpm: string; rpd: string; rpm: string };
type SubjectBuckets = { manage: string; models: Map<string, ModelBuckets> };

/** Callers whose bucket names are remembered, per kind (a bounded memo: the same names either way). */
const REMEMBERED_SUBJECTS = 10_000;

/**
 * The bucket names of each caller, made at its first admission and the same string objects at every one after:
 * held counts are found by bucket (held-counts.ts), and V8 keeps a string's hash, so an admission builds and
 * hashes no name (three to four a chat before, each made by concatenation, flattened and hashed).
 */
function bucketNames() {
  const byKey = new Map<string, SubjectBuckets>();
  const byWallet = new Map<string, SubjectBuckets>();
  const of = (principal: Principal): SubjectBuckets => {
    const remembered = principal.kind === 'apiKey' ? byKey : byWallet;
    const id = principal.kind === 'apiKey' ? principal.keyId : principal.accountId;
    let names = remembered.get(id);
    if (!names) {
      if (remembered.size >= REMEMBERED_SUBJECTS) remembered.clear();
      names = { manage: `${subjectOf(principal)}:manage:RPM`, models: new Map() };
      remembered.set(id, names);
    }
    return names;
  };
  return {
    manage: (principal: Principal) => of(principal).manage,
    model(principal: Principal, modelId: string): ModelBuckets {
      const models = of(principal).models;
      let names = models.get(modelId);
      if (!names) {
        const base = `${subjectOf(principal)}:model:${modelId}`;
        names = { tpm: `${base}:TPM`, rpd: `${base}:RPD`, rpm: `${base}:RPM` };
        models.set(modelId, names);
      }
      return names;
    },
  };
}

export type RateLimiter = ReturnType<typeof createRateLimiter>;

/**
 * A request's token count, run on its own (no argument) or in the caller's transaction (`runner`); `embedded`
 * is the same count as a write another statement can make (the capture's, on PostgreSQL: one round trip).
 */
export type TokenCount = ((runner?: StatementRunner) => Promise<void>) & { embedded?: EmbeddedWrite };

export function createRateLimiter(deps: RateLimiterDeps) {
  const now = deps.now ?? Date.now;
  const buckets = bucketNames();

  /** The refusal, as the rejected promise an admission answers with. */
  async function refused(...args: Parameters<typeof refuse>): Promise<never> {
    throw await refuse(...args);
  }

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
      bucket: buckets.model(principal, modelId).tpm,
      windowMs: MINUTE,
      // Counted even past the limit: the work is done; the next request is the one refused.
      limit: Number.MAX_SAFE_INTEGER,
      cost: tokens,
      now: now(),
    };
    const count: TokenCount = async (runner) => {
      await deps.rateLimits.add(input, runner);
    };
    const embedded = deps.rateLimits.hitAlong(input);
    if (embedded) count.embedded = embedded;
    return count;
  }

  return {
    /**
     * Counts this request for the caller: per model when the request names a catalogue model, otherwise in
     * the caller's management window. Rejects with a 429 when a limit is reached; returns the `x-ratelimit-*`
     * headers, at once (not a promise) when the counts are held in memory and no statement is needed.
     */
    admit(
      principal: Principal,
      tier: string,
      requestedModel: string | undefined,
    ): Admission | Promise<Admission> {
      const at = now();
      const model = requestedModel ? deps.catalog.resolveModel(requestedModel)?.model : undefined;
      const limits = model?.rateLimits[tier];
      if (!model || !limits) {
        const limit = deps.managementRequestsPerMinute ?? 600;
        const input = { windows: [{ bucket: buckets.manage(principal), windowMs: MINUTE, limit }], now: at };
        const managed = (admission: AdmitResult): Admission | Promise<never> => {
          const [minute] = admission.windows as [HitResult];
          if (!admission.allowed) return refused(principal, null, tier, 'RPM', minute.resetAtMs);
          return {
            headers: {
              'x-ratelimit-limit-requests': minute.limit,
              'x-ratelimit-remaining-requests': minute.remaining,
              'x-ratelimit-reset-requests': Math.ceil(minute.resetAtMs / 1000),
              'x-ratelimit-type': typeOf(principal),
            },
          };
        };
        // At once when the counts are in memory; otherwise after the statement.
        return whenReady(deps.rateLimits.admitNow(input) ?? deps.rateLimits.admit(input), managed);
      }
      const names = buckets.model(principal, model.id);
      // Checked in this order, which is also the order of precedence when several refuse: the tokens (room
      // left, counted after the request), the day's requests, the minute's requests. One statement counts
      // the request in all of them, or in none when one refuses.
      const windows: (AdmitWindow & { type: 'TPM' | 'RPD' | 'RPM' })[] = [];
      if (limits.tokensPerMinute)
        windows.push({
          type: 'TPM',
          bucket: names.tpm,
          windowMs: MINUTE,
          limit: limits.tokensPerMinute,
          peek: true,
        });
      if (limits.requestsPerDay)
        windows.push({ type: 'RPD', bucket: names.rpd, windowMs: DAY, limit: limits.requestsPerDay });
      windows.push({ type: 'RPM', bucket: names.rpm, windowMs: MINUTE, limit: limits.requestsPerMinute });
      const modelId = model.id;
      const counted = (admission: AdmitResult): Admission | Promise<never> => {
        if (!admission.allowed) {
          const refusedAt = admission.windows.findIndex((window) => !window.allowed);
          const type = windows[refusedAt]?.type ?? 'RPM';
          return refused(principal, modelId, tier, type, admission.windows[refusedAt]?.resetAtMs ?? at);
        }
        const minute = admission.windows.at(-1) as HitResult;
        const tokens = windows[0]?.type === 'TPM' ? admission.windows[0] : undefined;
        // One literal for each case, nothing added after it is made: the token headers added afterwards missed
        // their store caches on every request in three of four `perf` profiles of loaded servers
        // (bench/HISTORY.md, forty-fifth round).
        const headers: ReplyHeaders = tokens
          ? {
              'x-ratelimit-limit-requests': minute.limit,
              'x-ratelimit-remaining-requests': minute.remaining,
              'x-ratelimit-reset-requests': Math.ceil(minute.resetAtMs / 1000),
              'x-ratelimit-type': typeOf(principal),
              'x-ratelimit-limit-tokens': tokens.limit,
              'x-ratelimit-remaining-tokens': tokens.remaining,
              'x-ratelimit-reset-tokens': Math.max(0, Math.ceil((tokens.resetAtMs - at) / 1000)),
            }
          : {
              'x-ratelimit-limit-requests': minute.limit,
              'x-ratelimit-remaining-requests': minute.remaining,
              'x-ratelimit-reset-requests': Math.ceil(minute.resetAtMs / 1000),
              'x-ratelimit-type': typeOf(principal),
            };
        return { headers };
      };
      // An API-key request's admission, while others write, waits for the next commit group and shares its
      // commit (5 to 10% more chats a second at 16 connections). Not a wallet's: its sign-in has written a
      // nonce already and checked a signature, and there the wait cost more than the commit it saved (9% fewer
      // wallet-paid chats a second: bench/HISTORY.md, thirty-fourth round). With the counts in memory (one
      // SQLite process), decided at once, no statement and no promise.
      const input = { windows, now: at, joinShared: principal.kind === 'apiKey' };
      return whenReady(deps.rateLimits.admitNow(input) ?? deps.rateLimits.admit(input), counted);
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
