/**
 * API-key management: thin handlers over the key repository and the ledger. Keys are scoped to the caller's
 * account; another account's key is "not found". The secret leaves the server once, in the create response.
 */
import type { ApiKey, ApiKeyModelRateLimits } from '../../../generated/api.d.ts';
import type { HandlerTable } from '../../http/contract.ts';
import { ApiError, badRequest, notFound } from '../../http/errors.ts';
import { formatUsdFixed, nanoToUsdNumber, usdNumberToNano } from '../../money.ts';
import type { ApiKeyRecord, ApiKeysRepository } from '../../storage/api-keys.ts';
import { NotFoundError } from '../../storage/errors.ts';
import type { LedgerRepository } from '../../storage/ledger.ts';
import type { RateLimitsRepository } from '../../storage/rate-limits.ts';
import { requireApiKeyPrincipal } from '../principal.ts';

export type KeyHandlerDeps = {
  keys: ApiKeysRepository;
  ledger: LedgerRepository;
  rateLimits: RateLimitsRepository;
  now?: () => number;
  /** At most this many active keys per account. */
  maxActiveKeys?: number;
  /** Key creations per account per minute. */
  createsPerMinute?: number;
  /** The per-model limits of the caller's tier (from the catalogue). */
  rateLimitsFor(tier: string): ApiKeyModelRateLimits[];
  /** The rate-limit tier of an account. */
  tierOf(accountId: string): Promise<string>;
};

const DAY_MS = 86_400_000;

type KeyOps =
  | 'listApiKeys'
  | 'createApiKey'
  | 'updateApiKey'
  | 'deleteApiKey'
  | 'getApiKey'
  | 'getApiKeyRateLimits'
  | 'listApiKeyRateLimitLogs';

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
const limitOut = (nano: bigint | null) => (nano === null ? null : nanoToUsdNumber(nano));

/** `expiresAt` from a request: '' or null removes it; a date means 00:00 UTC that day; it must be in the future. */
export function parseExpiresAt(value: string | null | undefined, now: number): number | null | undefined {
  if (value === undefined) return undefined;
  if (value === null || value === '') return null;
  const ms = /^\d{4}-\d{2}-\d{2}$/.test(value) ? Date.parse(`${value}T00:00:00Z`) : Date.parse(value);
  if (Number.isNaN(ms)) throw badRequest(`expiresAt '${value}' is not a date or a date-time`);
  if (ms <= now) throw badRequest('expiresAt must be in the future');
  return ms;
}

function limitIn(value: number | null | undefined): bigint | null | undefined {
  if (value === undefined || value === null) return value;
  return usdNumberToNano(value);
}

