/**
 * API keys. The secret is shown once, at creation; the database keeps only its SHA-256 (hex) and its last six
 * characters. Revoking is a soft delete: the row stays for the ledger and the key never authenticates again.
 */
import { hash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Selectable, Updateable } from 'kysely';
import { type Database, withChangeNoted } from './database.ts';
import { InvalidInputError, type LimitPeriod, NotFoundError } from './errors.ts';
import { type RepositoryOptions, resolveOptions, toNumber, toNumberOrNull } from './internal.ts';
import type { ApiKeysTable } from './schema.ts';

export type ApiKeyType = 'INFERENCE' | 'ADMIN';
export type { LimitPeriod } from './errors.ts';
export type ModelPrivacy = 'ALL' | 'PRIVATE_TEXT' | 'PRIVATE_ONLY';

export type ApiKeyRecord = {
  id: string;
  accountId: string;
  keyType: ApiKeyType;
  description: string;
  last6: string;
  createdAtMs: number;
  expiresAtMs: number | null;
  lastUsedAtMs: number | null;
  revokedAtMs: number | null;
  /** Spend cap per `limitPeriod` in nano-USD; `null` for none. */
  limitUsdNano: bigint | null;
  limitDiemNano: bigint | null;
  limitPeriod: LimitPeriod;
  modelPrivacy: ModelPrivacy;
};

export type CreateKeyInput = {
  accountId: string;
  keyType: ApiKeyType;
  description?: string;
  expiresAtMs?: number | null;
  limitUsdNano?: bigint | null;
  limitDiemNano?: bigint | null;
  limitPeriod?: LimitPeriod;
  modelPrivacy?: ModelPrivacy;
};

export type CreateKeyResult = { key: ApiKeyRecord; secret: string };

export type UpdateKeyInput = {
  description?: string;
  expiresAtMs?: number | null;
  limitUsdNano?: bigint | null;
  limitDiemNano?: bigint | null;
  limitPeriod?: LimitPeriod;
  modelPrivacy?: ModelPrivacy;
};

export type AuthFailureReason = 'unknown' | 'revoked' | 'expired';
export type AuthenticateResult = { ok: true; key: ApiKeyRecord } | { ok: false; reason: AuthFailureReason };

export type ApiKeysOptions = RepositoryOptions & {
  /** `touchLastUsed` skips the write when the stored time is newer than this (default 1000 ms). */
  lastUsedResolutionMs?: number;
};

export type ApiKeysRepository = ReturnType<typeof createApiKeys>;

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const SECRET_CHARS = 44;
const PREFIX: Record<ApiKeyType, string> = { INFERENCE: 'svc_inference_', ADMIN: 'svc_admin_' };

/** A fresh secret: the type's prefix and 44 uniformly random base62 characters (about 262 bits). */
export function generateSecret(keyType: ApiKeyType): string {
  let out = '';
  while (out.length < SECRET_CHARS) {
    for (const byte of randomBytes(64)) {
      // Rejection sampling: 248 = 4 * 62, so bytes below it map uniformly onto the alphabet.
      if (byte < 248 && out.length < SECRET_CHARS) out += BASE62[byte % 62];
    }
  }
  return PREFIX[keyType] + out;
}

/**
 * SHA-256 of the secret (UTF-8), lowercase hex: the only form in which a secret is stored. Worked out for every
 * authenticated request (the key cache is keyed by it): the one-shot `hash`, without a Hash object.
 */
export function hashSecret(secret: string): string {
  return hash('sha256', secret, 'hex');
}

export function toApiKey(row: Selectable<ApiKeysTable>): ApiKeyRecord {
  return {
    id: row.id,
    accountId: row.account_id,
    keyType: row.key_type,
    description: row.description,
    last6: row.last6,
    createdAtMs: toNumber(row.created_at_ms),
    expiresAtMs: toNumberOrNull(row.expires_at_ms),
    lastUsedAtMs: toNumberOrNull(row.last_used_at_ms),
    revokedAtMs: toNumberOrNull(row.revoked_at_ms),
    limitUsdNano: row.limit_usd_nano,
    limitDiemNano: row.limit_diem_nano,
    limitPeriod: row.limit_period,
    modelPrivacy: row.model_privacy,
  };
}

