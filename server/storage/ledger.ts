/**
 * The ledger: balances, reservations and the append-only list of entries (`TOP_UP`, `CHARGE`, `REFUND`).
 *
 * A request reserves its worst-case cost before work starts, then captures its real cost (never more than
 * reserved) and the remainder is released. Spending draws on the day's DIEM allowance first, then on USD.
 *
 * Exactness: every operation that moves money runs in one transaction that first locks the account row
 * (PostgreSQL: `SELECT … FOR UPDATE`; SQLite: the transaction starts with BEGIN IMMEDIATE, which takes the
 * database write lock). All reads that decide an amount happen after that lock, and every writer takes it, so
 * concurrent requests on any number of processes serialise per account. Uniqueness that must hold even
 * without the lock (a payment credited once, a request refunded once) is also a unique index.
 *
 * On PostgreSQL the two operations of every request, a reservation of free USD and the capture of a USD
 * reservation in hand, are one round trip each (reserveAtOnce, captureAtOnce): the lock is taken by the
 * statement's update of the account row and held for that statement, not across round trips between the
 * driver and the server; a reservation with the caller's writes (the JSON-RPC caps), or for a key with a
 * spend limit, is a script of two statements sent as one query, the lock and then one statement. The rest
 * (DIEM, the caller's statements in any other form, what the one statement could not do) runs in the
 * transaction described above.
 *
 * On SQLite with one process writing the file (LedgerOptions.holdsInMemory) a reservation of USD alone is held
 * in memory until it settles, and its row is written once, settled (held-reservations.ts).
 *
 * Invariants: `usd_balance_nano` equals the sum of the account's USD entries; `usd_reserved_nano` equals the
 * sum of its held reservations' USD parts in the rows, and with what is held in memory never exceeds the
 * balance; nothing overspends. Each row of
 * `api_key_spend_days` equals the sum of its key's CHARGE and REFUND entries of that UTC day and currency,
 * written in their transaction (or their statement): a key's spend limit reads those rows, not the entries.
 */
import type { Insertable, Kysely, QueryResult, Selectable, Transaction } from 'kysely';
import { type RawBuilder, sql } from 'kysely';
import { extend } from '../objects.ts';
import type { Database } from './database.ts';
import {
  type Currency,
  InsufficientBalanceError,
  InvalidInputError,
  KeySpendLimitError,
  NotFoundError,
  NothingToRefundError,
  ReservationStateError,
  type ReservationStatus,
  StorageError,
} from './errors.ts';
import { EAGER, GROUP_COMMIT_MAX } from './group-commit.ts';
import { heldReservationsOf, NOT_HELD } from './held-reservations.ts';
import {
  assertAmount,
  compiledOnce,
  compiledOnceResult,
  DAY_MS,
  type EmbeddedWrite,
  epochDayOf,
  isoDay,
  isUniqueViolation,
  maxBig,
  minBig,
  periodStartMs,
  prepared,
  type RepositoryOptions,
  resolveOptions,
  scriptThenPrepared,
  toBigInt,
  toNumber,
  toNumberOrNull,
  withLiterals,
} from './internal.ts';
import type { LedgerEntriesTable, ReservationsTable, Tables } from './schema.ts';

export type { Currency, ReservationStatus } from './errors.ts';
export type EntryType = 'TOP_UP' | 'CHARGE' | 'REFUND';

export type Balance = {
  /** USD credit, reservations included. */
  usdNano: bigint;
  /** USD held by open reservations. */
  usdReservedNano: bigint;
  /** Today's DIEM allowance (the stake). */
  diemAllowanceNano: bigint;
  diemUsedTodayNano: bigint;
  diemReservedTodayNano: bigint;
  /** What a new reservation could still draw from today's allowance. */
  diemAvailableNano: bigint;
  /** What a new reservation could still draw from USD credit. */
  usdAvailableNano: bigint;
};

export type Reservation = {
  id: string;
  accountId: string;
  apiKeyId: string | null;
  requestId: string;
  modelId: string | null;
  usdNano: bigint;
  diemNano: bigint;
  /** The UTC day whose DIEM allowance the DIEM part is drawn from. */
  epochDay: number;
  status: ReservationStatus;
  createdAtMs: number;
  expiresAtMs: number;
  settledAtMs: number | null;
};

export type LedgerEntry = {
  /** Position in the ledger (strictly increasing); the cursor for billing exports. */
  seq: number;
  id: string;
  accountId: string;
  apiKeyId: string | null;
  reservationId: string | null;
  type: EntryType;
  currency: Currency;
  /** Signed: negative for a CHARGE, positive for a TOP_UP or REFUND. */
  amountNano: bigint;
  /** USD entries: the USD balance after this entry. DIEM entries: the allowance left that day after it. */
  balanceAfterNano: bigint;
  requestId: string | null;
  modelId: string | null;
  sku: string | null;
  /** Decimal text (units can be fractional, e.g. millions of tokens). */
  units: string | null;
  /** Decimal text in nano-USD per unit. */
  unitPriceNano: string | null;
  details: unknown;
  network: string | null;
  txHash: string | null;
  createdAtMs: number;
};

export type TopUpInput = {
  accountId: string;
  amountNano: bigint;
  requestId?: string | null;
  /** With `txHash`: the payment's chain. An entry is credited once per (network, txHash). */
  network?: string | null;
  txHash?: string | null;
  note?: string | null;
  /**
   * Runs in the same transaction as the credit, with the payment's entry (the new one, or the one that already
   * credited this (network, txHash)): to record the payment as credited atomically with its TOP_UP.
   */
  onRecorded?: (executor: Kysely<Tables>, entry: LedgerEntry) => Promise<void>;
};
export type TopUpResult = { entry: LedgerEntry; credited: boolean };

export type ReserveInput = {
  accountId: string;
  apiKeyId?: string | null;
  amountNano: bigint;
  requestId: string;
  modelId?: string | null;
  ttlMs: number;
  /**
   * The key is believed to have a spend limit (a hint: the limits are checked whatever it says). On
   * PostgreSQL a reservation of free USD for such a key is one round trip that checks the limit (the script
   * of reserveAtOnce); without the hint it is tried first as the one statement for keys without limits.
   */
  keySpendLimited?: boolean;
};
/**
 * What the account held when a reservation was decided, before its hold: USD credit (reservations included)
 * and what is left of today's DIEM allowance (the allowance less what was used today; 0 without a stake).
 * The `x-service-balance-*` headers report it as the balance before the request.
 */
export type BalanceBefore = { usdNano: bigint; diemNano: bigint };

/**
 * A reservation made: the reservation, the balance before it (BalanceBefore), and what the account could
 * still hold once it was made (`availableNano`: USD credit not held plus what is left of today's DIEM
 * allowance, as the hold's own check read them, less this hold). On SQLite, when nothing but the account's
 * credit and holds decide what it may still hold (no DIEM allowance, whose day turns; no spend limit on the
 * key), `stamp`: the database's change stamp just after the hold (Database.changeStamp, read in its
 * transaction) with the hold's number among this process's holds. While `unchangedSince(accountId, stamp)`, no
 * other connection has committed and this process has made no later hold of the account and changed no key
 * limit or DIEM stake, so `availableNano` is still what the account can hold, or more (captures, releases and
 * top-ups only add to it).
 */
export type ReserveResult = {
  reservation: Reservation;
  before: BalanceBefore;
  availableNano: bigint;
  stamp?: string;
};

export type CaptureItem = {
  sku: string;
  amountNano: bigint;
  units?: string | number | null;
  unitPriceNano?: string | number | bigint | null;
  modelId?: string | null;
  details?: unknown;
};
export type CaptureInput = { items: CaptureItem[] };
/**
 * The caller's statements of a capture (`captureWith`), run in its transaction after the charges are written,
 * with the entries written (in `seq` order: a video job keeps the range of its charges, for its refund);
 * `embedded`, the same writes in the form the capture's one statement can make on PostgreSQL (see
 * EmbeddedWrite), which are not told the entries.
 */
export type CaptureWithin<T> = ((trx: Transaction<Tables>, entries: LedgerEntry[]) => Promise<T>) & {
  embedded?: EmbeddedWrite;
};
/**
 * The caller's statements of a reservation (`reserveWith`), run in its transaction under the account's lock;
 * `embedded`, the same writes in the form the reservation's one round trip can make on PostgreSQL (each guarded
 * by the one before, see EmbeddedWrite) with what the function would then return. When an embedded write
 * refuses, nothing is written and the transaction runs the function, which works out the refusal.
 */
export type ReserveWithin<T> = ((trx: Transaction<Tables>) => Promise<T>) & {
  embedded?: { writes: EmbeddedWrite[]; result: T };
  /**
   * The same decided at once in this process, with no statement (what it counts is held in memory): its
   * result, or undefined when it cannot be (having done nothing; the transaction then runs the function).
   * With it, a reservation the ledger holds in memory is made with no transaction either (`holdNow`): it runs
   * once the account is read, before the checks; what it throws refuses the reservation. What it counted
   * stays counted should the checks then refuse: its caller takes it back.
   */
  now?: () => T | undefined;
};
export type CaptureResult = {
  entries: LedgerEntry[];
  /** What was charged in USD and DIEM (positive). */
  usdNano: bigint;
  diemNano: bigint;
  /** What the items asked for; more than charged when `clamped`. */
  requestedNano: bigint;
  /** True when the items cost more than was reserved and the charge was capped at the reservation. */
  clamped: boolean;
};

export type ReleaseResult = { released: boolean; reservation: Reservation };
/**
 * A request to refund: its account and id, and the `seq`s of its first and last charge, as its capture returned
 * them (CaptureResult.entries). The charges are found by their `seq`s, through the account's index of entries
 * (no index of request ids: every entry would write one, at a random place); only the entries of that range with
 * the request's id, charges, are refunded.
 */
export type RefundInput = { accountId: string; requestId: string; chargeSeqs: ChargeSeqs };
/** The `seq`s of the first and last entry a capture wrote (CaptureResult.entries, in `seq` order). */
export type ChargeSeqs = { first: number; last: number };

/**
 * The ChargeSeqs of a capture's entries (in `seq` order, as captures return them); null when it wrote none
 * (nothing charged: nothing to refund).
 */
export function chargeSeqsOf(entries: readonly LedgerEntry[]): ChargeSeqs | null {
  const first = entries[0];
  const last = entries[entries.length - 1];
  return first && last ? { first: first.seq, last: last.seq } : null;
}
export type RefundResult = { entries: LedgerEntry[]; refunded: boolean };

export type ListEntriesInput = { limit?: number; offset?: number };
export type ListEntriesSinceInput = {
  /** Only entries with a larger seq (exclusive cursor). */
  afterSeq?: number;
  /** Inclusive lower bound on `createdAtMs`. */
  startMs?: number;
  /** Exclusive upper bound on `createdAtMs`. */
  endMs?: number;
  currency?: Currency;
  types?: EntryType[];
  limit?: number;
};

export type UsageAmounts = { usdNano: bigint; diemNano: bigint; requests: number };
export type UsageSummary = {
  totals: UsageAmounts;
  /** Oldest first; only days with charges. */
  byDay: Array<UsageAmounts & { day: string }>;
  /** Highest spend first (USD + DIEM). */
  byModel: Array<UsageAmounts & { modelId: string | null }>;
  bySku: Array<UsageAmounts & { sku: string | null }>;
  byKey: Array<UsageAmounts & { apiKeyId: string | null }>;
};

export type KeySpend = { usdNano: bigint; diemNano: bigint };
export type LedgerTotals = {
  usdBalanceNano: bigint;
  usdReservedNano: bigint;
};

export type LedgerOptions = RepositoryOptions & {
  /**
   * Told of the ledger entries this repository wrote, once they are committed (a top-up that credited, a
   * capture, a refund): what process-local counters of money moved are made of (the `/metrics` counter).
   */
  onEntries?(entries: readonly LedgerEntry[]): void;
  /**
   * SQLite, when this process alone writes the file: a reservation of USD alone is held in memory, not in a
   * row, until it is captured, released or expired (held-reservations.ts). Ignored on PostgreSQL.
   */
  holdsInMemory?: boolean;
};

export type LedgerRepository = ReturnType<typeof createLedger>;

/** `'held'` as a literal of the SQL text: the partial indexes of held reservations need it (migration 0017). */
const HELD = sql.lit('held' as const);

/**
 * SQLite: by database (every ledger on it), the number of the latest hold made in this process of each account,
 * from one sequence: a reservation's stamp (ReserveResult.stamp) is the database's change stamp with its own
 * number, so that only a later hold of the same account, besides the changes the database's stamp tells,
 * makes it stale. Emptied when HOLD_ACCOUNTS are kept, with a change noted, so that no stamp outlives it.
 */
const holdNumbers = new WeakMap<Database, { next: number; latest: Map<string, number> }>();
const HOLD_ACCOUNTS = 100_000;

