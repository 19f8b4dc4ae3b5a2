/**
 * Small helpers shared by the repositories: value conversions that make both engines return the same domain
 * types, UTC day arithmetic for the DIEM epoch and key limit periods, and driver error classification.
 */
import { randomUUID } from 'node:crypto';
import type { Compilable, CompiledQuery, QueryResult } from 'kysely';
import { InvalidInputError } from './errors.ts';

export const DAY_MS = 86_400_000;

/** What every repository factory accepts: a clock and an id source, injectable in tests. */
export type RepositoryOptions = {
  now?: () => number;
  randomId?: () => string;
};

export function resolveOptions(options: RepositoryOptions = {}): Required<RepositoryOptions> {
  return { now: options.now ?? Date.now, randomId: options.randomId ?? randomUUID };
}

/** An integer column as a JS number (SQLite gives bigint, PostgreSQL number or bigint). */
export function toNumber(value: number | bigint | string): number {
  const result = Number(value);
  if (!Number.isSafeInteger(result)) throw new RangeError(`Not a safe integer: ${String(value)}`);
  return result;
}

export function toNumberOrNull(value: number | bigint | string | null): number | null {
  return value === null ? null : toNumber(value);
}

/**
 * A money value as bigint. Aggregates differ by engine: SUM(bigint) is NUMERIC (a string) on PostgreSQL and
 * an integer (bigint with safe integers) on SQLite; NULL (no rows) is zero.
 */
export function toBigInt(value: number | bigint | string | null | undefined): bigint {
  if (value === null || value === undefined) return 0n;
  if (typeof value === 'bigint') return value;
  if (typeof value === 'number') return BigInt(value);
  // NUMERIC sums of integers print without a fraction, but be strict about it.
  const text = value.trim();
  if (!/^-?\d+(\.0+)?$/.test(text)) throw new RangeError(`Not an integer amount: ${text}`);
  return BigInt(text.replace(/\.0+$/, ''));
}

export function minBig(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}

export function maxBig(a: bigint, b: bigint): bigint {
  return a > b ? a : b;
}

/** The UTC day number (days since 1970-01-01) of a time; the DIEM allowance resets when it changes. */
export function epochDayOf(ms: number): number {
  return Math.floor(ms / DAY_MS);
}

/** `YYYY-MM-DD` of a UTC day number. */
export function isoDay(epochDay: number): string {
  return new Date(epochDay * DAY_MS).toISOString().slice(0, 10);
}

/** Start (inclusive, epoch ms) of the key limit period that contains `ms`. */
export function periodStartMs(period: 'EPOCH' | 'MONTH' | 'LIFETIME', ms: number): number {
  if (period === 'EPOCH') return epochDayOf(ms) * DAY_MS;
  if (period === 'MONTH') {
    const date = new Date(ms);
    return Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1);
  }
  return 0;
}

/** True for a unique or primary-key violation from either driver. */
export function isUniqueViolation(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false;
  const code = (error as { code?: unknown }).code;
  return code === '23505' || code === 'SQLITE_CONSTRAINT_UNIQUE' || code === 'SQLITE_CONSTRAINT_PRIMARYKEY';
}

/** Throws InvalidInputError unless `value` is a bigint >= 0. */
export function assertAmount(field: string, value: bigint): void {
  if (typeof value !== 'bigint') throw new InvalidInputError(field, `${field} must be a bigint`);
  if (value < 0n) throw new InvalidInputError(field, `${field} must not be negative`);
}

/** What runs a compiled statement: the Kysely instance or a transaction of it. */
export type StatementRunner = { executeQuery<R>(query: CompiledQuery<R>): Promise<QueryResult<R>> };

/**
 * A hot statement that Kysely builds and compiles once (per repository, so per dialect) and then runs with
 * new values: building and compiling a query on every call was about a fifth of a chat request's CPU.
 * `build` receives one stand-in per value and must only place them (no logic on them): each stand-in becomes
 * a parameter of the compiled statement, replaced by the call's value. The SQL text sent is the one Kysely
 * compiles, so prepared-statement caches, the statement counts of the round-trip test and the PostgreSQL
 * types are unchanged.
 */
export function compiledOnce<Row, A extends unknown[]>(
  build: (...values: A) => Compilable<Row>,
): (runner: StatementRunner, ...values: A) => Promise<Row[]> {
  let template: { compiled: CompiledQuery<Row>; slots: (number | undefined)[] } | undefined;
  return async (runner, ...values) => {
    if (!template) {
      const standIns = values.map((_, index) => ({ standIn: index }));
      const compiled = build(...(standIns as unknown as A)).compile();
      const slots = compiled.parameters.map((parameter) => {
        const index = standIns.indexOf(parameter as { standIn: number });
        return index < 0 ? undefined : index;
      });
      if (standIns.some((_, index) => !slots.includes(index)))
        throw new Error(`compiledOnce: a value was not compiled to a parameter in ${compiled.sql}`);
      template = { compiled, slots };
    }
    const { compiled, slots } = template;
    const parameters = compiled.parameters.map((fixed, i) => {
      const slot = slots[i];
      return slot === undefined ? fixed : values[slot];
    });
    return (await runner.executeQuery<Row>({ ...compiled, parameters })).rows;
  };
}