export function createKeyHandlers(deps: KeyHandlerDeps): Pick<HandlerTable, KeyOps> {
  const now = deps.now ?? Date.now;
  const maxActive = deps.maxActiveKeys ?? 500;

  async function present(key: ApiKeyRecord, at: number): Promise<ApiKey> {
    const week = await deps.ledger.keySpend(key.id, { sinceMs: at - 7 * DAY_MS });
    const out: ApiKey = {
      id: key.id,
      apiKeyType: key.keyType,
      description: key.description,
      createdAt: iso(key.createdAtMs),
      expiresAt: iso(key.expiresAtMs),
      lastUsedAt: iso(key.lastUsedAtMs),
      last6Chars: key.last6,
      consumptionLimits: { usd: limitOut(key.limitUsdNano), diem: limitOut(key.limitDiemNano) },
      limitPeriod: key.limitPeriod,
      modelPrivacy: key.modelPrivacy,
      usage: {
        trailingSevenDays: { usd: formatUsdFixed(week.usdNano, 4), diem: formatUsdFixed(week.diemNano, 4) },
      },
    };
    if (key.limitUsdNano !== null || key.limitDiemNano !== null) {
      const current = await deps.ledger.keySpend(key.id, {
        sinceMs: deps.ledger.periodStart(key.limitPeriod, at),
        includeHeld: true,
      });
      out.currentPeriodUsage = {
        usd: formatUsdFixed(current.usdNano, 4),
        diem: formatUsdFixed(current.diemNano, 4),
      };
    }
    return out;
  }

  /** The key, if it belongs to the account; otherwise 404 (another account's keys do not exist for you). */
  async function ownKey(accountId: string, id: string): Promise<ApiKeyRecord> {
    try {
      const key = await deps.keys.get(id);
      if (key.accountId === accountId && key.revokedAtMs === null) return key;
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
    }
    throw notFound(`No API key with id ${id}`, 'API_KEY_NOT_FOUND');
  }

  return {
    async listApiKeys({ principal }) {
      const caller = requireApiKeyPrincipal(principal);
      const at = now();
      const keys = await deps.keys.list(caller.accountId);
      return {
        status: 200,
        body: { object: 'list', data: await Promise.all(keys.map((k) => present(k, at))) },
      };
    },

    async getApiKey({ principal, path }) {
      const caller = requireApiKeyPrincipal(principal);
      return { status: 200, body: { data: await present(await ownKey(caller.accountId, path.id), now()) } };
    },

    async createApiKey({ principal, body }) {
      const caller = requireApiKeyPrincipal(principal);
      const at = now();
      const window = await deps.rateLimits.hit({
        bucket: `api-keys:create:${caller.accountId}`,
        windowMs: 60_000,
        limit: deps.createsPerMinute ?? 20,
        now: at,
      });
      if (!window.allowed) {
        throw new ApiError(429, 'Too many API keys created; at most 20 per minute', {
          code: 'RATE_LIMIT_EXCEEDED',
          headers: { 'Retry-After': String(Math.max(1, Math.ceil((window.resetAtMs - at) / 1000))) },
        });
      }
      const active = await deps.keys.list(caller.accountId);
      if (active.length >= maxActive) {
        throw badRequest(`An account can hold at most ${maxActive} active API keys`, 'TOO_MANY_API_KEYS');
      }
      const expiresAtMs = parseExpiresAt(body.expiresAt, at) ?? null;
      const { key, secret } = await deps.keys.create({
        accountId: caller.accountId,
        keyType: body.apiKeyType,
        description: body.description,
        expiresAtMs,
        limitUsdNano: limitIn(body.consumptionLimit?.usd) ?? null,
        limitDiemNano: limitIn(body.consumptionLimit?.diem) ?? null,
        limitPeriod: body.limitPeriod ?? 'EPOCH',
        modelPrivacy: body.modelPrivacy ?? 'ALL',
      });
      return {
        status: 200,
        body: {
          success: true,
          data: {
            id: key.id,
            apiKey: secret,
            apiKeyType: key.keyType,
            description: key.description,
            expiresAt: iso(key.expiresAtMs),
            consumptionLimit: { usd: limitOut(key.limitUsdNano), diem: limitOut(key.limitDiemNano) },
            limitPeriod: key.limitPeriod,
            modelPrivacy: key.modelPrivacy,
            createdAt: new Date(key.createdAtMs).toISOString(),
          },
        },
      };
    },

    async updateApiKey({ principal, body }) {
      const caller = requireApiKeyPrincipal(principal);
      await ownKey(caller.accountId, body.id);
      const at = now();
      const expiresAtMs = parseExpiresAt(body.expiresAt, at);
      const usd = limitIn(body.consumptionLimit?.usd);
      const diem = limitIn(body.consumptionLimit?.diem);
      const updated = await deps.keys.update(body.id, {
        ...(body.description !== undefined ? { description: body.description } : {}),
        ...(expiresAtMs !== undefined ? { expiresAtMs } : {}),
        ...(usd !== undefined ? { limitUsdNano: usd } : {}),
        ...(diem !== undefined ? { limitDiemNano: diem } : {}),
        ...(body.limitPeriod ? { limitPeriod: body.limitPeriod } : {}),
        ...(body.modelPrivacy ? { modelPrivacy: body.modelPrivacy } : {}),
      });
      return { status: 200, body: { success: true, data: await present(updated, at) } };
    },

    async deleteApiKey({ principal, query }) {
      const caller = requireApiKeyPrincipal(principal);
      await ownKey(caller.accountId, query.id);
      await deps.keys.revoke(query.id, now());
      return { status: 200, body: { success: true } };
    },

    async getApiKeyRateLimits({ principal }) {
      const caller = requireApiKeyPrincipal(principal);
      const at = now();
      const [key, balance, tier] = await Promise.all([
        deps.keys.get(caller.keyId),
        deps.ledger.getBalance(caller.accountId, at),
        deps.tierOf(caller.accountId),
      ]);
      const today = deps.ledger.periodStart('EPOCH', at);
      return {
        status: 200,
        body: {
          data: {
            accessPermitted: balance.usdAvailableNano > 0n || balance.diemAvailableNano > 0n,
            apiTier: { id: tier, isCharged: true },
            balances: {
              USD: nanoToUsdNumber(balance.usdNano),
              DIEM: nanoToUsdNumber(balance.diemAllowanceNano - balance.diemUsedTodayNano),
            },
            keyExpiration: iso(key.expiresAtMs),
            nextEpochBegins: new Date(today + DAY_MS).toISOString(),
            rateLimits: deps.rateLimitsFor(tier),
          },
        },
      };
    },

    async listApiKeyRateLimitLogs({ principal }) {
      const caller = requireApiKeyPrincipal(principal);
      const events = await deps.rateLimits.listEvents(caller.accountId, 50);
      return {
        status: 200,
        body: {
          object: 'list',
          // Refusals of wallet callers have no key; this log is about the account's keys.
          data: events.flatMap((e) =>
            e.apiKeyId === null
              ? []
              : [
                  {
                    apiKeyId: e.apiKeyId,
                    modelId: e.modelId ?? 'unknown',
                    rateLimitTier: e.tier ?? 'standard',
                    rateLimitType: e.limitType,
                    timestamp: new Date(e.createdAtMs).toISOString(),
                  },
                ],
          ),
        },
      };
    },
  };
}
