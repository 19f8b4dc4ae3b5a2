/**
 * Row types of every table, as Kysely sees them. Column names are the SQL names (snake_case); the repositories
 * map rows to camelCase domain types.
 *
 * Read types: money columns (`*_nano`) are BIGINT and arrive as `bigint` on both engines. Other integers arrive
 * as `bigint` on SQLite (safe integers are on for the whole connection) and as `number` (INTEGER) or `bigint`
 * (BIGINT) on PostgreSQL, so they are typed `Int` and converted with `toNumber` in the repositories.
 */
import type { ColumnType } from 'kysely';

/** A BIGINT money column, in nano-USD. */
export type Nano = ColumnType<bigint, bigint, bigint>;
/** A non-money integer (epoch milliseconds, counters, 0/1 flags); convert with `toNumber` on read. */
export type Int = ColumnType<number | bigint, number | bigint, number | bigint>;

export interface AccountsTable {
  id: string;
  kind: 'api' | 'wallet';
  wallet_address: string | null;
  name: string | null;
  pro: Int;
  usd_balance_nano: Nano;
  usd_reserved_nano: Nano;
  diem_stake_nano: Nano;
  created_at_ms: Int;
}

export interface DiemUsageTable {
  account_id: string;
  epoch_day: Int;
  used_nano: Nano;
  reserved_nano: Nano;
}

/**
 * A key's net spend per UTC day and currency (migration 0018_key_spend_days): the sum of the `amount_nano` of
 * its CHARGE and REFUND entries created that day (charges negative, as in the ledger), kept in the
 * transaction that writes them, so that a spend limit is checked against a few rows instead of a period of
 * entries.
 */
export interface ApiKeySpendDaysTable {
  api_key_id: string;
  epoch_day: Int;
  currency: 'USD' | 'DIEM';
  net_nano: Nano;
}

export interface ApiKeysTable {
  id: string;
  account_id: string;
  key_type: 'INFERENCE' | 'ADMIN';
  description: string;
  secret_hash: string;
  last6: string;
  created_at_ms: Int;
  expires_at_ms: Int | null;
  last_used_at_ms: Int | null;
  revoked_at_ms: Int | null;
  limit_usd_nano: ColumnType<bigint | null, bigint | null, bigint | null>;
  limit_diem_nano: ColumnType<bigint | null, bigint | null, bigint | null>;
  limit_period: 'EPOCH' | 'MONTH' | 'LIFETIME';
  model_privacy: 'ALL' | 'PRIVATE_TEXT' | 'PRIVATE_ONLY';
}

export interface ReservationsTable {
  id: string;
  account_id: string;
  api_key_id: string | null;
  request_id: string;
  model_id: string | null;
  usd_nano: Nano;
  diem_nano: Nano;
  epoch_day: Int;
  status: 'held' | 'captured' | 'released' | 'expired';
  created_at_ms: Int;
  expires_at_ms: Int;
  settled_at_ms: Int | null;
}

export interface LedgerEntriesTable {
  /** Auto-increment; never written. */
  seq: ColumnType<number | bigint, never, never>;
  id: string;
  account_id: string;
  api_key_id: string | null;
  reservation_id: string | null;
  type: 'TOP_UP' | 'CHARGE' | 'REFUND';
  currency: 'USD' | 'DIEM';
  amount_nano: Nano;
  balance_after_nano: Nano;
  request_id: string | null;
  model_id: string | null;
  sku: string | null;
  units: string | null;
  unit_price_nano: string | null;
  details: string | null;
  network: string | null;
  tx_hash: string | null;
  created_at_ms: Int;
}

export interface RateLimitCountersTable {
  bucket: string;
  window_start_ms: Int;
  used: Int;
}

export interface RateLimitEventsTable {
  /** Auto-increment; never written. */
  seq: ColumnType<number | bigint, never, never>;
  id: string;
  account_id: string;
  api_key_id: string | null;
  model_id: string | null;
  tier: string | null;
  limit_type: 'RPM' | 'RPD' | 'TPM' | 'FAILED_REQUESTS' | 'UNSUPPORTED_FEATURE_REQUESTS';
  created_at_ms: Int;
}

export interface IdempotencyRecordsTable {
  principal: string;
  operation: string;
  idem_key: string;
  request_hash: string;
  state: 'in_flight' | 'completed';
  /** A random token of the request that holds the record; complete/abandon only act for their owner. */
  owner: string;
  lease_until_ms: Int;
  expires_at_ms: Int;
  status: Int | null;
  /** JSON object of the stored response headers. */
  headers: string | null;
  body: string | null;
  created_at_ms: Int;
}

