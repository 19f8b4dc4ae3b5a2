/**
 * The schema, as migrations written in TypeScript and run by Kysely's Migrator from an in-code provider (no
 * migration files to ship or find at run time). Append new migrations with a larger key; never edit one that
 * has shipped. `migrate` is idempotent and safe to run from several processes at once: on PostgreSQL the
 * Migrator holds an advisory lock, on SQLite the single connection does.
 *
 * Conventions: money is BIGINT nano-USD, times are BIGINT epoch milliseconds (`*_at_ms`), booleans are
 * INTEGER 0/1, enums are TEXT with a CHECK (`oneOf`: comparisons, not an IN list; 0023_check_comparisons).
 * The same statements run on both engines; the dialect switches are the auto-increment column type and, where
 * SQLite cannot change a table in place, making it again (0020_ledger_entries_lean, 0023_check_comparisons).
 */
import { type Kysely, type Migration, type MigrationResultSet, Migrator, sql } from 'kysely';
import { checkComparisons } from './check-comparisons.ts';
import type { Database, Dialect } from './database.ts';
import { MigrationError } from './errors.ts';
import { walletMigration } from './wallet-migration.ts';

/** An enumeration's CHECK as the migrations up to 0022 wrote it (0023_check_comparisons rewrites it on SQLite). */
function inList(column: string, values: readonly string[]) {
  return sql`${sql.ref(column)} in (${sql.join(values.map((value) => sql.lit(value)))})`;
}

/**
 * An enumeration's CHECK for the tables made from now on: comparisons, which SQLite evaluates without the
 * ephemeral table an IN list of more than two values costs it at every row (check-comparisons.ts).
 */
export function oneOf(column: string, values: readonly string[]) {
  return sql`(${sql.join(
    values.map((value) => sql`${sql.ref(column)} = ${sql.lit(value)}`),
    sql` or `,
  )})`;
}

/**
 * `ledger_entries` under `name`: as `0001_core` made it (`original`: AUTOINCREMENT on SQLite, and the payment
 * of a top-up unique as a table constraint), or as `0020_ledger_entries_lean` makes it again (neither).
 */
function ledgerEntriesTable(db: Kysely<unknown>, name: string, dialect: Dialect, original: boolean) {
  const serial = dialect === 'postgres' ? 'bigserial' : 'integer';
  let table = db.schema
    .createTable(name)
    .addColumn('seq', serial, (c) =>
      dialect === 'postgres' || !original ? c.primaryKey() : c.primaryKey().autoIncrement(),
    )
    .addColumn('id', 'text', (c) => c.notNull().unique())
    .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
    .addColumn('api_key_id', 'text', (c) => c.references('api_keys.id'))
    .addColumn('reservation_id', 'text', (c) => c.references('reservations.id'))
    .addColumn('type', 'text', (c) => c.notNull().check(inList('type', ['TOP_UP', 'CHARGE', 'REFUND'])))
    .addColumn('currency', 'text', (c) => c.notNull().check(inList('currency', ['USD', 'DIEM'])))
    .addColumn('amount_nano', 'bigint', (c) => c.notNull())
    .addColumn('balance_after_nano', 'bigint', (c) => c.notNull())
    .addColumn('request_id', 'text')
    .addColumn('model_id', 'text')
    .addColumn('sku', 'text')
    .addColumn('units', 'text')
    .addColumn('unit_price_nano', 'text')
    .addColumn('details', 'text')
    .addColumn('network', 'text')
    .addColumn('tx_hash', 'text')
    .addColumn('created_at_ms', 'bigint', (c) => c.notNull());
  // A payment is credited once: NULLs are distinct on both engines, so entries without one are free.
  if (original) table = table.addUniqueConstraint('ledger_entries_payment_unique', ['network', 'tx_hash']);
  return table.addCheckConstraint(
    'ledger_entries_sign',
    sql`(type = 'CHARGE' and amount_nano <= 0) or (type <> 'CHARGE' and amount_nano >= 0)`,
  );
}

