/**
 * x402 top-up payments and their settlement state, shared by every server process.
 *
 * A signed payment has a deterministic key; `claim` inserts its row (`settling`, with a lease) with
 * `ON CONFLICT DO NOTHING`, so of concurrent submissions of one payment exactly one goes on to settle. The
 * row then becomes `settled` (credited: the ledger's TOP_UP is unique per (network, transaction)), `pending`
 * (broadcast, not confirmed: the reconciler resolves it later, from the chain where it can) or `failed`
 * (nothing moved; the same payment may be submitted again). A `settling` row whose lease passed belongs to a dead process and is
 * reconciled like a pending one. Also the database-backed x402 `PendingSettlementStore`.
 */
import type { PendingSettlementStore } from '@x402/core/facilitator';
import type { Kysely, Selectable } from 'kysely';
import { extend } from '../objects.ts';
import type { Database } from './database.ts';
import { type RepositoryOptions, resolveOptions, toNumber } from './internal.ts';
import type { Tables, X402PaymentsTable } from './schema.ts';

export type PaymentStatus = X402PaymentsTable['status'];

export type X402Payment = {
  paymentKey: string;
  network: string;
  payer: string;
  amountAtomic: string;
  amountNano: bigint;
  status: PaymentStatus;
  txHash: string | null;
  payload: unknown;
  requirements: unknown;
  entryId: string | null;
  error: string | null;
  leaseUntilMs: number;
  createdAtMs: number;
  updatedAtMs: number;
};

export type ClaimInput = {
  paymentKey: string;
  network: string;
  payer: string;
  amountAtomic: string;
  amountNano: bigint;
  payload: unknown;
  requirements: unknown;
  leaseMs: number;
};

function toPayment(row: Selectable<X402PaymentsTable>): X402Payment {
  return {
    paymentKey: row.payment_key,
    network: row.network,
    payer: row.payer,
    amountAtomic: row.amount_atomic,
    amountNano: row.amount_nano,
    status: row.status,
    txHash: row.tx_hash,
    payload: JSON.parse(row.payload),
    requirements: JSON.parse(row.requirements),
    entryId: row.entry_id,
    error: row.error,
    leaseUntilMs: toNumber(row.lease_until_ms),
    createdAtMs: toNumber(row.created_at_ms),
    updatedAtMs: toNumber(row.updated_at_ms),
  };
}

export type X402PaymentsRepository = ReturnType<typeof createX402Payments>;

export function createX402Payments(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now } = resolveOptions(options);

  async function get(paymentKey: string): Promise<X402Payment | undefined> {
    const row = await db
      .selectFrom('x402_payments')
      .selectAll()
      .where('payment_key', '=', paymentKey)
      .executeTakeFirst();
    return row ? toPayment(row) : undefined;
  }

  async function update(
    paymentKey: string,
    fields: {
      status?: PaymentStatus;
      tx_hash?: string | null;
      entry_id?: string | null;
      error?: string | null;
      lease_until_ms?: number;
    },
    executor: Kysely<Tables> = db,
  ): Promise<void> {
    await executor
      .updateTable('x402_payments')
      .set(extend(fields, { updated_at_ms: now() }))
      .where('payment_key', '=', paymentKey)
      .execute();
  }

  return {
    get,

    /**
     * Takes the payment for settlement: true when this caller inserted it, or took over a `failed` one (a
     * payment that moved nothing may be tried again). False when it is settling, pending or settled.
     */
    async claim(input: ClaimInput): Promise<boolean> {
      const at = now();
      const inserted = await db
        .insertInto('x402_payments')
        .values({
          payment_key: input.paymentKey,
          network: input.network,
          payer: input.payer,
          amount_atomic: input.amountAtomic,
          amount_nano: input.amountNano,
          status: 'settling',
          tx_hash: null,
          payload: JSON.stringify(input.payload),
          requirements: JSON.stringify(input.requirements),
          entry_id: null,
          error: null,
          lease_until_ms: at + input.leaseMs,
          created_at_ms: at,
          updated_at_ms: at,
        })
        .onConflict((oc) => oc.column('payment_key').doNothing())
        .returning('payment_key')
        .executeTakeFirst();
      if (inserted) return true;
      const retried = await db
        .updateTable('x402_payments')
        .set({
          status: 'settling',
          error: null,
          payload: JSON.stringify(input.payload),
          lease_until_ms: at + input.leaseMs,
          updated_at_ms: at,
        })
        .where('payment_key', '=', input.paymentKey)
        .where('status', '=', 'failed')
        .executeTakeFirst();
      return retried.numUpdatedRows > 0n;
    },

    /** Broadcast but not confirmed (or outcome unknown, without a transaction); the reconciler retries. */
    markPending: (paymentKey: string, txHash: string | null, error: string | null) =>
      update(paymentKey, { status: 'pending', tx_hash: txHash, error, lease_until_ms: now() }),

    /** Credited: pass the ledger's transaction (`onRecorded`) so the row changes with its TOP_UP. */
    markSettled: (paymentKey: string, txHash: string, entryId: string, executor?: Kysely<Tables>) =>
      update(paymentKey, { status: 'settled', tx_hash: txHash, entry_id: entryId, error: null }, executor),

    markFailed: (paymentKey: string, error: string) => update(paymentKey, { status: 'failed', error }),

    /** Payments the reconciler should settle again: pending ones, and settling ones whose process died. */
    async due(limit = 50, at: number = now()): Promise<X402Payment[]> {
      const rows = await db
        .selectFrom('x402_payments')
        .selectAll()
        .where('status', 'in', ['pending', 'settling'])
        .where('lease_until_ms', '<=', at)
        .orderBy('updated_at_ms')
        .limit(limit)
        .execute();
      return rows.map(toPayment);
    },

    /** Takes a due payment for one reconciliation attempt (one process at a time); false if another has it. */
    async lease(paymentKey: string, leaseMs: number, at: number = now()): Promise<boolean> {
      const result = await db
        .updateTable('x402_payments')
        .set({ lease_until_ms: at + leaseMs, updated_at_ms: at })
        .where('payment_key', '=', paymentKey)
        .where('status', 'in', ['pending', 'settling'])
        .where('lease_until_ms', '<=', at)
        .executeTakeFirst();
      return result.numUpdatedRows > 0n;
    },
  };
}

/** The x402 `PendingSettlementStore` in the shared database. */
export function createPendingSettlementStore(database: Database): PendingSettlementStore {
  const { db } = database;
  return {
    async get(key) {
      const row = await db
        .selectFrom('x402_pending_settlements')
        .select('tx_hash')
        .where('key', '=', key)
        .executeTakeFirst();
      return row?.tx_hash;
    },
    async set(key, txHash) {
      await db
        .insertInto('x402_pending_settlements')
        .values({ key, tx_hash: txHash, created_at_ms: Date.now() })
        .onConflict((oc) => oc.column('key').doUpdateSet({ tx_hash: txHash }))
        .execute();
    },
    async delete(key) {
      await db.deleteFrom('x402_pending_settlements').where('key', '=', key).execute();
    },
  };
}