function holdsOf(database: Database) {
  let holds = holdNumbers.get(database);
  if (!holds) {
    holds = { next: 1, latest: new Map() };
    holdNumbers.set(database, holds);
  }
  return holds;
}

/** A hold of `accountId` made now (SQLite): numbered, so that the stamps of the account's earlier holds no longer hold. */
function numberHold(database: Database, accountId: string): void {
  const holds = holdsOf(database);
  if (holds.latest.size >= HOLD_ACCOUNTS && !holds.latest.has(accountId)) {
    holds.latest.clear();
    database.noteChange?.();
  }
  holds.latest.set(accountId, holds.next++);
}

/** The account's stamp now (SQLite): the database's change stamp with the number of the account's latest hold. */
function accountStamp(database: Database, changeStamp: () => string, accountId: string): string {
  return `${changeStamp()}:${holdsOf(database).latest.get(accountId) ?? 0}`;
}

type Executor = Kysely<Tables> | Transaction<Tables>;

/** What a capture reads of the reservation it claims (its charges' columns and the figures it checks). */
const CLAIMED_COLUMNS = [
  'id',
  'account_id',
  'api_key_id',
  'request_id',
  'model_id',
  'usd_nano',
  'diem_nano',
  'epoch_day',
] as const;
type ClaimedReservation = Pick<Selectable<ReservationsTable>, (typeof CLAIMED_COLUMNS)[number]>;

/** captureWith was given a reservation whose figures are not the stored ones. */
const notAsStored = () =>
  new StorageError('STORAGE_FAILURE', 'The reservation does not match its stored figures');

/** Whether a caller's reservation has the figures of the one held (what a claim of its row checks). */
function sameFigures(held: Reservation, reservation: Reservation): boolean {
  return (
    held.accountId === reservation.accountId &&
    held.usdNano === reservation.usdNano &&
    held.diemNano === reservation.diemNano &&
    held.epochDay === reservation.epochDay
  );
}

/** A reservation's claimed columns as the caller's reservation has them (a claim that proved them equal). */
function claimedAs(reservation: Reservation): ClaimedReservation {
  return {
    id: reservation.id,
    account_id: reservation.accountId,
    api_key_id: reservation.apiKeyId,
    request_id: reservation.requestId,
    model_id: reservation.modelId,
    usd_nano: reservation.usdNano,
    diem_nano: reservation.diemNano,
    epoch_day: reservation.epochDay,
  };
}
type NewEntry = Required<Insertable<LedgerEntriesTable>>;

/** A one-statement capture that did not capture, and wrote nothing (see captureAtOnce). */
class NotAtOnce extends Error {}

/**
 * The parts of reserveAtOnce's statement that differ with the caller's writes. Without them the reservation
 * selects from the hold: no hold, no row, nothing written.
 */
const UNGUARDED = { ctes: sql``, guard: sql``, account: sql`held.id`, source: sql`held` };

/**
 * With them: the writes as CTEs, each guarded by the one before (the first by a one-row start), the hold by
 * the last, and the reservation always one row whose account comes from the hold (see reserveAtOnce).
 */
function guardedBy(writes: EmbeddedWrite[]): typeof UNGUARDED {
  let ctes = sql``;
  let last = sql`(select 1) as go`;
  for (const [i, write] of writes.entries()) {
    const name = sql.raw(`admitted_${i}`);
    ctes = sql`${ctes}${name} as (${write(last)}), `;
    last = name;
  }
  return {
    ctes,
    guard: sql` and exists (select 1 from ${last})`,
    account: sql`(select id from held)`,
    source: sql`(select 1) as one`,
  };
}

/**
 * PostgreSQL undid a one-round-trip write because a constraint refused it: 23502 (NOT NULL: a guarded step
 * found nothing after an earlier one wrote) or 23514 (a CHECK of the account).
 */
function undoneByConstraint(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === '23502' || code === '23514';
}

/** What PostgreSQL's one-statement hold answers (reserveAtOnce). */
type HeldRow = { usd_balance_nano: bigint; usd_available_nano: bigint };

/**
 * An account's balance from its row and its DIEM counters of the day (`diem_usage`: absent when the account
 * used none that day).
 */
function balanceOf(
  account: { usd_balance_nano: bigint; usd_reserved_nano: bigint; diem_stake_nano: bigint },
  usage: { usedNano: bigint; reservedNano: bigint },
): Balance {
  return {
    usdNano: account.usd_balance_nano,
    usdReservedNano: account.usd_reserved_nano,
    diemAllowanceNano: account.diem_stake_nano,
    diemUsedTodayNano: usage.usedNano,
    diemReservedTodayNano: usage.reservedNano,
    diemAvailableNano: maxBig(0n, account.diem_stake_nano - usage.usedNano - usage.reservedNano),
    usdAvailableNano: maxBig(0n, account.usd_balance_nano - account.usd_reserved_nano),
  };
}

/**
 * The statement of an account's balance (`balanceOfRow`): its row and its DIEM counters of `epochDay`, for
 * `compiledOnce`.
 */
export const balanceQuery = (db: Kysely<Tables>) => (epochDay: number, accountId: string) =>
  db
    .selectFrom('accounts')
    .leftJoin('diem_usage', (join) =>
      join.onRef('diem_usage.account_id', '=', 'accounts.id').on('diem_usage.epoch_day', '=', epochDay),
    )
    .select([
      'accounts.usd_balance_nano',
      'accounts.usd_reserved_nano',
      'accounts.diem_stake_nano',
      'diem_usage.used_nano',
      'diem_usage.reserved_nano',
    ])
    .where('accounts.id', '=', accountId);

/** What `balanceQuery` reads: the account's row and its DIEM counters of the day (null: none used). */
export type BalanceRow = {
  usd_balance_nano: bigint;
  usd_reserved_nano: bigint;
  diem_stake_nano: bigint;
  used_nano: bigint | null;
  reserved_nano: bigint | null;
};

/**
 * An account's balance from what `balanceQuery` read, with `heldNano` (USD held in memory for it:
 * held-reservations.ts) reserved besides its row's.
 */
export function balanceOfRow(row: BalanceRow, heldNano = 0n): Balance {
  return balanceOf(withHeld(row, heldNano), {
    usedNano: row.used_nano ?? 0n,
    reservedNano: row.reserved_nano ?? 0n,
  });
}

/** An account row with `heldNano` (USD held in memory for it) added to its reserved sum. */
type AccountFigures = { usd_balance_nano: bigint; usd_reserved_nano: bigint; diem_stake_nano: bigint };
function withHeld(account: AccountFigures, heldNano: bigint): AccountFigures {
  if (heldNano === 0n) return account;
  return {
    usd_balance_nano: account.usd_balance_nano,
    usd_reserved_nano: account.usd_reserved_nano + heldNano,
    diem_stake_nano: account.diem_stake_nano,
  };
}

/** The refusal of a reservation of `requiredNano` that `balance` cannot cover. */
function insufficient(requiredNano: bigint, balance: Balance): InsufficientBalanceError {
  return new InsufficientBalanceError({
    requiredNano,
    usdAvailableNano: balance.usdAvailableNano,
    diemAvailableNano: balance.diemAvailableNano,
  });
}

/** The part of a balance the `x-service-balance-*` headers report (BalanceBefore). */
export function balanceBefore(balance: Balance): BalanceBefore {
  return { usdNano: balance.usdNano, diemNano: balance.diemAllowanceNano - balance.diemUsedTodayNano };
}

export function toReservation(row: Selectable<ReservationsTable>): Reservation {
  return {
    id: row.id,
    accountId: row.account_id,
    apiKeyId: row.api_key_id,
    requestId: row.request_id,
    modelId: row.model_id,
    usdNano: row.usd_nano,
    diemNano: row.diem_nano,
    epochDay: toNumber(row.epoch_day),
    status: row.status,
    createdAtMs: toNumber(row.created_at_ms),
    expiresAtMs: toNumber(row.expires_at_ms),
    settledAtMs: toNumberOrNull(row.settled_at_ms),
  };
}

export function toLedgerEntry(row: Selectable<LedgerEntriesTable>): LedgerEntry {
  return entryWithSeq(row, row.seq);
}

/** The LedgerEntry of a row's columns and its `seq` (an entry just written: no copy of it to add `seq`). */
function entryWithSeq(row: Omit<Selectable<LedgerEntriesTable>, 'seq'>, seq: number | bigint): LedgerEntry {
  return {
    seq: toNumber(seq),
    id: row.id,
    accountId: row.account_id,
    apiKeyId: row.api_key_id,
    reservationId: row.reservation_id,
    type: row.type,
    currency: row.currency,
    amountNano: row.amount_nano,
    balanceAfterNano: row.balance_after_nano,
    requestId: row.request_id,
    modelId: row.model_id,
    sku: row.sku,
    units: row.units,
    unitPriceNano: row.unit_price_nano,
    details: row.details === null ? null : JSON.parse(row.details),
    network: row.network,
    txHash: row.tx_hash,
    createdAtMs: toNumber(row.created_at_ms),
  };
}

function decimalText(field: string, value: string | number | bigint | null | undefined): string | null {
  if (value === null || value === undefined) return null;
  const text = typeof value === 'string' ? value.trim() : String(value);
  if (!/^-?\d+(\.\d+)?([eE][-+]?\d+)?$/.test(text)) {
    throw new InvalidInputError(field, `${field} is not a number`);
  }
  return text;
}

function checkLimit(limit: number, max: number): number {
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > max) {
    throw new InvalidInputError('limit', `limit must be an integer from 1 to ${max}`);
  }
  return limit;
}

/** The items of a capture, checked, with their text columns as stored. */
function captureItems(input: CaptureInput) {
  return input.items.map((item, index) => {
    assertAmount(`items[${index}].amountNano`, item.amountNano);
    // One shape for every item, whatever the caller's objects hold.
    return {
      sku: item.sku,
      amountNano: item.amountNano,
      units: decimalText(`items[${index}].units`, item.units),
      unitPriceNano: decimalText(`items[${index}].unitPriceNano`, item.unitPriceNano),
      modelId: item.modelId ?? null,
      details: item.details === undefined || item.details === null ? null : JSON.stringify(item.details),
    };
  });
}
type StoredItem = ReturnType<typeof captureItems>[number];

/**
 * How a capture charges a reservation holding `usdNano` and `diemNano`: the total capped at the reservation,
 * DIEM first, then USD, item by item.
 */
function splitCharge<Item extends { amountNano: bigint }>(items: Item[], usdNano: bigint, diemNano: bigint) {
  const requestedNano = items.reduce((sum, item) => sum + item.amountNano, 0n);
  const total = minBig(requestedNano, usdNano + diemNano);
  let budget = total;
  let diemLeft = diemNano;
  let usdCharged = 0n;
  let diemCharged = 0n;
  const parts = items.map((item) => {
    const amount = minBig(item.amountNano, budget);
    budget -= amount;
    const diem = minBig(amount, diemLeft);
    diemLeft -= diem;
    diemCharged += diem;
    usdCharged += amount - diem;
    return { item, diem, usd: amount - diem };
  });
  return { parts, requestedNano, total, usdCharged, diemCharged };
}

/** The split of a capture's stored items (what its entries are written from). */
type StoredSplit = ReturnType<typeof splitCharge<StoredItem>>;

/**
 * What capturing `input` against `reservation` charges: `captureWith`'s result without its entries. It needs
 * only the reservation's figures and the items, so it is known before the capture runs (a reply that does not
 * wait for its capture reports it; Charges.captureDetached).
 */
export function captureAmounts(
  reservation: Reservation,
  input: CaptureInput,
): Omit<CaptureResult, 'entries'> {
  // The amounts only: the items' stored text (units, prices, details) is the capture's own work.
  for (const [index, item] of input.items.entries())
    assertAmount(`items[${index}].amountNano`, item.amountNano);
  return amountsOf(splitCharge(input.items, reservation.usdNano, reservation.diemNano));
}

/** A split's amounts, as a capture reports them. */
function amountsOf(split: ReturnType<typeof splitCharge>): Omit<CaptureResult, 'entries'> {
  return {
    usdNano: split.usdCharged,
    diemNano: split.diemCharged,
    requestedNano: split.requestedNano,
    clamped: split.requestedNano > split.total,
  };
}