/** The indexes of `ledger_entries` but the payment's (see ledgerEntriesLean). */
async function ledgerEntriesIndexes(db: Kysely<unknown>) {
  await db.schema
    .createIndex('ledger_entries_account_seq_idx')
    .on('ledger_entries')
    .columns(['account_id', 'seq'])
    .execute();
  await db.schema
    .createIndex('ledger_entries_key_time_idx')
    .on('ledger_entries')
    .columns(['api_key_id', 'created_at_ms'])
    .execute();
  await db.schema
    .createIndex('ledger_entries_request_idx')
    .on('ledger_entries')
    .columns(['account_id', 'request_id'])
    .execute();
  // A request is refunded once per currency, whatever the callers race.
  await db.schema
    .createIndex('ledger_entries_refund_once_idx')
    .on('ledger_entries')
    .columns(['account_id', 'request_id', 'currency'])
    .unique()
    .where(sql.ref('type'), '=', 'REFUND')
    .execute();
}

function core(dialect: Dialect): Migration {
  const serial = dialect === 'postgres' ? 'bigserial' : 'integer';
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('accounts')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('kind', 'text', (c) => c.notNull().check(inList('kind', ['api', 'wallet'])))
        .addColumn('wallet_address', 'text', (c) => c.unique())
        .addColumn('name', 'text')
        .addColumn('pro', 'integer', (c) => c.notNull().defaultTo(0).check(sql`pro in (0, 1)`))
        .addColumn('usd_balance_nano', 'bigint', (c) => c.notNull().defaultTo(0))
        .addColumn('usd_reserved_nano', 'bigint', (c) => c.notNull().defaultTo(0))
        .addColumn('diem_stake_nano', 'bigint', (c) => c.notNull().defaultTo(0))
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        // Defence in depth: the ledger never lets these go wrong, and if a bug tried, the write fails.
        .addCheckConstraint('accounts_usd_reserved_nonneg', sql`usd_reserved_nano >= 0`)
        .addCheckConstraint('accounts_usd_reserved_covered', sql`usd_reserved_nano <= usd_balance_nano`)
        .addCheckConstraint('accounts_diem_stake_nonneg', sql`diem_stake_nano >= 0`)
        .addCheckConstraint(
          'accounts_wallet_kind',
          sql`(kind = 'wallet' and wallet_address is not null) or (kind = 'api' and wallet_address is null)`,
        )
        .execute();

      await db.schema
        .createTable('diem_usage')
        .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
        .addColumn('epoch_day', 'integer', (c) => c.notNull())
        .addColumn('used_nano', 'bigint', (c) => c.notNull().defaultTo(0))
        .addColumn('reserved_nano', 'bigint', (c) => c.notNull().defaultTo(0))
        .addPrimaryKeyConstraint('diem_usage_pk', ['account_id', 'epoch_day'])
        .addCheckConstraint('diem_usage_nonneg', sql`used_nano >= 0 and reserved_nano >= 0`)
        .execute();

      await db.schema
        .createTable('api_keys')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
        .addColumn('key_type', 'text', (c) => c.notNull().check(inList('key_type', ['INFERENCE', 'ADMIN'])))
        .addColumn('description', 'text', (c) => c.notNull().defaultTo(''))
        .addColumn('secret_hash', 'text', (c) => c.notNull().unique())
        .addColumn('last6', 'text', (c) => c.notNull())
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('expires_at_ms', 'bigint')
        .addColumn('last_used_at_ms', 'bigint')
        .addColumn('revoked_at_ms', 'bigint')
        .addColumn('limit_usd_nano', 'bigint', (c) => c.check(sql`limit_usd_nano >= 0`))
        .addColumn('limit_diem_nano', 'bigint', (c) => c.check(sql`limit_diem_nano >= 0`))
        .addColumn('limit_period', 'text', (c) =>
          c
            .notNull()
            .defaultTo('EPOCH')
            .check(inList('limit_period', ['EPOCH', 'MONTH', 'LIFETIME'])),
        )
        .addColumn('model_privacy', 'text', (c) =>
          c
            .notNull()
            .defaultTo('ALL')
            .check(inList('model_privacy', ['ALL', 'PRIVATE_TEXT', 'PRIVATE_ONLY'])),
        )
        .execute();
      await db.schema.createIndex('api_keys_account_idx').on('api_keys').columns(['account_id']).execute();

      await db.schema
        .createTable('reservations')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
        .addColumn('api_key_id', 'text', (c) => c.references('api_keys.id'))
        .addColumn('request_id', 'text', (c) => c.notNull())
        .addColumn('model_id', 'text')
        .addColumn('usd_nano', 'bigint', (c) => c.notNull().check(sql`usd_nano >= 0`))
        .addColumn('diem_nano', 'bigint', (c) => c.notNull().check(sql`diem_nano >= 0`))
        .addColumn('epoch_day', 'integer', (c) => c.notNull())
        .addColumn('status', 'text', (c) =>
          c.notNull().check(inList('status', ['held', 'captured', 'released', 'expired'])),
        )
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('expires_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('settled_at_ms', 'bigint')
        .execute();
      // The expiry sweep reads held reservations by expiry; the key-limit check reads a key's held ones.
      await db.schema
        .createIndex('reservations_sweep_idx')
        .on('reservations')
        .columns(['status', 'expires_at_ms'])
        .execute();
      await db.schema
        .createIndex('reservations_key_idx')
        .on('reservations')
        .columns(['api_key_id', 'status', 'created_at_ms'])
        .execute();
      await db.schema
        .createIndex('reservations_request_idx')
        .on('reservations')
        .columns(['account_id', 'request_id'])
        .execute();

      await ledgerEntriesTable(db, 'ledger_entries', dialect, true).execute();
      await ledgerEntriesIndexes(db);

      await db.schema
        .createTable('rate_limit_counters')
        .addColumn('bucket', 'text', (c) => c.notNull())
        .addColumn('window_start_ms', 'bigint', (c) => c.notNull())
        .addColumn('used', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('rate_limit_counters_pk', ['bucket', 'window_start_ms'])
        .execute();
      await db.schema
        .createIndex('rate_limit_counters_window_idx')
        .on('rate_limit_counters')
        .columns(['window_start_ms'])
        .execute();

      await db.schema
        .createTable('rate_limit_events')
        .addColumn('seq', serial, (c) =>
          dialect === 'postgres' ? c.primaryKey() : c.primaryKey().autoIncrement(),
        )
        .addColumn('id', 'text', (c) => c.notNull().unique())
        .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
        .addColumn('api_key_id', 'text', (c) => c.references('api_keys.id'))
        .addColumn('model_id', 'text')
        .addColumn('tier', 'text')
        .addColumn('limit_type', 'text', (c) =>
          c
            .notNull()
            .check(
              inList('limit_type', ['RPM', 'RPD', 'TPM', 'FAILED_REQUESTS', 'UNSUPPORTED_FEATURE_REQUESTS']),
            ),
        )
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex('rate_limit_events_account_idx')
        .on('rate_limit_events')
        .columns(['account_id', 'created_at_ms'])
        .execute();
    },
  };
}

