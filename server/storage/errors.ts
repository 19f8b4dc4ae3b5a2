/**
 * Typed storage errors. One base class keeps `cause` and a short, stable message; `code` is what callers
 * switch on (the HTTP layer maps codes to statuses). Messages never contain secrets or connection strings.
 */

export type StorageErrorCode =
  | 'STORAGE_CONFIG'
  | 'STORAGE_FAILURE'
  | 'MIGRATION_FAILED'
  | 'NOT_FOUND'
  | 'INVALID_INPUT'
  | 'INSUFFICIENT_BALANCE'
  | 'KEY_SPEND_LIMIT'
  | 'RESERVATION_STATE'
  | 'NOTHING_TO_REFUND';

export type StorageErrorOptions = { cause?: unknown };

/** Base class of every error the storage layer throws on purpose. */
export class StorageError extends Error {
  override name = 'StorageError';
  readonly code: StorageErrorCode;

  constructor(code: StorageErrorCode, message: string, options: StorageErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
  }
}

/** The database URL or options cannot be used. */
export class StorageConfigError extends StorageError {
  override name = 'StorageConfigError';
  constructor(message: string, options: StorageErrorOptions = {}) {
    super('STORAGE_CONFIG', message, options);
  }
}

/** Running the migrations failed; `cause` holds the driver error. */
export class MigrationError extends StorageError {
  override name = 'MigrationError';
  readonly migrationName: string | undefined;
  constructor(migrationName: string | undefined, options: StorageErrorOptions = {}) {
    super(
      'MIGRATION_FAILED',
      migrationName ? `Migration ${migrationName} failed` : 'Migrations failed',
      options,
    );
    this.migrationName = migrationName;
  }
}

export type EntityName = 'account' | 'api key' | 'reservation' | 'ledger entry';

/** A row the caller named does not exist. */
export class NotFoundError extends StorageError {
  override name = 'NotFoundError';
  readonly entity: EntityName;
  readonly id: string;
  constructor(entity: EntityName, id: string, options: StorageErrorOptions = {}) {
    super('NOT_FOUND', `Unknown ${entity}`, options);
    this.entity = entity;
    this.id = id;
  }
}

/** A value a repository received breaks its contract (negative amount, bad limit, …). */
export class InvalidInputError extends StorageError {
  override name = 'InvalidInputError';
  readonly field: string;
  constructor(field: string, message: string, options: StorageErrorOptions = {}) {
    super('INVALID_INPUT', message, options);
    this.field = field;
  }
}

export type InsufficientBalanceDetails = {
  requiredNano: bigint;
  usdAvailableNano: bigint;
  diemAvailableNano: bigint;
};

/** The account's DIEM allowance plus free USD cannot cover a reservation. Nothing was reserved. */
export class InsufficientBalanceError extends StorageError {
  override name = 'InsufficientBalanceError';
  readonly requiredNano: bigint;
  readonly usdAvailableNano: bigint;
  readonly diemAvailableNano: bigint;
  constructor(details: InsufficientBalanceDetails) {
    super('INSUFFICIENT_BALANCE', 'Insufficient balance');
    this.requiredNano = details.requiredNano;
    this.usdAvailableNano = details.usdAvailableNano;
    this.diemAvailableNano = details.diemAvailableNano;
  }
}

export type Currency = 'USD' | 'DIEM';
export type LimitPeriod = 'EPOCH' | 'MONTH' | 'LIFETIME';

export type KeySpendLimitDetails = {
  apiKeyId: string;
  currency: Currency;
  period: LimitPeriod;
  limitNano: bigint;
  spentNano: bigint;
  requestedNano: bigint;
};

/** The reservation would take the key's spend in its current period past its cap. Nothing was reserved. */
export class KeySpendLimitError extends StorageError {
  override name = 'KeySpendLimitError';
  readonly apiKeyId: string;
  readonly currency: Currency;
  readonly period: LimitPeriod;
  readonly limitNano: bigint;
  readonly spentNano: bigint;
  readonly requestedNano: bigint;
  constructor(details: KeySpendLimitDetails) {
    super('KEY_SPEND_LIMIT', `API key ${details.currency} spend limit exceeded`);
    this.apiKeyId = details.apiKeyId;
    this.currency = details.currency;
    this.period = details.period;
    this.limitNano = details.limitNano;
    this.spentNano = details.spentNano;
    this.requestedNano = details.requestedNano;
  }
}

export type ReservationStatus = 'held' | 'captured' | 'released' | 'expired';

/** The reservation is no longer held (captured, released or expired), so it cannot be captured. */
export class ReservationStateError extends StorageError {
  override name = 'ReservationStateError';
  readonly reservationId: string;
  readonly status: ReservationStatus;
  constructor(reservationId: string, status: ReservationStatus) {
    super('RESERVATION_STATE', `Reservation is ${status}`);
    this.reservationId = reservationId;
    this.status = status;
  }
}

/** A refund named a request that has no charges on the account. */
export class NothingToRefundError extends StorageError {
  override name = 'NothingToRefundError';
  readonly requestId: string;
  constructor(requestId: string) {
    super('NOTHING_TO_REFUND', 'Nothing to refund for this request');
    this.requestId = requestId;
  }
}
