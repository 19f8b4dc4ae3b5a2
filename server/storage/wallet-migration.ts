/**
 * Migration `0003_wallet`: the tables of the wallet-credit domain. Kept in its own module so that
 * `migrations.ts` only lists it.
 *
 * - `siwx_nonces`: every accepted Sign-In-With-X nonce, per wallet; the primary key makes "accepted once"
 *   atomic on every engine and across processes.
 * - `x402_payments`: one row per signed top-up payment (keyed by a deterministic payment key) with its
 *   settlement state, so that concurrent submissions settle once and pending settlements are reconciled.
 * - `x402_pending_settlements`: the facilitator's broadcast-but-unconfirmed transactions (the x402
 *   `PendingSettlementStore`), shared by all processes.
 * - `wallet_request_slots`: in-flight paid requests per wallet account, for the concurrency cap.
 */
import { type Kysely, type Migration, sql } from 'kysely';

export function walletMigration(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('siwx_nonces')
        .addColumn('address', 'text', (c) => c.notNull())
        .addColumn('nonce', 'text', (c) => c.notNull())
        .addColumn('expires_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('siwx_nonces_pk', ['address', 'nonce'])
        .execute();
      await db.schema
        .createIndex('siwx_nonces_expiry_idx')
        .on('siwx_nonces')
        .columns(['expires_at_ms'])
        .execute();

      await db.schema
        .createTable('x402_payments')
        .addColumn('payment_key', 'text', (c) => c.primaryKey())
        .addColumn('network', 'text', (c) => c.notNull())
        .addColumn('payer', 'text', (c) => c.notNull())
        .addColumn('amount_atomic', 'text', (c) => c.notNull())
        .addColumn('amount_nano', 'bigint', (c) => c.notNull().check(sql`amount_nano > 0`))
        .addColumn('status', 'text', (c) =>
          c.notNull().check(sql`status in ('settling', 'pending', 'settled', 'failed')`),
        )
        .addColumn('tx_hash', 'text')
        .addColumn('payload', 'text', (c) => c.notNull())
        .addColumn('requirements', 'text', (c) => c.notNull())
        .addColumn('entry_id', 'text')
        .addColumn('error', 'text')
        .addColumn('lease_until_ms', 'bigint', (c) => c.notNull())
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('updated_at_ms', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex('x402_payments_status_idx')
        .on('x402_payments')
        .columns(['status', 'lease_until_ms'])
        .execute();

      await db.schema
        .createTable('x402_pending_settlements')
        .addColumn('key', 'text', (c) => c.primaryKey())
        .addColumn('tx_hash', 'text', (c) => c.notNull())
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .execute();

      await db.schema
        .createTable('wallet_request_slots')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
        .addColumn('expires_at_ms', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex('wallet_request_slots_account_idx')
        .on('wallet_request_slots')
        .columns(['account_id', 'expires_at_ms'])
        .execute();
    },
  };
}