/** Idempotency records: one row per (caller, operation, Idempotency-Key); the primary key decides who runs. */
function idempotency(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('idempotency_records')
        .addColumn('principal', 'text', (c) => c.notNull())
        .addColumn('operation', 'text', (c) => c.notNull())
        .addColumn('idem_key', 'text', (c) => c.notNull())
        .addColumn('request_hash', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull().check(inList('state', ['in_flight', 'completed'])))
        .addColumn('owner', 'text', (c) => c.notNull())
        .addColumn('lease_until_ms', 'bigint', (c) => c.notNull())
        .addColumn('expires_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('status', 'integer')
        .addColumn('headers', 'text')
        .addColumn('body', 'text')
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('idempotency_records_pk', ['principal', 'operation', 'idem_key'])
        .execute();
      await db.schema
        .createIndex('idempotency_records_expiry_idx')
        .on('idempotency_records')
        .columns(['expires_at_ms'])
        .execute();
    },
  };
}

/** The JSON-RPC proxy's rolling 24-hour credit counter and its per-caller lock rows. */
function rpc(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('rpc_credit_subjects')
        .addColumn('subject', 'text', (c) => c.primaryKey())
        .execute();
      await db.schema
        .createTable('rpc_credit_usage')
        .addColumn('subject', 'text', (c) => c.notNull())
        .addColumn('bucket_ms', 'bigint', (c) => c.notNull())
        .addColumn('credits', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('rpc_credit_usage_pk', ['subject', 'bucket_ms'])
        .addCheckConstraint('rpc_credit_usage_nonneg', sql`credits >= 0`)
        .execute();
      await db.schema
        .createIndex('rpc_credit_usage_bucket_idx')
        .on('rpc_credit_usage')
        .column('bucket_ms')
        .execute();
    },
  };
}

