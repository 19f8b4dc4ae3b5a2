/**
 * Idempotency records, shared by every process through the database: the first request with a given
 * (caller, operation, Idempotency-Key) runs; a later one with the same body gets the stored response, one that
 * arrives while the first is still working gets `in_flight` (the caller answers 409), and one with a different
 * body gets `mismatch` (400).
 *
 * Who runs is decided by the primary key: `begin` inserts with ON CONFLICT DO NOTHING, so of any number of
 * concurrent requests on any number of instances exactly one sees its row inserted. A record expires after its
 * TTL (24 hours by default). An in-flight record carries a lease: if its owner died (crash, SIGKILL) another
 * request with the same body takes it over after the lease; the takeover is a conditional UPDATE, so again one
 * winner. `complete` and `abandon` act only for the current owner.
 */
import { createHash, randomUUID } from 'node:crypto';
import type { Database } from './database.ts';
import { InvalidInputError } from './errors.ts';
import { type RepositoryOptions, resolveOptions, toNumber } from './internal.ts';

export const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
export const IDEMPOTENCY_LEASE_MS = 5 * 60 * 1000;
export const IDEMPOTENCY_KEY_PATTERN = /^[A-Za-z0-9_-]{1,255}$/;

export type StoredResponse = { status: number; headers: Record<string, string>; body: string };

export type IdempotencyScope = {
  /** Who: the caller (account id, and key id where relevant), e.g. `acct_…:key_…` or `wallet:0xabc…`. */
  principal: string;
  /** Which operation, e.g. `callCryptoRpc`. */
  operation: string;
  /** The `Idempotency-Key` header value. */
  key: string;
};

export type BeginResult =
  /** This request owns the key: do the work, then `complete` or `abandon`. */
  | { kind: 'started'; owner: string }
  /** Same key and body, finished within the TTL: answer with the stored response. */
  | { kind: 'replay'; response: StoredResponse }
  /** Same key and body, still being worked on by another request. */
  | { kind: 'in_flight' }
  /** Same key, different body. */
  | { kind: 'mismatch' };

export type BeginOptions = {
  /** sha256 hex of the canonical request (see `hashRequestBody`). */
  requestHash: string;
  ttlMs?: number;
  leaseMs?: number;
};

export type IdempotencyStore = ReturnType<typeof createIdempotency>;

/** JSON with object keys sorted at every level, so equal bodies hash equally whatever their key order. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
}

/** The request hash idempotency compares: sha256 hex of the canonical JSON of the body. */
export function hashRequestBody(body: unknown): string {
  return createHash('sha256').update(canonicalJson(body)).digest('hex');
}

function checkScope(scope: IdempotencyScope): void {
  if (!IDEMPOTENCY_KEY_PATTERN.test(scope.key)) {
    throw new InvalidInputError('key', 'Idempotency-Key must be 1 to 255 of A-Z, a-z, 0-9, "_" and "-"');
  }
  if (!scope.principal || !scope.operation) {
    throw new InvalidInputError('scope', 'principal and operation are required');
  }
}

/** The idempotency repository. */
export function createIdempotency(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);

  const byScope = (scope: IdempotencyScope) =>
    db
      .selectFrom('idempotency_records')
      .selectAll()
      .where('principal', '=', scope.principal)
      .where('operation', '=', scope.operation)
      .where('idem_key', '=', scope.key);

  return {
    async begin(scope: IdempotencyScope, input: BeginOptions): Promise<BeginResult> {
      checkScope(scope);
      const ttlMs = input.ttlMs ?? IDEMPOTENCY_TTL_MS;
      const leaseMs = input.leaseMs ?? IDEMPOTENCY_LEASE_MS;
      // Two rounds at most: insert, or read what is there and take it over if it is expired or abandoned by a
      // dead owner; if another request wins that takeover, the second read sees its record.
      for (let round = 0; round < 3; round++) {
        const at = now();
        const owner = randomUUID();
        const fresh = {
          request_hash: input.requestHash,
          state: 'in_flight' as const,
          owner,
          lease_until_ms: at + leaseMs,
          expires_at_ms: at + ttlMs,
          status: null,
          headers: null,
          body: null,
          created_at_ms: at,
        };
        const inserted = await db
          .insertInto('idempotency_records')
          .values({ principal: scope.principal, operation: scope.operation, idem_key: scope.key, ...fresh })
          .onConflict((oc) => oc.columns(['principal', 'operation', 'idem_key']).doNothing())
          .executeTakeFirst();
        if (Number(inserted.numInsertedOrUpdatedRows ?? 0n) === 1) return { kind: 'started', owner };

        const row = await byScope(scope).executeTakeFirst();
        if (!row) continue; // pruned between the insert and the read
        const expired = toNumber(row.expires_at_ms) <= at;
        const sameBody = row.request_hash === input.requestHash;
        const deadOwner = row.state === 'in_flight' && toNumber(row.lease_until_ms) <= at;
        if (!expired && !sameBody) return { kind: 'mismatch' };
        if (!expired && row.state === 'completed') {
          return {
            kind: 'replay',
            response: {
              status: row.status === null ? 200 : toNumber(row.status),
              headers: row.headers ? (JSON.parse(row.headers) as Record<string, string>) : {},
              body: row.body ?? '',
            },
          };
        }
        if (!expired && !deadOwner) return { kind: 'in_flight' };
        // Expired, or in flight with a dead owner: take over, if nobody else does first.
        const taken = await db
          .updateTable('idempotency_records')
          .set(fresh)
          .where('principal', '=', scope.principal)
          .where('operation', '=', scope.operation)
          .where('idem_key', '=', scope.key)
          .where('owner', '=', row.owner)
          .executeTakeFirst();
        if (Number(taken.numUpdatedRows) === 1) return { kind: 'started', owner };
      }
      // Pathological churn (records pruned and re-created under us): tell the caller to retry later.
      return { kind: 'in_flight' };
    },

    /** Stores the final response. Returns false when this request no longer owns the record. */
    async complete(scope: IdempotencyScope, response: StoredResponse, owner?: string): Promise<boolean> {
      checkScope(scope);
      let query = db
        .updateTable('idempotency_records')
        .set({
          state: 'completed',
          status: response.status,
          headers: JSON.stringify(response.headers),
          body: response.body,
        })
        .where('principal', '=', scope.principal)
        .where('operation', '=', scope.operation)
        .where('idem_key', '=', scope.key)
        .where('state', '=', 'in_flight');
      if (owner !== undefined) query = query.where('owner', '=', owner);
      const result = await query.executeTakeFirst();
      return Number(result.numUpdatedRows) === 1;
    },

    /** Forgets an in-flight record (the work failed before anything chargeable), so a retry runs. */
    async abandon(scope: IdempotencyScope, owner?: string): Promise<boolean> {
      checkScope(scope);
      let query = db
        .deleteFrom('idempotency_records')
        .where('principal', '=', scope.principal)
        .where('operation', '=', scope.operation)
        .where('idem_key', '=', scope.key)
        .where('state', '=', 'in_flight');
      if (owner !== undefined) query = query.where('owner', '=', owner);
      const result = await query.executeTakeFirst();
      return Number(result.numDeletedRows) === 1;
    },

    /** Deletes expired records; the minute sweep calls it. */
    async prune(nowMs: number = now()): Promise<number> {
      const result = await db
        .deleteFrom('idempotency_records')
        .where('expires_at_ms', '<=', nowMs)
        .executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