/** Rolling 24-hour JSON-RPC credits per caller, in one-minute buckets (migration 0004_rpc). */
export interface RpcCreditUsageTable {
  subject: string;
  bucket_ms: Int;
  credits: Int;
}

/**
 * The same credits per hour (migration 0019_rpc_credit_hours): each row the sum of the subject's one-minute
 * buckets of that hour, kept with them, so that the rolling 24 hours are read as at most 60 minutes and 24 hours.
 */
export interface RpcCreditHoursTable {
  subject: string;
  hour_ms: Int;
  credits: Int;
}

/** One row per JSON-RPC caller: the lock that serialises its credit-cap checks (migration 0004_rpc). */
export interface RpcCreditSubjectsTable {
  subject: string;
}

/** One video job (migration 0008_video); `params` is the JSON of the validated request. */
export interface VideoJobsTable {
  id: string;
  account_id: string;
  api_key_id: string | null;
  request_id: string;
  model_id: string;
  backend: string;
  params: string;
  price_nano: bigint;
  status: 'unpaid' | 'queued' | 'running' | 'completed' | 'failed';
  attempts: Int;
  lease_owner: string | null;
  lease_until_ms: Int | null;
  upstream_handle: string | null;
  error_code: string | null;
  error_message: string | null;
  recommended_model: string | null;
  refunded: Int;
  /** The `seq`s of the first and last entry its capture wrote; NULL until it is paid (migration 0022). */
  charge_seq_first: Int | null;
  charge_seq_last: Int | null;
  created_at_ms: Int;
  started_at_ms: Int | null;
  finished_at_ms: Int | null;
  expires_at_ms: Int;
}

/** The finished video of a job, kept in the database so every instance can serve it (migration 0008_video). */
export interface VideoMediaTable {
  job_id: string;
  content_type: string;
  size: Int;
  bytes: Uint8Array;
}

export interface Tables {
  accounts: AccountsTable;
  diem_usage: DiemUsageTable;
  api_keys: ApiKeysTable;
  api_key_spend_days: ApiKeySpendDaysTable;
  reservations: ReservationsTable;
  ledger_entries: LedgerEntriesTable;
  rate_limit_counters: RateLimitCountersTable;
  rate_limit_events: RateLimitEventsTable;
  idempotency_records: IdempotencyRecordsTable;
  rpc_credit_usage: RpcCreditUsageTable;
  rpc_credit_hours: RpcCreditHoursTable;
  rpc_credit_subjects: RpcCreditSubjectsTable;
  video_jobs: VideoJobsTable;
  video_media: VideoMediaTable;
}

// 0003_wallet: Sign-In-With-X nonces, x402 top-up payments, pending settlements, wallet request slots.
// (A second `interface Tables` merges with the one above, so each migration appends its own tables.)

export interface SiwxNoncesTable {
  /** Normalised wallet address (EVM lowercased). */
  address: string;
  nonce: string;
  /** After this the message is too old to be accepted anyway; the row may then be pruned. */
  expires_at_ms: Int;
  created_at_ms: Int;
}

export interface X402PaymentsTable {
  /** Deterministic id of a signed payment (EVM: payer and EIP-3009 nonce; Solana: the transaction bytes). */
  payment_key: string;
  network: string;
  payer: string;
  amount_atomic: string;
  amount_nano: Nano;
  status: 'settling' | 'pending' | 'settled' | 'failed';
  tx_hash: string | null;
  payload: string;
  requirements: string;
  entry_id: string | null;
  error: string | null;
  /** A `settling` row whose lease has passed belongs to a process that died: the reconciler takes it over. */
  lease_until_ms: Int;
  created_at_ms: Int;
  updated_at_ms: Int;
}

export interface X402PendingSettlementsTable {
  key: string;
  tx_hash: string;
  created_at_ms: Int;
}

export interface WalletRequestSlotsTable {
  id: string;
  account_id: string;
  expires_at_ms: Int;
}

export interface Tables {
  siwx_nonces: SiwxNoncesTable;
  x402_payments: X402PaymentsTable;
  x402_pending_settlements: X402PendingSettlementsTable;
  wallet_request_slots: WalletRequestSlotsTable;
}