/** Video jobs shared by every instance's worker, and their finished media (migration 0008_video). */
function video(dialect: Dialect): Migration {
  const bytes = dialect === 'postgres' ? 'bytea' : 'blob';
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('video_jobs')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('account_id', 'text', (c) => c.notNull().references('accounts.id'))
        .addColumn('api_key_id', 'text')
        .addColumn('request_id', 'text', (c) => c.notNull())
        .addColumn('model_id', 'text', (c) => c.notNull())
        .addColumn('backend', 'text', (c) => c.notNull())
        .addColumn('params', 'text', (c) => c.notNull())
        .addColumn('price_nano', 'bigint', (c) => c.notNull())
        .addColumn('status', 'text', (c) =>
          c.notNull().check(inList('status', ['unpaid', 'queued', 'running', 'completed', 'failed'])),
        )
        .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('lease_owner', 'text')
        .addColumn('lease_until_ms', 'bigint')
        .addColumn('upstream_handle', 'text')
        .addColumn('error_code', 'text')
        .addColumn('error_message', 'text')
        .addColumn('recommended_model', 'text')
        .addColumn('refunded', 'integer', (c) => c.notNull().defaultTo(0).check(sql`refunded in (0, 1)`))
        .addColumn('created_at_ms', 'bigint', (c) => c.notNull())
        .addColumn('started_at_ms', 'bigint')
        .addColumn('finished_at_ms', 'bigint')
        .addColumn('expires_at_ms', 'bigint', (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex('video_jobs_claim_idx')
        .on('video_jobs')
        .columns(['status', 'lease_until_ms', 'created_at_ms'])
        .execute();
      await db.schema
        .createIndex('video_jobs_model_finished_idx')
        .on('video_jobs')
        .columns(['model_id', 'finished_at_ms'])
        .execute();
      await db.schema.createIndex('video_jobs_expiry_idx').on('video_jobs').column('expires_at_ms').execute();
      await db.schema
        .createTable('video_media')
        .addColumn('job_id', 'text', (c) => c.primaryKey())
        .addColumn('content_type', 'text', (c) => c.notNull())
        .addColumn('size', 'bigint', (c) => c.notNull())
        .addColumn('bytes', bytes, (c) => c.notNull())
        .execute();
    },
  };
}

/**
 * The indexes every reservation and capture maintains, cut to what the queries read (migration
 * 0017_hot_path_indexes). No query reads reservations by request id (refunds find a request's charges in the
 * ledger): `reservations_request_idx` goes. The expiry sweep and the key-limit check read only held
 * reservations, so their indexes hold only those: partial indexes `WHERE status = 'held'` (the queries say
 * `status = 'held'` as a literal, which both engines need to use a partial index). A capture then deletes the
 * reservation's entries from them instead of moving them, and they stay as small as the open reservations.
 */
function hotPathIndexes(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema.dropIndex('reservations_request_idx').execute();
      await db.schema.dropIndex('reservations_sweep_idx').execute();
      await db.schema.dropIndex('reservations_key_idx').execute();
      await db.schema
        .createIndex('reservations_held_expiry_idx')
        .on('reservations')
        .column('expires_at_ms')
        .where(sql.ref('status'), '=', 'held')
        .execute();
      await db.schema
        .createIndex('reservations_held_key_idx')
        .on('reservations')
        .column('api_key_id')
        .where(sql.ref('status'), '=', 'held')
        .execute();
    },
  };
}

/**
 * A key's net spend per UTC day and currency (`api_key_spend_days`), filled from the ledger as it stands: a
 * spend limit was checked by summing the key's CHARGE and REFUND entries of the whole period, inside the
 * reservation's write transaction, so a key with a limit got slower with every request it made (19 ms per
 * reservation after 40,000 entries in a day, on SQLite, with every other writer waiting). The ledger writes
 * keep it from now on, in the transaction of the entries (ledger.ts).
 */