function checkLimits(input: UpdateKeyInput): void {
  for (const field of ['limitUsdNano', 'limitDiemNano'] as const) {
    const value = input[field];
    if (value !== undefined && value !== null && (typeof value !== 'bigint' || value < 0n)) {
      throw new InvalidInputError(field, `${field} must be a non-negative bigint`);
    }
  }
  if (
    input.expiresAtMs !== undefined &&
    input.expiresAtMs !== null &&
    !Number.isSafeInteger(input.expiresAtMs)
  ) {
    throw new InvalidInputError('expiresAtMs', 'expiresAtMs must be an integer');
  }
}

function isForeignKeyViolation(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === '23503' || code === 'SQLITE_CONSTRAINT_FOREIGNKEY';
}

/** The API keys repository. */
export function createApiKeys(database: Database, options: ApiKeysOptions = {}) {
  const { db } = database;
  const { now, randomId } = resolveOptions(options);
  const resolutionMs = options.lastUsedResolutionMs ?? 1000;

  async function insertKey(input: CreateKeyInput, secret: string): Promise<ApiKeyRecord | undefined> {
    checkLimits(input);
    try {
      const row = await db
        .insertInto('api_keys')
        .values({
          id: randomId(),
          account_id: input.accountId,
          key_type: input.keyType,
          description: input.description ?? '',
          secret_hash: hashSecret(secret),
          last6: secret.slice(-6),
          created_at_ms: now(),
          expires_at_ms: input.expiresAtMs ?? null,
          last_used_at_ms: null,
          revoked_at_ms: null,
          limit_usd_nano: input.limitUsdNano ?? null,
          limit_diem_nano: input.limitDiemNano ?? null,
          limit_period: input.limitPeriod ?? 'EPOCH',
          model_privacy: input.modelPrivacy ?? 'ALL',
        })
        .onConflict((oc) => oc.column('secret_hash').doNothing())
        .returningAll()
        .executeTakeFirst();
      return row ? toApiKey(row) : undefined;
    } catch (error) {
      if (isForeignKeyViolation(error)) throw new NotFoundError('account', input.accountId, { cause: error });
      throw error;
    }
  }

  async function get(id: string): Promise<ApiKeyRecord> {
    const row = await db.selectFrom('api_keys').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) throw new NotFoundError('api key', id);
    return toApiKey(row);
  }

  return {
    /** Returns the key (revoked ones included), or throws NotFoundError. */
    get,

    /** Creates a key and returns its secret; the secret cannot be read again. */
    async create(input: CreateKeyInput): Promise<CreateKeyResult> {
      // A collision of 262 random bits does not happen; the loop only keeps the unique index honest.
      for (let attempt = 0; attempt < 3; attempt++) {
        const secret = generateSecret(input.keyType);
        const key = await insertKey(input, secret);
        if (key) return { key, secret };
      }
      throw new Error('Could not generate a unique API key secret');
    },

    /**
     * Makes sure a key with exactly this secret exists (a configured ADMIN_API_KEY), creating it on the given
     * account when missing. Idempotent and safe under concurrency (unique hash, `ON CONFLICT DO NOTHING`).
     * An existing key is returned as it is, even if it was revoked: revocation is never silently undone.
     */
    async ensureKeyWithSecret(
      accountId: string,
      keyType: ApiKeyType,
      secret: string,
      extra: { description?: string } = {},
    ): Promise<{ key: ApiKeyRecord; created: boolean }> {
      if (secret.length < 6) throw new InvalidInputError('secret', 'Secret is too short');
      const key = await insertKey({ accountId, keyType, description: extra.description }, secret);
      if (key) return { key, created: true };
      const row = await db
        .selectFrom('api_keys')
        .selectAll()
        .where('secret_hash', '=', hashSecret(secret))
        .executeTakeFirstOrThrow();
      return { key: toApiKey(row), created: false };
    },

    /**
     * Resolves a presented secret to its key, or says why it is refused. The stored hash is compared with
     * `timingSafeEqual`; revoked keys are refused before expired ones.
     */
    async authenticate(secret: string, at: number = now()): Promise<AuthenticateResult> {
      const digest = hashSecret(secret);
      const row = await db
        .selectFrom('api_keys')
        .selectAll()
        .where('secret_hash', '=', digest)
        .executeTakeFirst();
      if (!row) return { ok: false, reason: 'unknown' };
      const stored = Buffer.from(row.secret_hash, 'hex');
      const presented = Buffer.from(digest, 'hex');
      if (stored.length !== presented.length || !timingSafeEqual(stored, presented)) {
        return { ok: false, reason: 'unknown' };
      }
      const key = toApiKey(row);
      if (key.revokedAtMs !== null) return { ok: false, reason: 'revoked' };
      if (key.expiresAtMs !== null && key.expiresAtMs <= at) return { ok: false, reason: 'expired' };
      return { ok: true, key };
    },

    /** The account's keys, oldest first; revoked keys only when asked. */
    async list(accountId: string, listOptions: { includeRevoked?: boolean } = {}): Promise<ApiKeyRecord[]> {
      let query = db.selectFrom('api_keys').selectAll().where('account_id', '=', accountId);
      if (!listOptions.includeRevoked) query = query.where('revoked_at_ms', 'is', null);
      const rows = await query.orderBy('created_at_ms').orderBy('id').execute();
      return rows.map(toApiKey);
    },

    /** Changes a key's description, expiry, limits or privacy; fields left out stay as they are. */
    async update(id: string, patch: UpdateKeyInput): Promise<ApiKeyRecord> {
      checkLimits(patch);
      const set: Updateable<ApiKeysTable> = {};
      if (patch.description !== undefined) set.description = patch.description;
      if (patch.expiresAtMs !== undefined) set.expires_at_ms = patch.expiresAtMs;
      if (patch.limitUsdNano !== undefined) set.limit_usd_nano = patch.limitUsdNano;
      if (patch.limitDiemNano !== undefined) set.limit_diem_nano = patch.limitDiemNano;
      if (patch.limitPeriod !== undefined) set.limit_period = patch.limitPeriod;
      if (patch.modelPrivacy !== undefined) set.model_privacy = patch.modelPrivacy;
      if (Object.keys(set).length === 0) return get(id);
      const write = async () => {
        const row = await db
          .updateTable('api_keys')
          .set(set)
          .where('id', '=', id)
          .returningAll()
          .executeTakeFirst();
        if (!row) throw new NotFoundError('api key', id);
        return toApiKey(row);
      };
      // A spend limit decides what a hold may take.
      const limits = 'limit_usd_nano' in set || 'limit_diem_nano' in set || 'limit_period' in set;
      return limits ? withChangeNoted(database, write) : write();
    },

    /** Revokes the key (soft delete). Idempotent: the first revocation time is kept. */
    async revoke(id: string, at: number = now()): Promise<ApiKeyRecord> {
      await db
        .updateTable('api_keys')
        .set({ revoked_at_ms: at })
        .where('id', '=', id)
        .where('revoked_at_ms', 'is', null)
        .execute();
      return get(id);
    },

    /**
     * Records that the key was used. One indexed UPDATE and no read; it writes only when the stored time is
     * older than the resolution, so a busy key does not turn every request into a write.
     */
    async touchLastUsed(id: string, at: number = now()): Promise<void> {
      await db
        .updateTable('api_keys')
        .set({ last_used_at_ms: at })
        .where('id', '=', id)
        .where((eb) =>
          eb.or([eb('last_used_at_ms', 'is', null), eb('last_used_at_ms', '<=', at - resolutionMs)]),
        )
        .execute();
    },
  };
}
