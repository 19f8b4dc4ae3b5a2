/** The storage layer: one Kysely code path over SQLite (embedded default) and PostgreSQL (shared, scale-out). */
export * from './accounts.ts';
export * from './api-keys.ts';
export * from './database.ts';
export * from './errors.ts';
export * from './idempotency.ts';
export type { RepositoryOptions } from './internal.ts';
export * from './ledger.ts';
export * from './migrations.ts';
export * from './rate-limits.ts';
export type { Tables } from './schema.ts';