function keySpendDays(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('api_key_spend_days')
        .addColumn('api_key_id', 'text', (c) => c.notNull().references('api_keys.id'))
        .addColumn('epoch_day', 'integer', (c) => c.notNull())
        .addColumn('currency', 'text', (c) => c.notNull().check(inList('currency', ['USD', 'DIEM'])))
        .addColumn('net_nano', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('api_key_spend_days_pk', ['api_key_id', 'epoch_day', 'currency'])
        .execute();
      // Integer division on both engines (BIGINT by BIGINT): the UTC day of each entry.
      await sql`insert into api_key_spend_days (api_key_id, epoch_day, currency, net_nano)
        select api_key_id, cast(created_at_ms / 86400000 as integer), currency, sum(amount_nano)
        from ledger_entries
        where api_key_id is not null and type in ('CHARGE', 'REFUND')
        group by api_key_id, cast(created_at_ms / 86400000 as integer), currency`.execute(db);
    },
  };
}

/**
 * The JSON-RPC credits per hour (`rpc_credit_hours`), filled from the one-minute buckets as they stand: the
 * rolling 24-hour cap summed up to 1,440 buckets on every call of a caller busy all day (about 0.3 ms on
 * SQLite); with the hours it sums at most 60 buckets and 24 hours. rpc-credits.ts keeps both from now on.
 */
function rpcCreditHours(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable('rpc_credit_hours')
        .addColumn('subject', 'text', (c) => c.notNull())
        .addColumn('hour_ms', 'bigint', (c) => c.notNull())
        .addColumn('credits', 'bigint', (c) => c.notNull())
        .addPrimaryKeyConstraint('rpc_credit_hours_pk', ['subject', 'hour_ms'])
        .addCheckConstraint('rpc_credit_hours_nonneg', sql`credits >= 0`)
        .execute();
      await db.schema
        .createIndex('rpc_credit_hours_hour_idx')
        .on('rpc_credit_hours')
        .column('hour_ms')
        .execute();
      // Integer division on both engines (BIGINT by an integer): the hour each bucket starts in.
      await sql`insert into rpc_credit_hours (subject, hour_ms, credits)
        select subject, (bucket_ms / 3600000) * 3600000, sum(credits)
        from rpc_credit_usage
        group by subject, (bucket_ms / 3600000) * 3600000`.execute(db);
    },
  };
}

/** A top-up's payment is credited once: unique among the entries that have one (all others have NULLs). */
const paymentIndex = (db: Kysely<unknown>) =>
  db.schema
    .createIndex('ledger_entries_payment_unique')
    .on('ledger_entries')
    .columns(['network', 'tx_hash'])
    .unique()
    .where(sql.ref('tx_hash'), 'is not', null);

/** The columns of `ledger_entries`, in the table's order. */
const LEDGER_ENTRY_COLUMNS = sql.join(
  [
    'seq',
    'id',
    'account_id',
    'api_key_id',
    'reservation_id',
    'type',
    'currency',
    'amount_nano',
    'balance_after_nano',
    'request_id',
    'model_id',
    'sku',
    'units',
    'unit_price_nano',
    'details',
    'network',
    'tx_hash',
    'created_at_ms',
  ].map((column) => sql.ref(column)),
);

/**
 * What every ledger entry wrote for nothing (migration 0020_ledger_entries_lean). Charges, refunds and card
 * top-ups have no payment, yet each had a row in the payment's unique index (NULLs are distinct, so the row
 * was all they cost), and on SQLite AUTOINCREMENT updated `sqlite_sequence` for each: two B-tree pages a
 * capture wrote, about 11 µs of its 100 on SQLite (bench/HISTORY.md, eighteenth round). The payment's index
 * is now partial (`where tx_hash is not null`, which the lookup by network and hash implies, so both engines
 * still use it). Without AUTOINCREMENT SQLite numbers a row one above the largest `seq`, which stays
 * ascending because no entry is ever deleted.
 *
 * PostgreSQL drops the constraint and makes the index. SQLite changes neither a table constraint nor
 * AUTOINCREMENT in place: the table is made again under a new name, filled with every entry as it is (`seq`
 * included), the old one dropped and the new one renamed (https://sqlite.org/lang_altertable.html#otheralter;
 * no table refers to this one), in one transaction.
 */
