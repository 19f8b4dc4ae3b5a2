/**
 * Sign-In-With-X nonces: a nonce is accepted once per wallet, atomically, in the shared database. The insert
 * is `ON CONFLICT DO NOTHING` on the (address, nonce) primary key, so of any number of concurrent requests on
 * any number of processes carrying the same signed message, exactly one gets `true`.
 *
 * Every wallet-paid request records one, so the insert is a hot statement: compiled once, and a short write
 * (`Database.write`): on SQLite it joins the commit group under way, when there is one, instead of committing
 * on its own (about 100 µs alone here, a third of them its commit).
 */
import type { Database } from './database.ts';
import { changedAny, compiledOnceResult, type RepositoryOptions, resolveOptions } from './internal.ts';

export type SiwxNoncesRepository = ReturnType<typeof createSiwxNonces>;

export function createSiwxNonces(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);
  // Whether it inserted is what it changed: no RETURNING, which SQLite runs through an ephemeral table
  // (bench/HISTORY.md, thirty-first round).
  const insert = compiledOnceResult(
    (address: string, nonce: string, expiresAtMs: number, createdAtMs: number) =>
      db
        .insertInto('siwx_nonces')
        .values({ address, nonce, expires_at_ms: expiresAtMs, created_at_ms: createdAtMs })
        .onConflict((oc) => oc.columns(['address', 'nonce']).doNothing()),
  );
  return {
    /**
     * Records the nonce as used by the wallet; `false` when it was used before. `expiresAtMs` is when a
     * message carrying it would be refused anyway (too old), after which the row may be pruned.
     */
    async consume(input: { address: string; nonce: string; expiresAtMs: number }): Promise<boolean> {
      const at = now();
      const inserted = await database.write((runner) =>
        insert(runner, input.address, input.nonce, input.expiresAtMs, at),
      );
      return changedAny(inserted);
    },

    /** Drops nonces whose messages can no longer be accepted; returns how many. */
    async prune(at: number = now()): Promise<number> {
      const result = await db.deleteFrom('siwx_nonces').where('expires_at_ms', '<', at).executeTakeFirst();
      return Number(result.numDeletedRows);
    },
  };
}
