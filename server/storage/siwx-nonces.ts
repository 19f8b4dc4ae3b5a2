/**
 * Sign-In-With-X nonces: a nonce is accepted once per wallet, atomically, in the shared database. The insert
 * is `ON CONFLICT DO NOTHING` on the (address, nonce) primary key, so of any number of concurrent requests on
 * any number of processes carrying the same signed message, exactly one gets `true`.
 */
import type { Database } from './database.ts';
import { type RepositoryOptions, resolveOptions } from './internal.ts';

export type SiwxNoncesRepository = ReturnType<typeof createSiwxNonces>;

export function createSiwxNonces(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);
  return {
    /**
     * Records the nonce as used by the wallet; `false` when it was used before. `expiresAtMs` is when a
     * message carrying it would be refused anyway (too old), after which the row may be pruned.
     */
    async consume(input: { address: string; nonce: string; expiresAtMs: number }): Promise<boolean> {
      const inserted = await db
        .insertInto('siwx_nonces')
        .values({
          address: input.address,
          nonce: input.nonce,
          expires_at_ms: input.expiresAtMs,
          created_at_ms: now(),
        })
        .onConflict((oc) => oc.columns(['address', 'nonce']).doNothing())
        .returning('nonce')
        .executeTakeFirst();
      return inserted !== undefined;
    },

    /** Drops nonces whose messages can no longer be accepted; returns how many. */
    async prune(at: number = now()): Promise<number> {
      const result = await db.deleteFrom('siwx_nonces').where('expires_at_ms', '<', at).executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
