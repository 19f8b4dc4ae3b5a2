/**
 * API-key lookups without a database round trip per request: `cacheApiKeys` wraps the API keys repository
 * with an in-process cache of successful authentications, keyed by the secret's SHA-256.
 *
 * Invalidation: revoking or updating a key through this repository drops it from this process's cache at
 * once, so the next request with it is refused (or sees the new settings). Another process (a second server
 * instance, `npm run admin -- revoke-key`) cannot reach this cache: there an entry lives at most `ttlMs`
 * (`API_KEY_CACHE_TTL_MS`, default 1000 ms), which bounds how long a key revoked elsewhere keeps working.
 * Expiry is checked on every request against the cached expiry time. Failures are never cached, so probing
 * with random secrets cannot fill the cache, and the cache holds at most `maxEntries` keys.
 *
 * `touchLastUsed` is also throttled here: one write per key per `lastUsedResolutionMs` from this process,
 * instead of an UPDATE statement per request that the database then finds to have nothing to do.
 * `authenticateCached` and `touchIfDue` give the cache's answers themselves, without a promise, to the
 * request path (a cached key's request then waits for nothing to be authenticated).
 */
import type { ApiKeyRecord, ApiKeysRepository, AuthenticateResult } from '../../storage/api-keys.ts';
import { hashSecret } from '../../storage/api-keys.ts';

export type ApiKeyCacheOptions = {
  /** How long a successful lookup is reused (0: no cache). */
  ttlMs: number;
  /** Most keys kept (oldest dropped first; default 10,000). */
  maxEntries?: number;
  /** Minimum time between two last-used writes of one key from this process (default 1000 ms). */
  lastUsedResolutionMs?: number;
  now?: () => number;
};

type Entry = { key: ApiKeyRecord; digest: string; until: number };

/** The repository with the cache's answers that need no promise. */
export type CachedApiKeys = ApiKeysRepository & {
  /**
   * `authenticate`'s answer itself when the secret's key is cached (a hit, or a cached key found expired);
   * undefined when it must be looked up (call `authenticate`).
   */
  authenticateCached(secret: string, at?: number): AuthenticateResult | undefined;
  /**
   * `touchLastUsed` when the key's last use is due to be written; undefined, and nothing to wait for, when this
   * process wrote it less than `lastUsedResolutionMs` ago.
   */
  touchIfDue(id: string, at?: number): Promise<void> | undefined;
};

export function cacheApiKeys(keys: ApiKeysRepository, options: ApiKeyCacheOptions): CachedApiKeys {
  const now = options.now ?? Date.now;
  const maxEntries = options.maxEntries ?? 10_000;
  const resolutionMs = options.lastUsedResolutionMs ?? 1000;
  const byDigest = new Map<string, Entry>();
  const digestsById = new Map<string, Set<string>>();
  const touchedAt = new Map<string, number>();
  /** Bumped by every invalidation: a lookup that overlapped one is not cached (it may predate it). */
  let generation = 0;

  function forget(id: string): void {
    generation++;
    for (const digest of digestsById.get(id) ?? []) byDigest.delete(digest);
    digestsById.delete(id);
  }

  function remember(digest: string, key: ApiKeyRecord, at: number): void {
    if (options.ttlMs <= 0) return;
    if (byDigest.size >= maxEntries) {
      const oldest = byDigest.values().next().value;
      if (oldest) {
        byDigest.delete(oldest.digest);
        digestsById.get(oldest.key.id)?.delete(oldest.digest);
      }
    }
    byDigest.set(digest, { key, digest, until: at + options.ttlMs });
    let digests = digestsById.get(key.id);
    if (!digests) {
      digests = new Set();
      digestsById.set(key.id, digests);
    }
    digests.add(digest);
  }

  function authenticateCached(secret: string, at: number = now()): AuthenticateResult | undefined {
    return cachedResult(hashSecret(secret), at);
  }

  /** The cached answer for a secret's digest (see authenticateCached). */
  function cachedResult(digest: string, at: number): AuthenticateResult | undefined {
    const cached = byDigest.get(digest);
    if (!cached) return undefined;
    if (cached.until <= at) {
      byDigest.delete(digest);
      return undefined;
    }
    // The same checks as the repository's, on the cached record (it was neither revoked nor expired).
    if (cached.key.expiresAtMs !== null && cached.key.expiresAtMs <= at) {
      forget(cached.key.id);
      return { ok: false, reason: 'expired' };
    }
    return { ok: true, key: cached.key };
  }

  function touchIfDue(id: string, at: number = now()): Promise<void> | undefined {
    const last = touchedAt.get(id);
    if (last !== undefined && at - last < resolutionMs) return undefined;
    touchedAt.set(id, at);
    if (touchedAt.size > maxEntries) {
      const oldest = touchedAt.keys().next().value;
      if (oldest !== undefined) touchedAt.delete(oldest);
    }
    return keys.touchLastUsed(id, at);
  }

  return {
    ...keys,

    authenticateCached,

    async authenticate(secret: string, at: number = now()): Promise<AuthenticateResult> {
      // The secret hashed once, for the lookup and for what is remembered.
      const digest = hashSecret(secret);
      const known = cachedResult(digest, at);
      if (known) return known;
      const before = generation;
      const result = await keys.authenticate(secret, at);
      if (result.ok && generation === before) remember(digest, result.key, at);
      return result;
    },

    async update(id, patch) {
      forget(id);
      try {
        return await keys.update(id, patch);
      } finally {
        forget(id);
      }
    },

    async revoke(id, at) {
      forget(id);
      try {
        return await keys.revoke(id, at);
      } finally {
        // Also drops a lookup that raced the revocation and cached the key just before it was written.
        forget(id);
      }
    },

    touchIfDue,

    async touchLastUsed(id: string, at: number = now()): Promise<void> {
      await touchIfDue(id, at);
    },
  };
}