function ledgerEntriesLean(dialect: Dialect): Migration {
  return {
    async up(db: Kysely<unknown>) {
      if (dialect === 'postgres') {
        await sql`alter table ledger_entries drop constraint ledger_entries_payment_unique`.execute(db);
        await paymentIndex(db).execute();
        return;
      }
      await db.transaction().execute(async (trx) => {
        await ledgerEntriesTable(trx, 'ledger_entries_lean', dialect, false).execute();
        await sql`insert into ledger_entries_lean (${LEDGER_ENTRY_COLUMNS})
          select ${LEDGER_ENTRY_COLUMNS} from ledger_entries`.execute(trx);
        await trx.schema.dropTable('ledger_entries').execute();
        await sql`alter table ledger_entries_lean rename to ledger_entries`.execute(trx);
        await ledgerEntriesIndexes(trx);
        await paymentIndex(trx).execute();
      });
    },
  };
}

/**
 * One index of held reservations instead of two (migration 0021_one_held_index): every reservation and every
 * capture wrote a page of `reservations_held_expiry_idx` as well as one of `reservations_held_key_idx`, yet
 * the expiry index served only the sweep, which runs once a minute. Both indexes hold the open reservations
 * only (0017_hot_path_indexes), so the sweep reads the key index whole (it holds every held reservation:
 * NULL keys, the wallets', are indexed too) and sorts what is due: as many rows as requests in flight. A
 * reservation and a capture each write one page fewer (bench/HISTORY.md, twenty-second round).
 */
function oneHeldIndex(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema.dropIndex('reservations_held_expiry_idx').execute();
    },
  };
}

/**
 * Refunds find a video job's charges by their `seq`s (migration 0022_refund_by_seq): the job keeps the range of
 * the entries its capture wrote (`charge_seq_first`, `charge_seq_last`, set in the capture's transaction), and
 * the refund reads them through `ledger_entries_account_seq_idx`. `ledger_entries_request_idx` (account, request
 * id), which only the refunds read, goes: every entry wrote a row of it at a random place (request ids are
 * random), and a split in the middle of its pages made SQLite scan its whole page cache after the commit
 * (bench/HISTORY.md, thirty-second and thirty-third rounds). The jobs made before it get the range of the
 * charges that have their request id, as the refund read them until now (through that index, before it goes).
 */
function refundBySeq(): Migration {
  return {
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable('video_jobs').addColumn('charge_seq_first', 'bigint').execute();
      await db.schema.alterTable('video_jobs').addColumn('charge_seq_last', 'bigint').execute();
      const charges = (bound: 'min' | 'max') =>
        sql`(select ${sql.raw(bound)}(e.seq) from ledger_entries e
          where e.account_id = video_jobs.account_id and e.request_id = video_jobs.request_id
            and e.type = 'CHARGE')`;
      await sql`update video_jobs set charge_seq_first = ${charges('min')}, charge_seq_last = ${charges('max')}`.execute(
        db,
      );
      await db.schema.dropIndex('ledger_entries_request_idx').execute();
    },
  };
}

/** Every migration, by name; names sort in the order they run. */
export function storageMigrations(dialect: Dialect): Record<string, Migration> {
  return {
    '0001_core': core(dialect),
    '0002_idempotency': idempotency(),
    '0003_wallet': walletMigration(),
    '0004_rpc': rpc(),
    '0008_video': video(dialect),
    '0017_hot_path_indexes': hotPathIndexes(),
    '0018_key_spend_days': keySpendDays(),
    '0019_rpc_credit_hours': rpcCreditHours(),
    '0020_ledger_entries_lean': ledgerEntriesLean(dialect),
    '0021_one_held_index': oneHeldIndex(),
    '0022_refund_by_seq': refundBySeq(),
    '0023_check_comparisons': checkComparisons(dialect),
  };
}

export type MigrateResult = { applied: string[] };

/** Brings the schema up to date; a no-op when it already is. Throws MigrationError with the driver's cause. */
export async function migrate(database: Database): Promise<MigrateResult> {
  const migrator = new Migrator({
    db: database.db,
    provider: { getMigrations: async () => storageMigrations(database.dialect) },
  });
  const { error, results } = await migrator.migrateToLatest();
  if (error !== undefined) {
    throw new MigrationError(failedName(results), { cause: error });
  }
  return { applied: (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName) };
}

function failedName(results: MigrationResultSet['results']): string | undefined {
  return results?.find((r) => r.status === 'Error')?.migrationName;
}