/** The ledger repository. */
export function createLedger(database: Database, options: LedgerOptions = {}) {
  /** SQLite's change stamp (Database.changeStamp); none on PostgreSQL. */
  const changeStamp = database.changeStamp;
  const { db, dialect } = database;
  // PostgreSQL: a statement that locks the account's row waits for its place (Database.forAccountRow), and
  // runs on the executor given: the database, or, `batchable`, the transaction of the account's statements
  // that waited together. A batchable `fn` is one statement on that executor that lets every database error
  // through (account-gate.ts).
  const atAccountRow = <T>(
    accountId: string,
    fn: (q: Kysely<Tables>) => Promise<T>,
    batchable: boolean,
  ): Promise<T> => (database.forAccountRow ? database.forAccountRow(accountId, fn, batchable) : fn(db));
  const { now, randomId } = resolveOptions(options);
  // SQLite: the reservations held in memory on this database (held-reservations.ts), which every ledger on it
  // counts; this one holds there only with `holdsInMemory`.
  const memory = dialect === 'sqlite' ? heldReservationsOf(database) : undefined;
  const holdsInMemory = memory !== undefined && options.holdsInMemory === true;

  // lockAccount's statement (PostgreSQL: FOR UPDATE; SQLite's transaction holds the write lock already).
  const selectAccountLocked = compiledOnce((accountId: string) => {
    const query = db.selectFrom('accounts').selectAll().where('id', '=', accountId);
    return dialect === 'postgres' ? query.forUpdate() : query;
  });

  /**
   * Reads the account row, locking it for the rest of the transaction (see the module comment): every
   * reservation without a key (a wallet's) does.
   */
  async function lockAccount(trx: Transaction<Tables>, accountId: string) {
    const [row] = await selectAccountLocked(trx, accountId);
    if (!row) throw new NotFoundError('account', accountId);
    return row;
  }

  /**
   * lockAccount and the spend limits of one of the account's keys in a single statement (PostgreSQL locks
   * only the account row). `key` is undefined when the key does not exist or belongs to another account.
   */
  const selectAccountWithKey = compiledOnce((accountId: string, apiKeyId: string) => {
    const query = db
      .selectFrom('accounts')
      .leftJoin('api_keys', (join) =>
        join.onRef('api_keys.account_id', '=', 'accounts.id').on('api_keys.id', '=', apiKeyId),
      )
      // Only what a reservation reads: every column is a conversion (and a BigInt) per row.
      .select([
        'accounts.usd_balance_nano',
        'accounts.usd_reserved_nano',
        'accounts.diem_stake_nano',
        'api_keys.id as key_id',
        'api_keys.limit_usd_nano as key_limit_usd_nano',
        'api_keys.limit_diem_nano as key_limit_diem_nano',
        'api_keys.limit_period as key_limit_period',
      ])
      .where('accounts.id', '=', accountId);
    return dialect === 'postgres' ? query.forUpdate('accounts') : query;
  });

  async function lockAccountWithKey(trx: Transaction<Tables>, accountId: string, apiKeyId: string) {
    const [row] = await selectAccountWithKey(trx, accountId, apiKeyId);
    if (!row) throw new NotFoundError('account', accountId);
    const key =
      row.key_id === null || row.key_limit_period === null
        ? undefined
        : {
            limit_usd_nano: row.key_limit_usd_nano,
            limit_diem_nano: row.key_limit_diem_nano,
            limit_period: row.key_limit_period,
          };
    return { account: row, key };
  }

  // The statements of every reservation and capture, compiled once (see compiledOnce).
  /**
   * A reservation's row: `held` (a reservation in the rows, `settledAtMs` null), or written once settled (one
   * held in memory: held-reservations.ts). Exactly these values (an INSERT without ON CONFLICT writes it or
   * throws): not read back. `value(column)` gives the row's values in `reservationValues`' order.
   */
  const reservationRow = (value: (column: number) => unknown) => ({
    id: value(0) as string,
    account_id: value(1) as string,
    api_key_id: value(2) as string | null,
    request_id: value(3) as string,
    model_id: value(4) as string | null,
    usd_nano: value(5) as bigint,
    diem_nano: value(6) as bigint,
    epoch_day: value(7) as number,
    status: value(8) as ReservationStatus,
    created_at_ms: value(9) as number,
    expires_at_ms: value(10) as number,
    settled_at_ms: value(11) as number | null,
  });
  const RESERVATION_COLUMNS = 12;
  /** Appends the values of `reservation`'s row written with `status` to `values`, in reservationRow's order. */
  const reservationValues = (
    values: unknown[],
    reservation: Reservation,
    status: ReservationStatus,
    settledAtMs: number | null,
  ) =>
    values.push(
      reservation.id,
      reservation.accountId,
      reservation.apiKeyId,
      reservation.requestId,
      reservation.modelId,
      reservation.usdNano,
      reservation.diemNano,
      reservation.epochDay,
      status,
      reservation.createdAtMs,
      reservation.expiresAtMs,
      settledAtMs,
    );
  type RowsInsert = (runner: Executor, ...values: unknown[]) => Promise<unknown[]>;
  /**
   * The insert of `rows` reservations' rows (one statement), compiled once per row count: one row for a
   * reservation's own, up to GROUP_COMMIT_MAX for the captures written together (writeHeldCaptures).
   */
  const reservationInserts: RowsInsert[] = [];
  function insertReservations(rows: number): RowsInsert {
    let insert = reservationInserts[rows];
    if (!insert) {
      insert = compiledOnce((...values: unknown[]) =>
        db
          .insertInto('reservations')
          .values(
            Array.from({ length: rows }, (_, row) =>
              reservationRow((column) => values[row * RESERVATION_COLUMNS + column]),
            ),
          ),
      ) as RowsInsert;
      if (rows <= GROUP_COMMIT_MAX) reservationInserts[rows] = insert;
    }
    return insert;
  }
  const writeReservation = (
    trx: Transaction<Tables>,
    reservation: Reservation,
    status: ReservationStatus,
    settledAtMs: number | null,
  ) => {
    const values: unknown[] = [];
    reservationValues(values, reservation, status, settledAtMs);
    return insertReservations(1)(trx, ...values);
  };
  /**
   * Settles a reservation held in memory without capturing it (`released`, `expired`): its row written so; the
   * reservation as it now is, or NOT_HELD when it is not held here.
   */
  const settleHeld = (reservationId: string, status: 'released' | 'expired', at: number) =>
    memory
      ? memory.settle(reservationId, async (reservation): Promise<Reservation> => {
          await database.transaction((trx) => writeReservation(trx, reservation, status, at));
          return extend(reservation, { status, settledAtMs: at });
        })
      : NOT_HELD;
  const addReserved = compiledOnce((usdNano: bigint, accountId: string) =>
    db
      .updateTable('accounts')
      .set((eb) => ({ usd_reserved_nano: eb('usd_reserved_nano', '+', usdNano) }))
      .where('id', '=', accountId),
  );
  const selectReservationAccount = compiledOnce((reservationId: string) => {
    const query = db
      .selectFrom('accounts')
      .selectAll()
      .where('id', '=', (eb) =>
        eb.selectFrom('reservations').select('account_id').where('id', '=', reservationId),
      );
    return dialect === 'postgres' ? query.forUpdate() : query;
  });
  const claimReservation = compiledOnce((settledAtMs: number, reservationId: string) =>
    db
      .updateTable('reservations')
      .set({ status: 'captured', settled_at_ms: settledAtMs })
      .where('id', '=', reservationId)
      .where('status', '=', 'held')
      .returning(CLAIMED_COLUMNS),
  );
  /**
   * captureWith's claim on SQLite: held, and with the figures the caller's reservation has, proved by the
   * statement itself (what it changed), so nothing is read back (RETURNING costs SQLite an ephemeral table
   * per statement).
   */
  const claimAsStored = compiledOnceResult(
    (
      settledAtMs: number,
      reservationId: string,
      accountId: string,
      usdNano: bigint,
      diemNano: bigint,
      epochDay: number,
    ) =>
      db
        .updateTable('reservations')
        .set({ status: 'captured', settled_at_ms: settledAtMs })
        .where('id', '=', reservationId)
        .where('status', '=', 'held')
        .where('account_id', '=', accountId)
        .where('usd_nano', '=', usdNano)
        .where('diem_nano', '=', diemNano)
        .where('epoch_day', '=', epochDay),
  );
  /** A capture's USD settlement of the account: `chargedNano` off the balance, the hold released. */
  const settleUsd = (chargedNano: bigint, releasedNano: bigint, accountId: string) =>
    db
      .updateTable('accounts')
      .set((eb) => ({
        usd_balance_nano: eb('usd_balance_nano', '-', chargedNano),
        usd_reserved_nano: eb('usd_reserved_nano', '-', releasedNano),
      }))
      .where('id', '=', accountId);
  const settleAccount = compiledOnce(settleUsd);
  /**
   * The balances an account's settlement left, read by a statement of their own on SQLite: an UPDATE with
   * RETURNING runs through an ephemeral table there, a B-tree with a page cache of its own opened and closed
   * on every run (18,000 to 20,000 instructions); the update and this read cost 3,000 to 5,000 fewer per
   * capture (bench/HISTORY.md, thirty-first round). Not `lockAccount`: its `select *` measured 13,000 to
   * 16,000 instructions more per chat than these two columns.
   */
  const selectSettled = compiledOnce((accountId: string) =>
    db.selectFrom('accounts').select(['usd_balance_nano', 'diem_stake_nano']).where('id', '=', accountId),
  );

  const selectBalance = compiledOnce(balanceQuery(db));

  async function diemUsage(q: Executor, accountId: string, epochDay: number) {
    const row = await q
      .selectFrom('diem_usage')
      .select(['used_nano', 'reserved_nano'])
      .where('account_id', '=', accountId)
      .where('epoch_day', '=', epochDay)
      .executeTakeFirst();
    return { usedNano: row?.used_nano ?? 0n, reservedNano: row?.reserved_nano ?? 0n };
  }

  /** Adds to a day's DIEM counters, creating the row on first use (an atomic upsert). */
  async function bumpDiem(
    trx: Transaction<Tables>,
    accountId: string,
    epochDay: number,
    delta: { usedNano?: bigint; reservedNano?: bigint },
  ): Promise<void> {
    const used = delta.usedNano ?? 0n;
    const reserved = delta.reservedNano ?? 0n;
    if (used === 0n && reserved === 0n) return;
    await trx
      .insertInto('diem_usage')
      .values({
        account_id: accountId,
        epoch_day: epochDay,
        used_nano: maxBig(used, 0n),
        reserved_nano: maxBig(reserved, 0n),
      })
      .onConflict((oc) =>
        oc.columns(['account_id', 'epoch_day']).doUpdateSet((eb) => ({
          used_nano: eb('diem_usage.used_nano', '+', used),
          reserved_nano: eb('diem_usage.reserved_nano', '+', reserved),
        })),
      )
      .execute();
  }

  // keySpendOn's statements of every reservation of a key with a spend limit (compiledOnce).
  const selectSpendDays = compiledOnce((apiKeyId: string, fromDay: number) =>
    db
      .selectFrom('api_key_spend_days')
      .select((eb) => ['currency', eb.fn.sum<string | bigint | null>('net_nano').as('total')])
      .where('api_key_id', '=', apiKeyId)
      .where('epoch_day', '>=', fromDay)
      .groupBy('currency'),
  );
  const selectHeldOfKey = compiledOnce((apiKeyId: string) =>
    db
      .selectFrom('reservations')
      .select((eb) => [
        eb.fn.sum<string | bigint | null>('usd_nano').as('usd'),
        eb.fn.sum<string | bigint | null>('diem_nano').as('diem'),
      ])
      .where('api_key_id', '=', apiKeyId)
      // A literal, so that both engines use the partial index of held reservations.
      .where('status', '=', HELD),
  );

  /**
   * Net spend of a key since a time (charges minus refunds), optionally plus its held reservations. The whole
   * UTC days come from api_key_spend_days (a row per day and currency); only a time inside a day (the trailing
   * seven days of a key's listing) also sums the ledger's entries of that one partial day. The periods of the
   * spend limits start at midnight UTC: the check reads no entry.
   */
  async function keySpendOn(
    q: Executor,
    apiKeyId: string,
    sinceMs: number,
    includeHeld: boolean,
  ): Promise<KeySpend> {
    const fromDay = Math.ceil(sinceMs / DAY_MS);
    const rows: Array<{ currency: Currency; total: string | bigint | null }> = await selectSpendDays(
      q,
      apiKeyId,
      fromDay,
    );
    if (fromDay * DAY_MS > sinceMs) {
      const partial = await q
        .selectFrom('ledger_entries')
        .select((eb) => ['currency', eb.fn.sum<string | bigint | null>('amount_nano').as('total')])
        .where('api_key_id', '=', apiKeyId)
        .where('type', 'in', ['CHARGE', 'REFUND'])
        .where('created_at_ms', '>=', sinceMs)
        .where('created_at_ms', '<', fromDay * DAY_MS)
        .groupBy('currency')
        .execute();
      rows.push(...partial);
    }
    // A refund of a charge from an earlier period must not raise this period's budget, hence the floor at 0.
    const spent = (currency: Currency) =>
      maxBig(0n, -rows.reduce((sum, r) => (r.currency === currency ? sum + toBigInt(r.total) : sum), 0n));
    let usdNano = spent('USD');
    let diemNano = spent('DIEM');
    if (includeHeld) {
      // Held reservations count whenever they were made: their capture will be booked now.
      const [held] = await selectHeldOfKey(q, apiKeyId);
      usdNano += toBigInt(held?.usd) + (memory?.usdOfKey(apiKeyId) ?? 0n);
      diemNano += toBigInt(held?.diem);
    }
    return { usdNano, diemNano };
  }

  /**
   * The multi-row INSERT of ledger entries, compiled once per shape (columns and row count; a handful); the
   * `seq` each entry was given. Both engines number the rows of a multi-row VALUES in list order. On SQLite
   * they are numbered one after the other (one writer at a time, each row one above the largest `seq`), so
   * the last one given (`insertId`) tells them all and nothing is read back (RETURNING costs SQLite an
   * ephemeral table per statement); PostgreSQL's sequence may be shared with other writers: it returns them.
   */
  type EntryInsert = (runner: Executor, ...values: unknown[]) => Promise<QueryResult<unknown>>;
  /**
   * By row count, each with its columns: found by comparing the column names (the same strings each time),
   * not by a key joined from them per call (a new string that V8 hashes before each lookup).
   */
  const entryInserts: Array<Array<{ columns: readonly string[]; insert: EntryInsert }>> = [];
  let entryShapes = 0;
  const sameColumns = (a: readonly string[], b: readonly string[]) =>
    a.length === b.length && a.every((column, i) => column === b[i]);
  async function insertEntryRows(
    trx: Transaction<Tables>,
    entries: NewEntry[],
  ): Promise<Array<{ id: string; seq: bigint | number }>> {
    const columns = Object.keys(entries[0] as NewEntry) as (keyof NewEntry)[];
    const shapes = entryInserts[entries.length];
    let insert = shapes?.find((shape) => sameColumns(shape.columns, columns))?.insert;
    if (!insert) {
      insert = compiledOnceResult((...values: unknown[]) => {
        const query = db
          .insertInto('ledger_entries')
          .values(
            entries.map(
              (_, row) =>
                Object.fromEntries(
                  columns.map((column, i) => [column, values[row * columns.length + i]]),
                ) as NewEntry,
            ),
          );
        // Only what the database assigns, with the id to pair it to its entry: the rest is `entries`.
        return dialect === 'sqlite' ? query : query.returning(['id', 'seq']);
      }) as EntryInsert;
      if (entryShapes < 64) {
        entryShapes++;
        const known = entryInserts[entries.length];
        if (known) known.push({ columns, insert });
        else entryInserts[entries.length] = [{ columns, insert }];
      }
    }
    // A loop, not `flatMap`: V8 11 builds a `flatMap`'s result one runtime call per element.
    const values: unknown[] = [];
    for (const entry of entries) for (const column of columns) values.push(entry[column]);
    const result = await insert(trx, ...values);
    if (dialect !== 'sqlite') return result.rows as Array<{ id: string; seq: bigint | number }>;
    const last = result.insertId;
    if (last === undefined || result.numAffectedRows !== BigInt(entries.length))
      throw new StorageError('STORAGE_FAILURE', 'Ledger entries were not written');
    const first = last - BigInt(entries.length - 1);
    return entries.map((entry, i) => ({ id: entry.id, seq: first + BigInt(i) }));
  }

  async function insertEntries(trx: Transaction<Tables>, entries: Array<NewEntry>): Promise<LedgerEntry[]> {
    if (entries.length === 0) return [];
    // One statement for all of them: both engines number the rows of a multi-row VALUES in list order, so
    // `seq` follows the order the entries were computed in; sorted by `seq` since RETURNING order is not
    // promised. Each entry is what was written plus the `seq` it was given.
    const written = writtenEntries(entries, await insertEntryRows(trx, entries));
    await addKeySpend(trx, entries);
    return written;
  }

  /**
   * The key spend a write of entries makes (api_key_spend_days): per key, UTC day of the entry and currency,
   * the sum of its CHARGE and REFUND amounts. Empty for entries of no key, and for top-ups.
   */
  function keySpendOf(entries: ReadonlyArray<NewEntry>): Array<[key: string, day: number, Currency, bigint]> {
    const sums: Array<[key: string, day: number, Currency, bigint]> = [];
    for (const entry of entries) {
      if (entry.api_key_id === null || entry.type === 'TOP_UP') continue;
      const day = epochDayOf(toNumber(entry.created_at_ms));
      const same = sums.find(([key, d, c]) => key === entry.api_key_id && d === day && c === entry.currency);
      if (same) same[3] += entry.amount_nano;
      else sums.push([entry.api_key_id, day, entry.currency, entry.amount_nano]);
    }
    return sums;
  }

  /** Adds the key spend of `entries` to api_key_spend_days: one statement, compiled once per row count. */
  const spendUpserts = new Map<number, (runner: Executor, ...values: unknown[]) => Promise<unknown[]>>();
  async function addKeySpend(trx: Transaction<Tables>, entries: ReadonlyArray<NewEntry>): Promise<void> {
    const sums = keySpendOf(entries);
    if (sums.length === 0) return;
    let upsert = spendUpserts.get(sums.length);
    if (!upsert) {
      upsert = compiledOnce((...values: unknown[]) =>
        db
          .insertInto('api_key_spend_days')
          .values(
            sums.map((_, row) => ({
              api_key_id: values[4 * row] as string,
              epoch_day: values[4 * row + 1] as number,
              currency: values[4 * row + 2] as Currency,
              net_nano: values[4 * row + 3] as bigint,
            })),
          )
          .onConflict((oc) =>
            oc.columns(['api_key_id', 'epoch_day', 'currency']).doUpdateSet((eb) => ({
              net_nano: eb('api_key_spend_days.net_nano', '+', eb.ref('excluded.net_nano')),
            })),
          ),
      ) as (runner: Executor, ...values: unknown[]) => Promise<unknown[]>;
      if (spendUpserts.size < 16) spendUpserts.set(sums.length, upsert);
    }
    await upsert(trx, ...sums.flat());
  }

  /**
   * The entries as written: each with the `seq` its row was given (and the balance after, when the statement
   * computed it), in `seq` order; StorageError unless every entry has exactly one row.
   */
  function writtenEntries(
    entries: NewEntry[],
    rows: Array<{ id: string; seq: number | bigint; balance_after_nano?: bigint }>,
  ): LedgerEntry[] {
    const rowOf = new Map(rows.map((row) => [row.id, row]));
    if (rows.length !== entries.length || rowOf.size !== entries.length)
      throw new StorageError('STORAGE_FAILURE', 'Ledger entries were not written');
    return entries
      .map((entry) => {
        const row = rowOf.get(entry.id) as (typeof rows)[number];
        if (row.balance_after_nano !== undefined) entry.balance_after_nano = row.balance_after_nano;
        return entryWithSeq(entry, row.seq);
      })
      .sort((a, b) => a.seq - b.seq);
  }

  function entryValues(
    fields: Partial<NewEntry> &
      Pick<NewEntry, 'account_id' | 'type' | 'currency' | 'amount_nano' | 'balance_after_nano'>,
    at: number,
  ): NewEntry {
    return {
      id: randomId(),
      api_key_id: null,
      reservation_id: null,
      request_id: null,
      model_id: null,
      sku: null,
      units: null,
      unit_price_nano: null,
      details: null,
      network: null,
      tx_hash: null,
      created_at_ms: at,
      ...fields,
    };
  }

  /** Moves a held reservation to `released` or `expired`; `changed: false` (and no change) if it is not held. */
  async function settleReservation(
    trx: Transaction<Tables>,
    reservationId: string,
    status: 'released' | 'expired',
    at: number,
  ): Promise<{ changed: boolean; row: Selectable<ReservationsTable> }> {
    const peek = await trx
      .selectFrom('reservations')
      .select('account_id')
      .where('id', '=', reservationId)
      .executeTakeFirst();
    if (!peek) throw new NotFoundError('reservation', reservationId);
    await lockAccount(trx, peek.account_id);
    const row = await lockedReservation(trx, reservationId);
    if (row.status !== 'held') return { changed: false, row };
    await releaseHeld(trx, row);
    const updated = await trx
      .updateTable('reservations')
      .set({ status, settled_at_ms: at })
      .where('id', '=', reservationId)
      .where('status', '=', 'held')
      .returningAll()
      .executeTakeFirstOrThrow();
    return { changed: true, row: updated };
  }

  async function lockedReservation(trx: Transaction<Tables>, reservationId: string) {
    let query = trx.selectFrom('reservations').selectAll().where('id', '=', reservationId);
    if (dialect === 'postgres') query = query.forUpdate();
    const row = await query.executeTakeFirst();
    if (!row) throw new NotFoundError('reservation', reservationId);
    return row;
  }

  /** Gives back the reserved counters of a held reservation (the caller holds the account lock). */
  async function releaseHeld(trx: Transaction<Tables>, row: Selectable<ReservationsTable>) {
    if (row.usd_nano > 0n) {
      await trx
        .updateTable('accounts')
        .set((eb) => ({ usd_reserved_nano: eb('usd_reserved_nano', '-', row.usd_nano) }))
        .where('id', '=', row.account_id)
        .execute();
    }
    await bumpDiem(trx, row.account_id, toNumber(row.epoch_day), { reservedNano: -row.diem_nano });
  }

  async function refundEntries(q: Executor, input: RefundInput): Promise<LedgerEntry[]> {
    const rows = await q
      .selectFrom('ledger_entries')
      .selectAll()
      .where('account_id', '=', input.accountId)
      .where('request_id', '=', input.requestId)
      // A literal, so that the partial index of refunds (ledger_entries_refund_once_idx) can serve it; not in
      // the database's order either (at most one row per currency), which would rather walk the account's
      // entries in `seq` order.
      .where('type', '=', sql.lit('REFUND'))
      .execute();
    return rows.map(toLedgerEntry).sort((a, b) => a.seq - b.seq);
  }

  async function refundOnce(input: RefundInput): Promise<RefundResult> {
    const at = now();
    return database.transaction(async (trx) => {
      const account = await lockAccount(trx, input.accountId);
      const previous = await refundEntries(trx, input);
      if (previous.length > 0) return { entries: previous, refunded: false };
      const charges = await trx
        .selectFrom('ledger_entries')
        .leftJoin('reservations', 'reservations.id', 'ledger_entries.reservation_id')
        .selectAll('ledger_entries')
        .select('reservations.epoch_day as reservation_day')
        .where('ledger_entries.account_id', '=', input.accountId)
        .where('ledger_entries.seq', '>=', input.chargeSeqs.first)
        .where('ledger_entries.seq', '<=', input.chargeSeqs.last)
        .where('ledger_entries.request_id', '=', input.requestId)
        .where('ledger_entries.type', '=', 'CHARGE')
        .orderBy('ledger_entries.seq')
        .execute();
      const first = charges[0];
      if (!first) throw new NothingToRefundError(input.requestId);
      const usd = charges.filter((c) => c.currency === 'USD').reduce((sum, c) => sum - c.amount_nano, 0n);
      const diemByDay = new Map<number, bigint>();
      for (const charge of charges) {
        if (charge.currency !== 'DIEM') continue;
        const day =
          charge.reservation_day === null
            ? epochDayOf(toNumber(charge.created_at_ms))
            : toNumber(charge.reservation_day);
        diemByDay.set(day, (diemByDay.get(day) ?? 0n) - charge.amount_nano);
      }
      const diem = [...diemByDay.values()].reduce((sum, value) => sum + value, 0n);
      const common = {
        account_id: input.accountId,
        api_key_id: first.api_key_id,
        reservation_id: first.reservation_id,
        type: 'REFUND' as const,
        request_id: input.requestId,
        model_id: first.model_id,
      };
      const values: Array<NewEntry> = [];
      if (diem > 0n) {
        for (const [day, amount] of diemByDay) {
          await bumpDiem(trx, input.accountId, day, { usedNano: -amount });
        }
        const today = await diemUsage(trx, input.accountId, epochDayOf(at));
        const left = maxBig(0n, account.diem_stake_nano - today.usedNano);
        values.push(
          entryValues(
            extend(common, { currency: 'DIEM' as const, amount_nano: diem, balance_after_nano: left }),
            at,
          ),
        );
      }
      if (usd > 0n) {
        values.push(
          entryValues(
            extend(common, {
              currency: 'USD' as const,
              amount_nano: usd,
              balance_after_nano: account.usd_balance_nano + usd,
            }),
            at,
          ),
        );
        await trx
          .updateTable('accounts')
          .set((eb) => ({ usd_balance_nano: eb('usd_balance_nano', '+', usd) }))
          .where('id', '=', input.accountId)
          .execute();
      }
      if (values.length === 0) throw new NothingToRefundError(input.requestId);
      return { entries: await insertEntries(trx, values), refunded: true };
    });
  }

  /** The reservation a hold of `usdNano` and `diemNano` at `at` writes (a fresh id, held, its expiry). */
  function heldReservation(
    input: ReserveInput,
    apiKeyId: string | null,
    usdNano: bigint,
    diemNano: bigint,
    at: number,
  ): Reservation {
    return {
      id: randomId(),
      accountId: input.accountId,
      apiKeyId,
      requestId: input.requestId,
      modelId: input.modelId ?? null,
      usdNano,
      diemNano,
      epochDay: epochDayOf(at),
      status: 'held',
      createdAtMs: at,
      expiresAtMs: at + input.ttlMs,
      settledAtMs: null,
    };
  }

  /**
   * The condition of reserveAtOnce's hold for a key with a spend limit: the key is the account's and `amount`
   * fits its USD limit, as `reserveIn` checks it (no DIEM is drawn: the DIEM limit does not apply). The spend
   * since the period's first UTC day (api_key_spend_days, floored at 0) plus the key's held reservations plus
   * `amount`.
   */
  function keyWithinUsdLimit(apiKeyId: string, accountId: string, amount: RawBuilder<unknown>, at: number) {
    const periodDay = (period: 'EPOCH' | 'MONTH') =>
      sql`cast(${epochDayOf(periodStartMs(period, at))} as integer)`;
    return sql`exists (select 1 from api_keys k where k.id = ${apiKeyId} and k.account_id = ${accountId}
      and (k.limit_usd_nano is null or ${amount} = 0
        or greatest(0, -coalesce((select sum(d.net_nano) from api_key_spend_days d
            where d.api_key_id = ${apiKeyId} and d.currency = 'USD' and d.epoch_day >= case k.limit_period
              when 'EPOCH' then ${periodDay('EPOCH')} when 'MONTH' then ${periodDay('MONTH')} else 0 end), 0))
          + coalesce((select sum(r.usd_nano) from reservations r
            where r.api_key_id = ${apiKeyId} and r.status = 'held'), 0)
          + ${amount} <= k.limit_usd_nano))`;
  }

  /** Whether reserveAtOnce's hold for a key believed to have a spend limit (checked in the statement). */
  function keyLimited(input: ReserveInput, apiKeyId: string | null): boolean {
    return apiKeyId !== null && input.keySpendLimited === true;
  }

  /**
   * Whether reserveAtOnce holds with its one prepared statement on the executor it is given; otherwise with
   * a script after the account's lock (a key with a spend limit, a caller's writes) on a connection of its own.
   */
  function holdsInOneStatement(input: ReserveInput, apiKeyId: string | null, writes?: EmbeddedWrite[]) {
    return !writes?.length && !keyLimited(input, apiKeyId);
  }

  /**
   * PostgreSQL: a reservation that draws on free USD only (no DIEM stake on the account; the key charged, if
   * any, belongs to it and has no spend limit) as one statement sent on its own. Its update of the account row
   * takes the row's lock, checks the free balance and raises the reserved amount; the insert of the hold reads
   * what it returned. A concurrent writer of the account waits for the lock and then has PostgreSQL re-check the
   * update's condition on the row as the previous holder left it (READ COMMITTED), so nothing is reserved that
   * is not there. Every request of an account takes this lock: held for the statement alone instead of across
   * the driver's round trips, it no longer bounds an account's requests per second to a few of them per event
   * loop delay. It answers with the account's USD credit as the hold found it (the balance before the
   * request). Undefined when a condition does not hold: nothing was written, and the transaction of
   * `reserveIn` decides (DIEM, spend limits, the errors). The one statement runs on `q`: the database, or the
   * transaction of the account's holds and captures that waited together (account-gate.ts); the scripts
   * below, on a connection of their own.
   *
   * For a key believed to have a spend limit (`keySpendLimited`), the hold's condition also checks the USD
   * limit as `reserveIn` does (the key's spend since its period's first UTC day, from api_key_spend_days, plus
   * its held reservations, plus this one), in the script below: those rows are written under the account's
   * lock, so only a statement started after the lock sees them all.
   *
   * With the caller's `writes` (ReserveWithin.embedded), a script of two statements sent as one query (one
   * implicit transaction): the account row locked, then one statement of the writes, each guarded by the one
   * before, the hold guarded by the last, and the reservation. The lock comes first and alone because a write
   * may decide on rows that no update of this statement locks (the credit cap sums a day of buckets): under
   * READ COMMITTED a statement reads what was committed when it started, and only a statement started after
   * the lock reads every write of the account's previous holders. The reservation row is inserted whatever
   * happened, its account taken from the hold: when a write or the hold refused after another wrote, it is
   * NULL, NOT NULL fails the statement and PostgreSQL undoes the script.
   */
  async function reserveAtOnce(
    q: Executor,
    input: ReserveInput,
    apiKeyId: string | null,
    at: number,
    writes?: EmbeddedWrite[],
  ): Promise<ReserveResult | undefined> {
    const reservation = heldReservation(input, apiKeyId, input.amountNano, 0n, at);
    const amount = sql`cast(${reservation.usdNano} as bigint)`;
    // A key believed to have a spend limit: the limit checked in the statement, which must then start after
    // the account's lock (the script): the spend and the held reservations it sums are written under that lock.
    const limited = keyLimited(input, apiKeyId);
    const keyCondition =
      apiKeyId === null
        ? sql`true`
        : limited
          ? keyWithinUsdLimit(apiKeyId, reservation.accountId, amount, at)
          : sql`exists (select 1 from api_keys where id = ${apiKeyId} and account_id = ${reservation.accountId}
              and limit_usd_nano is null and limit_diem_nano is null)`;
    const shape = writes?.length ? guardedBy(writes) : UNGUARDED;
    const hold = sql<HeldRow>`with ${shape.ctes}held as (
        update accounts set usd_reserved_nano = usd_reserved_nano + ${amount}
        where id = ${reservation.accountId} and diem_stake_nano = 0
          and usd_balance_nano - usd_reserved_nano >= ${amount} and ${keyCondition}${shape.guard}
        returning id, usd_balance_nano, usd_balance_nano - usd_reserved_nano as usd_available_nano),
      reserved as (insert into reservations (id, account_id, api_key_id, request_id, model_id, usd_nano, diem_nano,
        epoch_day, status, created_at_ms, expires_at_ms, settled_at_ms)
      select ${reservation.id}, ${shape.account}, cast(${apiKeyId} as text),
        ${reservation.requestId}, cast(${reservation.modelId} as text), ${amount}, 0,
        cast(${reservation.epochDay} as integer), 'held', cast(${at} as bigint),
        cast(${reservation.expiresAtMs} as bigint), null
      from ${shape.source}
      returning id)
      select (select usd_balance_nano from held) as usd_balance_nano,
        (select usd_available_nano from held) as usd_available_nano from reserved`;
    // The balance the hold found (the hold leaves the balance as it was, and RETURNING gives the reserved sum
    // after it); without a DIEM stake (a condition of the hold) no allowance is left.
    const held = (row: HeldRow): ReserveResult => ({
      reservation,
      before: { usdNano: row.usd_balance_nano, diemNano: 0n },
      availableNano: row.usd_available_nano,
    });
    if (holdsInOneStatement(input, apiKeyId, writes)) {
      const [row] = (await q.executeQuery(prepared(hold.compile(db)))).rows;
      return row && held(row);
    }
    const lock = sql`select 1 from accounts where id = ${reservation.accountId} for update`;
    let rows: HeldRow[];
    try {
      // The hold as a prepared statement after the lock, in one round trip.
      rows = await scriptThenPrepared(database, withLiterals(lock.compile(db)), hold.compile(db));
    } catch (error) {
      // Something refused after something else wrote (see above), or a CHECK refused a write.
      if (undoneByConstraint(error)) return undefined;
      throw error;
    }
    // With writes it reserved (the script inserts its row or fails), so it must not answer "not here": the
    // answer of a script is its last statement's (database.ts). Without, the reservation selects from the
    // hold: no hold, no row, nothing written.
    const [row] = rows;
    if (!row && shape === UNGUARDED) return undefined;
    if (!row) throw new StorageError('STORAGE_FAILURE', 'The reservation script answered no row');
    return held(row);
  }

  /**
   * PostgreSQL: `captureWith` of a reservation of USD only as one statement (`q`: the database, or the
   * transaction that also runs the caller's `within`). In dependency order: the account row is updated (and
   * locked) first, as every writer locks it first, skipping a reservation seen settled; then the claim, which
   * needs that update and the reservation's exact figures still held; then the entries, whose balances after
   * are the balance the update left plus the charges after each. When the claim fails after the account was
   * updated (the reservation settled by another writer meanwhile), an entry's `account_id`, taken from the
   * claim, is NULL: the NOT NULL constraint fails the statement and PostgreSQL undoes all of it. `alongside`,
   * a caller's write, is a further CTE that selects from the claim: made exactly when the capture is. NotAtOnce
   * (nothing written) when it did not capture: the transaction of `captureWith` decides (and throws).
   */
  async function captureAtOnce(
    q: Executor,
    reservation: Reservation,
    split: StoredSplit,
    at: number,
    alongside?: EmbeddedWrite,
  ): Promise<LedgerEntry[]> {
    const claimed = claimedAs(reservation);
    // The balances after each entry as offsets from the balance before the capture, which the statement reads.
    const entries = chargeEntries(
      claimed,
      split.parts,
      { diemStakeNano: 0n, usdBalanceNano: 0n, diemUsedNano: 0n },
      at,
    );
    const values = sql.join(
      entries.map(
        (e, i) => sql`(cast(${i} as integer), cast(${e.id} as text), cast(${e.amount_nano} as bigint),
          cast(${e.balance_after_nano} as bigint), cast(${e.model_id} as text), cast(${e.sku} as text),
          cast(${e.units} as text), cast(${e.unit_price_nano} as text), cast(${e.details} as text))`,
      ),
    );
    // The key's spend of the day (api_key_spend_days), made with the claim: the entries are of one key, one
    // day and one currency, so one row or none (no key).
    const [spend] = keySpendOf(entries);
    let written: Array<{ id: string; seq: bigint | number; balance_after_nano: bigint }>;
    try {
      const capture = sql<(typeof written)[number]>`with settled as (
          update accounts set
            usd_balance_nano = usd_balance_nano - cast(${split.usdCharged} as bigint),
            usd_reserved_nano = usd_reserved_nano - cast(${reservation.usdNano} as bigint)
          where id = ${reservation.accountId}
            and exists (select 1 from reservations where id = ${reservation.id} and status = 'held')
          returning usd_balance_nano + cast(${split.usdCharged} as bigint) as before_nano),
        claimed as (
          update reservations set status = 'captured', settled_at_ms = cast(${at} as bigint)
          where id = ${reservation.id} and status = 'held' and account_id = ${reservation.accountId}
            and usd_nano = cast(${reservation.usdNano} as bigint) and diem_nano = 0
            and epoch_day = cast(${reservation.epochDay} as integer) and exists (select 1 from settled)
          returning account_id)${
            spend
              ? sql`,
        spent as (insert into api_key_spend_days (api_key_id, epoch_day, currency, net_nano)
          select cast(${spend[0]} as text), cast(${spend[1]} as integer), ${spend[2]}, cast(${spend[3]} as bigint)
          from claimed
          on conflict (api_key_id, epoch_day, currency)
          do update set net_nano = api_key_spend_days.net_nano + excluded.net_nano)`
              : sql``
          }${
            alongside
              ? sql`,
        alongside as (${alongside(sql`claimed`)})`
              : sql``
          }
        insert into ledger_entries (id, account_id, api_key_id, reservation_id, type, currency, amount_nano,
          balance_after_nano, request_id, model_id, sku, units, unit_price_nano, details, network, tx_hash,
          created_at_ms)
        select e.id, claimed.account_id, cast(${reservation.apiKeyId} as text), ${reservation.id}, 'CHARGE', 'USD',
          e.amount_nano, settled.before_nano + e.after_nano, ${reservation.requestId}, e.model_id, e.sku,
          e.units, e.unit_price_nano, e.details, null, null, cast(${at} as bigint)
        from (values ${values}) as e(ord, id, amount_nano, after_nano, model_id, sku, units, unit_price_nano,
          details)
        cross join settled left join claimed on true
        order by e.ord
        returning id, seq, balance_after_nano`;
      // One text per shape (the number of entries, a key's spend, the caller's write): prepared on PostgreSQL.
      ({ rows: written } = await q.executeQuery(prepared(capture.compile(q))));
    } catch (error) {
      // The claim failed after the update (see above), or a CHECK of the account refused it.
      if (undoneByConstraint(error)) throw new NotAtOnce();
      throw error;
    }
    if (written.length === 0) throw new NotAtOnce();
    return writtenEntries(entries, written);
  }

  // The statements of reserveWith / captureWith (appended; see there).
  const settleAccountReturning = compiledOnce(
    (chargedNano: bigint, releasedNano: bigint, accountId: string, reservationId: string) =>
      settleUsd(chargedNano, releasedNano, accountId)
        // Not for a reservation seen settled already (the claim after it is what proves it still held).
        .where((eb) =>
          eb.exists(
            eb
              .selectFrom('reservations')
              .select('reservations.id')
              .where('reservations.id', '=', reservationId)
              .where('reservations.status', '=', 'held'),
          ),
        )
        .returning(['usd_balance_nano', 'diem_stake_nano']),
  );

  /**
   * The CHARGE entries of a claimed reservation's split: one per (item, currency) with a non-zero amount, each
   * with the balance left after it (DIEM: the stake less the day's use, `diemUsedNano` before the capture;
   * USD: `usdBalanceNano`, the balance before the capture, less).
   */
  function chargeEntries(
    claimed: ClaimedReservation,
    parts: StoredSplit['parts'],
    balances: { diemStakeNano: bigint; usdBalanceNano: bigint; diemUsedNano: bigint },
    at: number,
  ): NewEntry[] {
    let diemUsed = balances.diemUsedNano;
    let usdBalance = balances.usdBalanceNano;
    const values: NewEntry[] = [];
    // One literal of one shape per entry (no spreads: they copy through the runtime and give every entry its
    // own hidden class), in entryValues' column order.
    const entry = (
      item: StoredItem,
      currency: Currency,
      amountNano: bigint,
      afterNano: bigint,
    ): NewEntry => ({
      id: randomId(),
      api_key_id: claimed.api_key_id,
      reservation_id: claimed.id,
      request_id: claimed.request_id,
      model_id: item.modelId ?? claimed.model_id,
      sku: item.sku,
      units: item.units,
      unit_price_nano: item.unitPriceNano,
      details: item.details,
      network: null,
      tx_hash: null,
      created_at_ms: at,
      account_id: claimed.account_id,
      type: 'CHARGE',
      currency,
      amount_nano: amountNano,
      balance_after_nano: afterNano,
    });
    for (const { item, diem, usd } of parts) {
      if (diem > 0n) {
        diemUsed += diem;
        values.push(entry(item, 'DIEM', -diem, maxBig(0n, balances.diemStakeNano - diemUsed)));
      }
      if (usd > 0n) {
        usdBalance -= usd;
        values.push(entry(item, 'USD', -usd, usdBalance));
      }
    }
    return values;
  }

  /** Writes the CHARGE entries of a claimed reservation's split (chargeEntries). */
  async function writeCharges(
    trx: Transaction<Tables>,
    claimed: ClaimedReservation,
    parts: StoredSplit['parts'],
    balances: { diemStakeNano: bigint; usdBalanceNano: bigint },
    at: number,
  ): Promise<LedgerEntry[]> {
    // The day's DIEM counters matter only for DIEM entries, which need a DIEM part.
    const diemUsedNano =
      claimed.diem_nano > 0n
        ? (await diemUsage(trx, claimed.account_id, toNumber(claimed.epoch_day))).usedNano
        : 0n;
    return insertEntries(trx, chargeEntries(claimed, parts, extend(balances, { diemUsedNano }), at));
  }

  /** What a capture returns, from its split and the entries it wrote. */
  function captured(split: StoredSplit, entries: LedgerEntry[]): CaptureResult {
    const amounts = amountsOf(split);
    return {
      entries,
      usdNano: amounts.usdNano,
      diemNano: amounts.diemNano,
      requestedNano: amounts.requestedNano,
      clamped: amounts.clamped,
    };
  }

  /** Why a reservation could not be claimed: NotFoundError, or ReservationStateError with its status. */
  async function refuseClaim(trx: Transaction<Tables>, reservationId: string): Promise<never> {
    const current = await trx
      .selectFrom('reservations')
      .select('status')
      .where('id', '=', reservationId)
      .executeTakeFirst();
    if (!current) throw new NotFoundError('reservation', reservationId);
    // Still held, so the claim's figures were not the stored ones (captureWith's caller passed others).
    if (current.status === 'held') throw notAsStored();
    throw new ReservationStateError(reservationId, current.status);
  }

  /**
   * The reservation transaction of `reserve` and `reserveWith`: the account row locked first, then the
   * caller's `within` (if any), then the checks and the hold. Eager (group-commit.ts): the request waits on
   * it before its work.
   */
  async function reserveIn<T>(
    input: ReserveInput,
    within?: ReserveWithin<T>,
  ): Promise<ReserveResult & { within: T | undefined }> {
    assertAmount('amountNano', input.amountNano);
    if (!Number.isSafeInteger(input.ttlMs) || input.ttlMs <= 0) {
      throw new InvalidInputError('ttlMs', 'ttlMs must be a positive integer');
    }
    if (!input.requestId) throw new InvalidInputError('requestId', 'requestId is required');
    const at = now();
    const epochDay = epochDayOf(at);
    const apiKeyId = input.apiKeyId ?? null;
    if (dialect === 'postgres' && (!within || within.embedded)) {
      const writes = within?.embedded?.writes;
      // Batchable when it is one prepared statement (reserveAtOnce): not the script of a key with a spend
      // limit or of a caller's writes, which runs on a connection of its own.
      const reserved = await atAccountRow(
        input.accountId,
        (q) => reserveAtOnce(q, input, apiKeyId, at, writes),
        holdsInOneStatement(input, apiKeyId, writes),
      );
      if (reserved) return extend(reserved, { within: within?.embedded?.result });
    }
    if (holdsInMemory && (!within || within.now) && !keyLimited(input, apiKeyId)) {
      const held = holdNow(input, apiKeyId, at, within?.now);
      if (held) return held;
    }
    // A hold made in memory in the transaction below, let go of should the transaction not commit.
    let inMemory: Reservation | undefined;
    try {
      return await reserveRows(input, within, at, epochDay, apiKeyId, (reservation) => {
        inMemory = reservation;
      });
    } catch (error) {
      if (inMemory) memory?.forget(inMemory);
      throw error;
    }
  }

  /**
   * SQLite, holding in memory: a reservation of free USD (no DIEM stake on the account; no key, or one without
   * spend limits) made at once, with no transaction, when none is open on the connection (Database.readNow):
   * the account (and key) read as last committed, checked and held in the same turn, so that nothing commits or
   * holds in between. A capture lets its hold go only once it has committed, so what is read never misses a
   * charge whose hold is gone. The caller's part (`within`, ReserveWithin.now) is decided in that turn too,
   * after the account is read and before the checks, as the transaction's runs. Undefined when it cannot (a
   * transaction open, a DIEM stake, a key's limits, the caller's part): the transaction of `reserveRows`
   * decides.
   */
  function holdNow<T>(
    input: ReserveInput,
    apiKeyId: string | null,
    at: number,
    within?: () => T | undefined,
  ): (ReserveResult & { within: T | undefined }) | undefined {
    if (!memory || !database.readNow) return undefined;
    let account: AccountFigures | undefined;
    // Whether the key charged is the account's (its limits are looked at below); true without one.
    let keyFound = true;
    if (apiKeyId === null) {
      const rows = database.readNow((runner) => selectAccountLocked(runner, input.accountId));
      if (!rows) return undefined;
      [account] = rows;
    } else {
      const rows = database.readNow((runner) => selectAccountWithKey(runner, input.accountId, apiKeyId));
      if (!rows) return undefined;
      const [row] = rows;
      if (row && (row.key_limit_usd_nano !== null || row.key_limit_diem_nano !== null)) return undefined;
      keyFound = row !== undefined && row.key_id !== null && row.key_limit_period !== null;
      account = row;
    }
    if (!account) throw new NotFoundError('account', input.accountId);
    if (account.diem_stake_nano !== 0n) return undefined;
    // The caller's part, then the checks, in the order of reserveRows': the balance, then the key.
    const extra = within?.();
    if (within && extra === undefined) return undefined;
    const balance = balanceOf(withHeld(account, memory.usdOf(input.accountId)), {
      usedNano: 0n,
      reservedNano: 0n,
    });
    if (input.amountNano > balance.usdAvailableNano) throw insufficient(input.amountNano, balance);
    if (!keyFound && apiKeyId !== null) throw new NotFoundError('api key', apiKeyId);
    const reservation = heldReservation(input, apiKeyId, input.amountNano, 0n, at);
    memory.hold(reservation);
    numberHold(database, input.accountId);
    return {
      reservation,
      before: balanceBefore(balance),
      availableNano: balance.usdAvailableNano - input.amountNano,
      stamp: changeStamp ? accountStamp(database, changeStamp, input.accountId) : undefined,
      within: extra,
    };
  }

  /**
   * The transaction of `reserveIn`: the account row locked first, then the caller's `within` (if any), then
   * the checks and the hold: in memory (`heldInMemory` told of it) for USD alone when the ledger holds there,
   * else its row and the account's reserved sums.
   */
  function reserveRows<T>(
    input: ReserveInput,
    within: ReserveWithin<T> | undefined,
    at: number,
    epochDay: number,
    apiKeyId: string | null,
    heldInMemory: (reservation: Reservation) => void,
  ): Promise<ReserveResult & { within: T | undefined }> {
    return database.transaction(async (trx) => {
      // One statement: the account row, locked, with the limits of the key (when one is charged).
      const { account, key } =
        apiKeyId === null
          ? { account: await lockAccount(trx, input.accountId), key: undefined }
          : await lockAccountWithKey(trx, input.accountId, apiKeyId);
      const extra = within ? await within(trx) : undefined;
      // Without a DIEM stake nothing can be drawn from DIEM: the day's counters need not be read.
      const usage =
        account.diem_stake_nano > 0n
          ? await diemUsage(trx, input.accountId, epochDay)
          : { usedNano: 0n, reservedNano: 0n };
      // What this process holds in memory for the account is reserved too (held-reservations.ts).
      const balance = balanceOf(withHeld(account, memory?.usdOf(input.accountId) ?? 0n), usage);
      const diemPart = minBig(input.amountNano, balance.diemAvailableNano);
      const usdPart = input.amountNano - diemPart;
      if (usdPart > balance.usdAvailableNano) throw insufficient(input.amountNano, balance);
      if (apiKeyId !== null) {
        if (!key) throw new NotFoundError('api key', apiKeyId);
        if (key.limit_usd_nano !== null || key.limit_diem_nano !== null) {
          const spent = await keySpendOn(trx, apiKeyId, periodStartMs(key.limit_period, at), true);
          const checks = [
            { currency: 'USD' as const, limit: key.limit_usd_nano, spent: spent.usdNano, part: usdPart },
            {
              currency: 'DIEM' as const,
              limit: key.limit_diem_nano,
              spent: spent.diemNano,
              part: diemPart,
            },
          ];
          for (const check of checks) {
            if (check.limit !== null && check.part > 0n && check.spent + check.part > check.limit) {
              throw new KeySpendLimitError({
                apiKeyId,
                currency: check.currency,
                period: key.limit_period,
                limitNano: check.limit,
                spentNano: check.spent,
                requestedNano: check.part,
              });
            }
          }
        }
      }
      const reservation = heldReservation(input, apiKeyId, usdPart, diemPart, at);
      if (holdsInMemory && diemPart === 0n) {
        // In the same turn as the check above: nothing else holds for the account in between.
        memory?.hold(reservation);
        heldInMemory(reservation);
      } else {
        await writeReservation(trx, reservation, 'held', null);
        if (usdPart > 0n) await addReserved(trx, usdPart, input.accountId);
        await bumpDiem(trx, input.accountId, epochDay, { reservedNano: diemPart });
      }
      if (changeStamp) numberHold(database, input.accountId);
      const certain =
        changeStamp !== undefined &&
        account.diem_stake_nano === 0n &&
        (key === undefined || (key.limit_usd_nano === null && key.limit_diem_nano === null));
      return {
        reservation,
        before: balanceBefore(balance),
        availableNano: balance.usdAvailableNano - usdPart + balance.diemAvailableNano - diemPart,
        stamp: certain ? accountStamp(database, changeStamp, input.accountId) : undefined,
        within: extra,
      };
    }, EAGER);
  }

  const ledger = {
    /** The account's balances at `at` (today's DIEM figures are for the UTC day of `at`). */
    async getBalance(accountId: string, at: number = now()): Promise<Balance> {
      // One statement: the account and its DIEM counters of the day.
      const [row] = await selectBalance(db, epochDayOf(at), accountId);
      if (!row) throw new NotFoundError('account', accountId);
      return balanceOfRow(row, memory?.usdOf(accountId));
    },

    /**
     * Credits USD as one TOP_UP entry. With `network` and `txHash` it is credited at most once per payment,
     * also under concurrency and across processes: a repeat returns `credited: false` and the first entry.
     */
    async topUp(input: TopUpInput): Promise<TopUpResult> {
      assertAmount('amountNano', input.amountNano);
      if (input.amountNano === 0n) throw new InvalidInputError('amountNano', 'amountNano must be positive');
      const network = input.network ?? null;
      const txHash = input.txHash ?? null;
      if ((network === null) !== (txHash === null)) {
        throw new InvalidInputError('txHash', 'network and txHash go together');
      }
      const findPayment = async (q: Executor) =>
        network === null || txHash === null
          ? undefined
          : q
              .selectFrom('ledger_entries')
              .selectAll()
              .where('network', '=', network)
              .where('tx_hash', '=', txHash)
              .executeTakeFirst();
      const at = now();
      try {
        return await database.transaction(async (trx) => {
          const account = await lockAccount(trx, input.accountId);
          const existing = await findPayment(trx);
          if (existing) {
            const entry = toLedgerEntry(existing);
            await input.onRecorded?.(trx, entry);
            return { entry, credited: false };
          }
          const balanceAfter = account.usd_balance_nano + input.amountNano;
          const [entry] = await insertEntries(trx, [
            entryValues(
              {
                account_id: input.accountId,
                type: 'TOP_UP',
                currency: 'USD',
                amount_nano: input.amountNano,
                balance_after_nano: balanceAfter,
                request_id: input.requestId ?? null,
                details: input.note ? JSON.stringify({ note: input.note }) : null,
                network,
                tx_hash: txHash,
              },
              at,
            ),
          ]);
          await trx
            .updateTable('accounts')
            .set((eb) => ({ usd_balance_nano: eb('usd_balance_nano', '+', input.amountNano) }))
            .where('id', '=', input.accountId)
            .execute();
          if (!entry) throw new StorageError('STORAGE_FAILURE', 'Top-up entry was not written');
          await input.onRecorded?.(trx, entry);
          return { entry, credited: true };
        });
      } catch (error) {
        // The same payment credited concurrently to another account: the unique index refused this one.
        if (isUniqueViolation(error)) {
          const existing = await findPayment(db);
          if (existing) {
            const entry = toLedgerEntry(existing);
            await input.onRecorded?.(db, entry);
            return { entry, credited: false };
          }
        }
        throw error;
      }
    },

    /**
     * Holds the worst-case cost of a request: the DIEM part up to today's free allowance, the rest from free
     * USD. Throws InsufficientBalanceError when both cannot cover it, KeySpendLimitError when the key's cap for
     * its period (charges plus held reservations) would be passed, NotFoundError for an unknown account or key.
     */
    async reserve(input: ReserveInput): Promise<ReserveResult> {
      const { reservation, before, availableNano, stamp } = await reserveIn(input);
      return { reservation, before, availableNano, stamp };
    },

    /**
     * SQLite: whether nothing that could lower what the account may hold has happened since the reservation of
     * it stamped `stamp` (ReserveResult.stamp). Undefined on PostgreSQL, which cannot tell.
     */
    unchangedSince: changeStamp
      ? (accountId: string, stamp: string): boolean =>
          accountStamp(database, changeStamp, accountId) === stamp
      : undefined,

    /**
     * Charges the real cost of a held reservation and releases the rest. The total is capped at the
     * reservation (`clamped` says so). DIEM is spent first, then USD, item by item; each (item, currency) with
     * a non-zero amount becomes one CHARGE entry. Throws ReservationStateError (and changes nothing) when the
     * reservation is not held any more.
     */
    async capture(reservationId: string, input: CaptureInput): Promise<CaptureResult> {
      // Held in memory: captured as captureWith does (the figures are the held ones).
      const held = memory?.get(reservationId);
      if (held) return ledger.captureWith(held, input);
      const items = captureItems(input);
      const at = now();
      return database.transaction(async (trx) => {
        // The reservation's account, locked first as every writer does, found in the same statement.
        const [account] = await selectReservationAccount(trx, reservationId);
        if (!account) throw new NotFoundError('reservation', reservationId);
        // Claimed by a conditional update: it locks the row and proves it was still held, in one statement.
        // Should anything below fail, the transaction rolls the claim back with the rest.
        const [reservation] = await claimReservation(trx, at, reservationId);
        if (!reservation) return refuseClaim(trx, reservationId);

        const split = splitCharge(items, reservation.usd_nano, reservation.diem_nano);
        const entries = await writeCharges(
          trx,
          reservation,
          split.parts,
          { diemStakeNano: account.diem_stake_nano, usdBalanceNano: account.usd_balance_nano },
          at,
        );
        if (split.usdCharged > 0n || reservation.usd_nano > 0n) {
          await settleAccount(trx, split.usdCharged, reservation.usd_nano, reservation.account_id);
        }
        await bumpDiem(trx, reservation.account_id, toNumber(reservation.epoch_day), {
          usedNano: split.diemCharged,
          reservedNano: -reservation.diem_nano,
        });
        return captured(split, entries);
      });
    },

    /**
     * Gives a held reservation back in full. Idempotent: `released: false` when it was already captured,
     * released or expired (a handler's cleanup may race the expiry sweep).
     */
    async release(reservationId: string): Promise<ReleaseResult> {
      const at = now();
      const released = await settleHeld(reservationId, 'released', at);
      if (released !== NOT_HELD) return { released: true, reservation: released };
      return database.transaction(async (trx) => {
        const { changed, row } = await settleReservation(trx, reservationId, 'released', at);
        return { released: changed, reservation: toReservation(row) };
      });
    },

    /**
     * Expires every held reservation whose expiry is at or before `at` (crash recovery: a process died between
     * reserve and capture). Each one is settled in its own transaction with a conditional update, so sweeps
     * on several processes never double-release. Returns how many this call expired.
     */
    async expireReservations(at: number = now()): Promise<number> {
      let count = 0;
      for (const due of memory?.due(at) ?? []) {
        if ((await settleHeld(due.id, 'expired', at)) !== NOT_HELD) count++;
      }
      for (;;) {
        const due = await db
          .selectFrom('reservations')
          .select('id')
          .where('status', '=', HELD)
          .where('expires_at_ms', '<=', at)
          .orderBy('expires_at_ms')
          .limit(200)
          .execute();
        if (due.length === 0) return count;
        for (const { id } of due) {
          const { changed } = await database.transaction((trx) => settleReservation(trx, id, 'expired', at));
          if (changed) count++;
        }
      }
    },

    /** Returns a reservation, or throws NotFoundError. */
    async getReservation(reservationId: string): Promise<Reservation> {
      const held = memory?.get(reservationId);
      if (held) return held;
      const row = await db
        .selectFrom('reservations')
        .selectAll()
        .where('id', '=', reservationId)
        .executeTakeFirst();
      if (!row) throw new NotFoundError('reservation', reservationId);
      return toReservation(row);
    },

    /**
     * Gives back everything a request was charged: one REFUND entry per currency, at most once (a repeat
     * returns `refunded: false` and the first refund's entries). A DIEM refund goes back to the allowance of the
     * day it was drawn from. The charges are those of `chargeSeqs` with the request's id (RefundInput). Throws
     * NothingToRefundError when there are none on the account.
     */
    async refund(input: RefundInput): Promise<RefundResult> {
      try {
        return await refundOnce(input);
      } catch (error) {
        // Unreachable while every writer takes the account lock; the partial unique index is the backstop.
        if (!isUniqueViolation(error)) throw error;
        const previous = await refundEntries(db, input);
        if (previous.length === 0) throw error;
        return { entries: previous, refunded: false };
      }
    },

    /** The account's entries, newest first (for history pages). */
    async listEntries(accountId: string, input: ListEntriesInput = {}): Promise<LedgerEntry[]> {
      const limit = checkLimit(input.limit ?? 50, 1000);
      const offset = input.offset ?? 0;
      if (!Number.isSafeInteger(offset) || offset < 0) throw new InvalidInputError('offset', 'Bad offset');
      const rows = await db
        .selectFrom('ledger_entries')
        .selectAll()
        .where('account_id', '=', accountId)
        .orderBy('seq', 'desc')
        .limit(limit)
        .offset(offset)
        .execute();
      return rows.map(toLedgerEntry);
    },

    /** The account's entries in ledger order after a cursor, for billing exports and cursor pagination. */
    async listEntriesSince(accountId: string, input: ListEntriesSinceInput = {}): Promise<LedgerEntry[]> {
      const limit = checkLimit(input.limit ?? 100, 10_000);
      let query = db.selectFrom('ledger_entries').selectAll().where('account_id', '=', accountId);
      if (input.afterSeq !== undefined) query = query.where('seq', '>', input.afterSeq);
      if (input.startMs !== undefined) query = query.where('created_at_ms', '>=', input.startMs);
      if (input.endMs !== undefined) query = query.where('created_at_ms', '<', input.endMs);
      if (input.currency !== undefined) query = query.where('currency', '=', input.currency);
      if (input.types !== undefined && input.types.length > 0) query = query.where('type', 'in', input.types);
      const rows = await query.orderBy('seq').limit(limit).execute();
      return rows.map(toLedgerEntry);
    },

    /** Number of entries matching the same filters as `listEntriesSince` (without the cursor). */
    async countEntries(
      accountId: string,
      input: Omit<ListEntriesSinceInput, 'afterSeq' | 'limit'> = {},
    ): Promise<number> {
      let query = db
        .selectFrom('ledger_entries')
        .select((eb) => eb.fn.countAll<number | bigint>().as('n'))
        .where('account_id', '=', accountId);
      if (input.startMs !== undefined) query = query.where('created_at_ms', '>=', input.startMs);
      if (input.endMs !== undefined) query = query.where('created_at_ms', '<', input.endMs);
      if (input.currency !== undefined) query = query.where('currency', '=', input.currency);
      if (input.types !== undefined && input.types.length > 0) query = query.where('type', 'in', input.types);
      return toNumber((await query.executeTakeFirstOrThrow()).n);
    },

    /**
     * Gross spend (CHARGE entries) in [startMs, endMs), summed by UTC day, model, SKU and key. Amounts are
     * positive; `requests` counts distinct request ids.
     */
    async usageSummary(accountId: string, input: { startMs: number; endMs: number }): Promise<UsageSummary> {
      const day = sql<number | bigint>`created_at_ms / ${sql.lit(DAY_MS)}`;
      const base = () =>
        db
          .selectFrom('ledger_entries')
          .where('account_id', '=', accountId)
          .where('type', '=', 'CHARGE')
          .where('created_at_ms', '>=', input.startMs)
          .where('created_at_ms', '<', input.endMs);
      const amounts = [
        sql<string | bigint | null>`sum(case when currency = 'USD' then -amount_nano else 0 end)`.as('usd'),
        sql<string | bigint | null>`sum(case when currency = 'DIEM' then -amount_nano else 0 end)`.as('diem'),
        sql<number | bigint>`count(distinct request_id)`.as('requests'),
      ] as const;
      const toAmounts = (row: {
        usd: string | bigint | null;
        diem: string | bigint | null;
        requests: number | bigint;
      }) => ({
        usdNano: toBigInt(row.usd),
        diemNano: toBigInt(row.diem),
        requests: toNumber(row.requests),
      });
      const bySpend = (a: UsageAmounts, b: UsageAmounts) => {
        const diff = b.usdNano + b.diemNano - (a.usdNano + a.diemNano);
        return diff > 0n ? 1 : diff < 0n ? -1 : 0;
      };
      const [totals, days, models, skus, keys] = await Promise.all([
        base().select(amounts).executeTakeFirstOrThrow(),
        base()
          .select([day.as('day'), ...amounts])
          .groupBy(day)
          .orderBy(day)
          .execute(),
        base()
          .select(['model_id', ...amounts])
          .groupBy('model_id')
          .execute(),
        base()
          .select(['sku', ...amounts])
          .groupBy('sku')
          .execute(),
        base()
          .select(['api_key_id', ...amounts])
          .groupBy('api_key_id')
          .execute(),
      ]);
      return {
        totals: toAmounts(totals),
        byDay: days.map((row) => ({ day: isoDay(toNumber(row.day)), ...toAmounts(row) })),
        byModel: models.map((row) => ({ modelId: row.model_id, ...toAmounts(row) })).sort(bySpend),
        bySku: skus.map((row) => ({ sku: row.sku, ...toAmounts(row) })).sort(bySpend),
        byKey: keys.map((row) => ({ apiKeyId: row.api_key_id, ...toAmounts(row) })).sort(bySpend),
      };
    },

    /**
     * A key's net spend (charges minus refunds) since `sinceMs`; with `includeHeld`, plus its held
     * reservations, which is what the spend limits are checked against.
     */
    async keySpend(apiKeyId: string, input: { sinceMs: number; includeHeld?: boolean }): Promise<KeySpend> {
      return keySpendOn(db, apiKeyId, input.sinceMs, input.includeHeld ?? false);
    },

    /**
     * Ledger-wide totals for metrics: USD held and reserved across accounts (a scan of the accounts, not of
     * the entries, whose number grows with every request ever charged: the money the entries moved is counted
     * by each process as it writes them, LedgerOptions.onEntries).
     */
    async totals(): Promise<LedgerTotals> {
      const held = await db
        .selectFrom('accounts')
        .select((eb) => [
          eb.fn.sum<string | bigint | null>('usd_balance_nano').as('usd'),
          eb.fn.sum<string | bigint | null>('usd_reserved_nano').as('reserved'),
        ])
        .executeTakeFirstOrThrow();
      return {
        usdBalanceNano: toBigInt(held.usd),
        usdReservedNano: toBigInt(held.reserved) + (memory?.total() ?? 0n),
      };
    },

    /** Start of the key-limit period containing `at` (EPOCH: the UTC day, MONTH: the UTC month, LIFETIME: 0). */
    periodStart: periodStartMs,

    /**
     * `reserve` with the caller's own statements in the same transaction, so that what admits a request and
     * its hold cost one round trip: `within` runs once the account row is locked (serialised with every other
     * writer of the account, on any number of processes) and before the hold is decided; what it throws
     * refuses the reservation and rolls back whatever it wrote. Same checks, errors and result as `reserve`.
     * On PostgreSQL, with `within.embedded`, a reservation of free USD and those writes are one round trip
     * (reserveAtOnce); only when that round trip refuses does the transaction run (and `within` with it).
     */
    async reserveWith<T>(
      input: ReserveInput,
      within: ReserveWithin<T>,
    ): Promise<ReserveResult & { within: T }> {
      return (await reserveIn(input, within)) as ReserveResult & { within: T };
    },

    /**
     * `capture` of a reservation as `reserve` returned it, with the caller's own statements (`within`, run
     * last) in the same transaction. Knowing the reservation's figures saves the statements that look them up:
     * on PostgreSQL the account row is locked by the update that settles it (its RETURNING gives the balance
     * the entries record; it skips a reservation already seen settled), then the conditional claim proves the
     * reservation was still held with exactly those figures. On SQLite (one writer at a time, no row locks to
     * order) the claim comes first, with the figures in its WHERE, and proves them by what it changed; then the
     * update settles the account and gives the balance. Otherwise it throws (ReservationStateError when it is
     * not held, StorageError when it is held with other figures; on PostgreSQL a sweep settling it at that very
     * moment may instead surface as the accounts CHECK refusing the update) and the transaction undoes
     * everything.
     * Same split (DIEM first, then USD, item by item), entries and result as `capture`. On PostgreSQL a
     * reservation of USD only is captured by one statement (captureAtOnce), `within` included when it comes as
     * a write that statement can make (`within.embedded`), else run after it in one transaction; only what that
     * statement could not capture goes through the transaction above.
     */
    async captureWith<T>(
      reservation: Reservation,
      input: CaptureInput,
      within?: CaptureWithin<T>,
    ): Promise<CaptureResult> {
      // The split needs only the reservation's figures: computed before the transaction.
      const split = splitCharge(captureItems(input), reservation.usdNano, reservation.diemNano);
      const at = now();
      if (dialect === 'postgres' && reservation.diemNano === 0n && split.usdCharged > 0n) {
        try {
          // `within` as a write of the one statement when it has that form; else in a transaction with it.
          const entries =
            within && !within.embedded
              ? await database.transaction(async (trx) => {
                  const written = await captureAtOnce(trx, reservation, split, at);
                  await within(trx, written);
                  return written;
                })
              : await atAccountRow(
                  reservation.accountId,
                  (q) => captureAtOnce(q, reservation, split, at, within?.embedded),
                  true,
                );
          return captured(split, entries);
        } catch (error) {
          if (!(error instanceof NotAtOnce)) throw error;
        }
      }
      if (memory?.get(reservation.id)) {
        // Held in memory: its row is written by the capture, settled (held-reservations.ts).
        const outcome = await memory.settle(reservation.id, (stored) => {
          if (!sameFigures(stored, reservation)) throw notAsStored();
          return captureHeld(reservation, split, at, within);
        });
        if (outcome !== NOT_HELD) return outcome;
      }
      return captureIn(reservation, split, at, within, false);
    },
  };

  /** A capture of a reservation held in memory, gathered with the others of its turn (captureHeld). */
  type HeldCapture = {
    reservation: Reservation;
    split: StoredSplit;
    at: number;
    within: CaptureWithin<unknown> | undefined;
    resolve(result: CaptureResult): void;
    reject(error: unknown): void;
  };
  /** The captures gathered for the group's function that is to write them, until it starts (or is full). */
  let gathering: HeldCapture[] | undefined;

  /**
   * `captureIn` of a reservation of USD held in memory, gathered with the others asked for before the commit
   * group's turn (up to GROUP_COMMIT_MAX) and written by one function of the group (writeHeldCaptures): the
   * same rows, entries and results as their captures one after the other, with each account settled and read
   * once and every entry in one statement, where each capture was a function of its own (a savepoint, five
   * statements). Under load a group held about four chats' captures (bench/HISTORY.md, forty-sixth and
   * forty-ninth rounds). Should the function fail (its writes undone), each capture is written again alone, as
   * `captureIn` writes it, so that one that cannot be written fails alone; should the group's commit fail,
   * each fails with it, as a function of its own would. A reservation with DIEM goes through `captureIn` (its
   * day's counters).
   */
  function captureHeld<T>(
    reservation: Reservation,
    split: StoredSplit,
    at: number,
    within: CaptureWithin<T> | undefined,
  ): Promise<CaptureResult> {
    if (reservation.diemNano !== 0n) return captureIn(reservation, split, at, within, true);
    return new Promise<CaptureResult>((resolve, reject) => {
      const capture: HeldCapture = {
        reservation,
        split,
        at,
        within: within as CaptureWithin<unknown> | undefined,
        resolve,
        reject,
      };
      if (gathering) {
        gathering.push(capture);
        if (gathering.length >= GROUP_COMMIT_MAX) gathering = undefined;
        return;
      }
      const batch = [capture];
      gathering = batch;
      // Whether the function itself failed (a statement, a `within`), not the group's commit after it.
      let failedWriting = false;
      database
        .transaction(async (trx) => {
          // Captures asked for from now on go to the next function.
          if (gathering === batch) gathering = undefined;
          try {
            return await writeHeldCaptures(trx, batch);
          } catch (error) {
            failedWriting = true;
            throw error;
          }
        })
        .then(
          (results) => {
            for (let i = 0; i < batch.length; i++)
              (batch[i] as HeldCapture).resolve(results[i] as CaptureResult);
          },
          (error: unknown) => {
            // A failed commit fails each capture, as it fails each function of the group; a function that
            // failed is written again capture by capture, so that only the capture that cannot be fails.
            if (!failedWriting || batch.length === 1) for (const c of batch) c.reject(error);
            else
              for (const c of batch)
                captureIn(c.reservation, c.split, c.at, c.within, true).then(c.resolve, c.reject);
          },
        );
    });
  }

  /** The rows of the batch's reservations, written captured, in one statement in the batch's order. */
  async function writeCapturedRows(trx: Transaction<Tables>, batch: readonly HeldCapture[]): Promise<void> {
    const values: unknown[] = [];
    for (const { reservation, at } of batch) reservationValues(values, reservation, 'captured', at);
    await insertReservations(batch.length)(trx, ...values);
  }

  /**
   * The captures of `batch` (reservations of USD held in memory) in one function of a commit group, in the
   * order of `captureIn`'s statements: the reservations' rows written captured (the entries refer to them);
   * each account settled by the USD its captures charged and its balances read, once; every entry in one
   * statement, each with the balance left after it as if the captures had run one after the other in `batch`'s
   * order (so also their `seq`s), and the keys' spend; then each capture's `within`, in that order.
   */
  async function writeHeldCaptures(
    trx: Transaction<Tables>,
    batch: readonly HeldCapture[],
  ): Promise<CaptureResult[]> {
    await writeCapturedRows(trx, batch);
    // By account: the USD its captures charge, then its balance before the first of them and its stake.
    const accounts = new Map<string, { charged: bigint; balance: bigint; stake: bigint }>();
    for (const c of batch) {
      const account = accounts.get(c.reservation.accountId);
      if (account) account.charged += c.split.usdCharged;
      else accounts.set(c.reservation.accountId, { charged: c.split.usdCharged, balance: 0n, stake: 0n });
    }
    for (const [accountId, account] of accounts) {
      if (account.charged > 0n) await settleAccount(trx, account.charged, 0n, accountId);
      const [row] = await selectSettled(trx, accountId);
      if (!row) throw new NotFoundError('account', accountId);
      // The update above already took the USD charged off it.
      account.balance = row.usd_balance_nano + account.charged;
      account.stake = row.diem_stake_nano;
    }
    const entries: NewEntry[] = [];
    const counts: number[] = [];
    for (const c of batch) {
      const account = accounts.get(c.reservation.accountId) as { balance: bigint; stake: bigint };
      const own = chargeEntries(
        claimedAs(c.reservation),
        c.split.parts,
        { diemStakeNano: account.stake, usdBalanceNano: account.balance, diemUsedNano: 0n },
        c.at,
      );
      account.balance -= c.split.usdCharged;
      counts.push(own.length);
      for (const entry of own) entries.push(entry);
    }
    const written = await insertEntries(trx, entries);
    const results: CaptureResult[] = [];
    let from = 0;
    for (let i = 0; i < batch.length; i++) {
      const c = batch[i] as HeldCapture;
      const own = written.slice(from, from + (counts[i] as number));
      from += counts[i] as number;
      if (c.within) await c.within(trx, own);
      results.push(captured(c.split, own));
    }
    return results;
  }

  /**
   * The transaction of `captureWith` (see there); `fromMemory`, of a reservation held in memory, whose row it
   * writes captured (held-reservations.ts) where the others' is claimed.
   */
  function captureIn<T>(
    reservation: Reservation,
    split: StoredSplit,
    at: number,
    within: CaptureWithin<T> | undefined,
    fromMemory: boolean,
  ): Promise<CaptureResult> {
    const { usdCharged, diemCharged } = split;
    // What the account's reserved sum gives back: nothing for a hold in memory.
    const releasedNano = fromMemory ? 0n : reservation.usdNano;
    const settlesUsd = usdCharged > 0n || releasedNano > 0n;
    return database.transaction(async (trx) => {
      let account: { usd_balance_nano: bigint; diem_stake_nano: bigint } | undefined;
      let row: ClaimedReservation | undefined;
      if (fromMemory || dialect === 'sqlite') {
        if (fromMemory) {
          // Its row, written settled before the entries, which refer to it.
          await writeReservation(trx, reservation, 'captured', at);
        } else {
          // One writer at a time: the claim comes first and proves the figures by what it changed.
          const claim = await claimAsStored(
            trx,
            at,
            reservation.id,
            reservation.accountId,
            reservation.usdNano,
            reservation.diemNano,
            reservation.epochDay,
          );
          if (claim.numAffectedRows !== 1n) return refuseClaim(trx, reservation.id);
        }
        row = claimedAs(reservation);
        if (settlesUsd) await settleAccount(trx, usdCharged, releasedNano, reservation.accountId);
        [account] = await selectSettled(trx, reservation.accountId);
        if (!account) throw new NotFoundError('account', reservation.accountId);
      } else {
        // The account row first, as every writer locks it: here by the update that settles the USD figures.
        [account] = settlesUsd
          ? await settleAccountReturning(
              trx,
              usdCharged,
              reservation.usdNano,
              reservation.accountId,
              reservation.id,
            )
          : [await lockAccount(trx, reservation.accountId)];
        [row] = account ? await claimReservation(trx, at, reservation.id) : [];
        if (!account || !row) return refuseClaim(trx, reservation.id);
        if (
          row.account_id !== reservation.accountId ||
          row.usd_nano !== reservation.usdNano ||
          row.diem_nano !== reservation.diemNano ||
          toNumber(row.epoch_day) !== reservation.epochDay
        ) {
          throw notAsStored();
        }
      }
      const entries = await writeCharges(
        trx,
        row,
        split.parts,
        {
          diemStakeNano: account.diem_stake_nano,
          // The balance before this capture: the update above already took the USD charged off it.
          usdBalanceNano: account.usd_balance_nano + usdCharged,
        },
        at,
      );
      await bumpDiem(trx, reservation.accountId, reservation.epochDay, {
        usedNano: diemCharged,
        reservedNano: -reservation.diemNano,
      });
      if (within) await within(trx, entries);
      return captured(split, entries);
    });
  }

  const { onEntries } = options;
  if (!onEntries) return ledger;
  // The methods that write entries, told of them once their transaction is committed (their own results).
  return extend(ledger, {
    async topUp(input: TopUpInput): Promise<TopUpResult> {
      const result = await ledger.topUp(input);
      if (result.credited) onEntries([result.entry]);
      return result;
    },
    async capture(reservationId: string, input: CaptureInput): Promise<CaptureResult> {
      const result = await ledger.capture(reservationId, input);
      onEntries(result.entries);
      return result;
    },
    async captureWith<T>(
      reservation: Reservation,
      input: CaptureInput,
      within?: CaptureWithin<T>,
    ): Promise<CaptureResult> {
      const result = await ledger.captureWith(reservation, input, within);
      onEntries(result.entries);
      return result;
    },
    async refund(input: RefundInput): Promise<RefundResult> {
      const result = await ledger.refund(input);
      if (result.refunded) onEntries(result.entries);
      return result;
    },
  });
}
