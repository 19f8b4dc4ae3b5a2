/**
 * Small helpers shared by the repositories: value conversions that make both engines return the same domain
 * types, UTC day arithmetic for the DIEM epoch and key limit periods, driver error classification, the
 * default id source (time-ordered UUIDs) and statements compiled once.
 */
import { createHash, randomFillSync } from 'node:crypto';
import { type Compilable, CompiledQuery, type QueryResult, type RawBuilder } from 'kysely';
import pg from 'pg';
import type { Database } from './database.ts';
import { InvalidInputError } from './errors.ts';

export const DAY_MS = 86_400_000;

/** What every repository factory accepts: a clock and an id source, injectable in tests. */
export type RepositoryOptions = {
  now?: () => number;
  randomId?: () => string;
};

export function resolveOptions(options: RepositoryOptions = {}): Required<RepositoryOptions> {
  const now = options.now ?? Date.now;
  return { now, randomId: options.randomId ?? timeOrderedIds(now) };
}

const HEX = Array.from({ length: 256 }, (_, byte) => byte.toString(16).padStart(2, '0'));
const hexOf = (byte: number | undefined) => HEX[byte as number] as string;
/** 2^26: the ids one millisecond holds before the next one is borrowed. */
const COUNTER_SPAN = 0x4000000;
const MAX_MS = 2 ** 48 - 1;

/**
 * A source of time-ordered ids (RFC 9562 UUIDv7, lowercase): 48 bits of the clock's milliseconds, the version
 * nibble 7, a 26-bit counter (12 bits before the variant bits `10`, 14 after), then 48 random bits. New rows
 * of a table keyed by these ids land at the end of its primary-key B-tree (and of the indexes that lead with
 * the id) instead of on a random leaf: the inserts of one commit group share that last leaf instead of
 * dirtying one leaf each, and the pages an insert needs stay in the cache however large the table grows.
 *
 * Ids of one source are strictly increasing: within a millisecond (or when the clock steps back) the counter
 * counts on from the previous id; each new millisecond starts it at a random value below 2^25, so ids from
 * several processes in the same millisecond still differ in 73 random bits. After at least 2^25 ids in one
 * millisecond the source takes the next millisecond early (RFC 9562, 6.2). The randomness is node:crypto's,
 * drawn in blocks; ids reveal the millisecond their row was created, which every such row also stores.
 */
export function timeOrderedIds(
  clock: () => number = Date.now,
  /** How many counter values one millisecond holds: a power of two up to 2^26 (tests lower it). */
  counterSpan = COUNTER_SPAN,
): () => string {
  if (!Number.isInteger(Math.log2(counterSpan)) || counterSpan < 2 || counterSpan > COUNTER_SPAN)
    throw new RangeError('counterSpan must be a power of two from 2 to 2^26');
  const seedMask = counterSpan / 2 - 1;
  const pool = Buffer.allocUnsafe(10 * 256);
  let offset = pool.length;
  let lastMs = -1;
  let counter = 0;
  return () => {
    if (offset === pool.length) {
      randomFillSync(pool);
      offset = 0;
    }
    let ms = Math.min(MAX_MS, Math.max(0, Math.floor(clock())));
    if (ms > lastMs) {
      // A fresh start below half the span: room for 2^25 more ids in this millisecond.
      counter = pool.readUInt32BE(offset) & seedMask;
    } else {
      ms = lastMs;
      counter++;
      if (counter === counterSpan) {
        ms = Math.min(MAX_MS, lastMs + 1);
        counter = pool.readUInt32BE(offset) & seedMask;
      }
    }
    lastMs = ms;
    const high = Math.floor(ms / 0x100000000);
    const low = ms % 0x100000000;
    const r = offset + 4;
    offset += 10;
    return (
      hexOf((high >>> 8) & 0xff) +
      hexOf(high & 0xff) +
      hexOf(low >>> 24) +
      hexOf((low >>> 16) & 0xff) +
      '-' +
      hexOf((low >>> 8) & 0xff) +
      hexOf(low & 0xff) +
      '-' +
      hexOf(0x70 | (counter >>> 22)) +
      hexOf((counter >>> 14) & 0xff) +
      '-' +
      hexOf(0x80 | ((counter >>> 8) & 0x3f)) +
      hexOf(counter & 0xff) +
      '-' +
      hexOf(pool[r]) +
      hexOf(pool[r + 1]) +
      hexOf(pool[r + 2]) +
      hexOf(pool[r + 3]) +
      hexOf(pool[r + 4]) +
      hexOf(pool[r + 5])
    );
  };
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

/**
 * A write of a caller's made by another repository's statement (PostgreSQL: a data-modifying CTE of it), so
 * that both cost one round trip and commit or fail together. `guard` names a CTE of that statement with one row
 * when the write is to happen and none otherwise; the write selects from it, and returns a row when it wrote
 * (none when its own condition refused), so that a further write can be guarded by it in turn.
 */
export type EmbeddedWrite = (guard: RawBuilder<unknown>) => RawBuilder<unknown>;

/**
 * A compiled PostgreSQL statement as text with its values written in as literals (pg's escapeLiteral for text,
 * digits for integers, `null`), for a script of several statements sent as one query: PostgreSQL's simple query
 * protocol, the only one that carries several, carries no parameters. `$n` placeholders are the compiler's own
 * (the statements written for scripts hold no `$` otherwise); values of any other type are refused.
 */
export function withLiterals(query: CompiledQuery): string {
  return query.sql.replace(/\$(\d+)/g, (_, n: string) => literal(query.parameters[Number(n) - 1]));
}

/** A value as a PostgreSQL literal: text, integers and null (see withLiterals). */
function literal(value: unknown): string {
  if (typeof value === 'string') return pg.escapeLiteral(value);
  if (typeof value === 'bigint' || (typeof value === 'number' && Number.isSafeInteger(value)))
    return String(value);
  if (value === null) return 'null';
  throw new InvalidInputError('parameter', `a script takes text, integers and null, not ${typeof value}`);
}

/**
 * PostgreSQL: the script of `head` (statements as text, their values written in: withLiterals) then
 * `statement`, sent as one query (one round trip, one implicit transaction). The simple query protocol, the
 * only one that carries several statements, has no prepared statements of its own, so `statement` is a
 * SQL-level one: `PREPARE`d once per connection, then run as `execute name(values)` (measured on the JSON-RPC
 * reservation: 0.35 to 0.52 ms instead of 0.72). A connection that does not know the name yet answers 26000, having
 * written nothing; it prepares it and the script runs again. Should the statement not be preparable (not
 * marked by `prepared`, or refused), or the name still be unknown after preparing it (a pooler that moves
 * sessions between statements), the script carries the statement as text; so it does at once on a database
 * whose statements go as text (Database.prepares false).
 */
export async function scriptThenPrepared<R>(
  database: Pick<Database, 'db' | 'prepares'>,
  head: string,
  statement: CompiledQuery<R>,
): Promise<R[]> {
  const { db } = database;
  // The statement as text: written only when it is sent so (no name, or the name cannot be used).
  const asText = () => `${head};\n${withLiterals(statement)}`;
  const name = database.prepares ? preparedName(prepared(statement).sql) : undefined;
  if (!name) return (await db.executeQuery(CompiledQuery.raw(asText()))).rows as R[];
  const values = statement.parameters.map(literal).join(', ');
  const executed = `${head};\nexecute ${name}_s${values ? `(${values})` : ''}`;
  return db.connection().execute(async (connection) => {
    const run = async (text: string) => (await connection.executeQuery(CompiledQuery.raw(text))).rows as R[];
    // The rows, or undefined when this connection does not know the name (26000: nothing was written).
    const execute = () =>
      run(executed).catch((error: unknown) => {
        if ((error as { code?: unknown } | null)?.code === '26000') return undefined;
        throw error;
      });
    const prepare = () =>
      run(`prepare ${name}_s as ${statement.sql}`).then(
        () => true,
        () => false,
      );
    return (await execute()) ?? ((await prepare()) ? await execute() : undefined) ?? run(asText());
  });
}

/** What runs a compiled statement: the Kysely instance or a transaction of it. */
export type StatementRunner = { executeQuery<R>(query: CompiledQuery<R>): Promise<QueryResult<R>> };

/**
 * PostgreSQL: the texts of the statements sent as prepared statements (named: each connection parses and plans
 * one once, not at every call; measured on a chat's capture: 0.75 ms instead of 1.0). Only hot statements of a
 * fixed text per shape are (compiledOnce's, and those passed to `prepared`), at most PREPARED_MAX texts, and
 * none that selects `*`: a column added by a later migration would make PostgreSQL refuse its cached plan.
 */
const preparedNames = new Map<string, string>();
const PREPARED_MAX = 256;

/** Marks a compiled statement as worth preparing on PostgreSQL (see preparedNames); returns it. */
export function prepared<Row>(compiled: CompiledQuery<Row>): CompiledQuery<Row> {
  const text = compiled.sql;
  if (preparedNames.size < PREPARED_MAX && !preparedNames.has(text) && !/select \*|\.\*/.test(text))
    preparedNames.set(text, `svc_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`);
  return compiled;
}

/** The name a statement of this text is prepared under (PostgreSQL), or undefined: sent unnamed. */
export function preparedName(text: string): string | undefined {
  return preparedNames.get(text);
}

/**
 * A hot statement that Kysely builds and compiles once (per repository, so per dialect) and then runs with
 * new values: building and compiling a query on every call was about a fifth of a chat request's CPU.
 * `build` receives one stand-in per value and must only place them (no logic on them): each stand-in becomes
 * a parameter of the compiled statement, replaced by the call's value. The SQL text sent is the one Kysely
 * compiles, so the statement counts of the round-trip test and the PostgreSQL types are unchanged; on
 * PostgreSQL it is sent as a prepared statement (`prepared`).
 */
export function compiledOnce<Row, A extends unknown[]>(
  build: (...values: A) => Compilable<Row>,
): (runner: StatementRunner, ...values: A) => Promise<Row[]> {
  const run = compiledOnceResult(build);
  return (runner, ...values) => run(runner, ...values).then(rowsOf);
}

const rowsOf = <Row>(result: QueryResult<Row>): Row[] => result.rows;

/** Whether a statement without RETURNING (`compiledOnceResult`) changed any row. */
export const changedAny = (result: { numAffectedRows?: bigint }): boolean =>
  (result.numAffectedRows ?? 0n) > 0n;

/**
 * `compiledOnce` answering the whole result: for a statement without RETURNING, what it changed
 * (`numAffectedRows`) and, for an insert on SQLite, the last rowid it gave (`insertId`).
 */
export function compiledOnceResult<Row, A extends unknown[]>(
  build: (...values: A) => Compilable<Row>,
): (runner: StatementRunner, ...values: A) => Promise<QueryResult<Row>> {
  let template: { compiled: CompiledQuery<Row>; slots: (number | undefined)[] } | undefined;
  return (runner, ...values) => {
    if (!template) {
      const standIns = values.map((_, index) => ({ standIn: index }));
      // A builder that fails rejects the call, as the statement's own failure does.
      try {
        const compiled = prepared(build(...(standIns as unknown as A)).compile());
        const slots = compiled.parameters.map((parameter) => {
          const index = standIns.indexOf(parameter as { standIn: number });
          return index < 0 ? undefined : index;
        });
        if (standIns.some((_, index) => !slots.includes(index)))
          throw new Error(`compiledOnce: a value was not compiled to a parameter in ${compiled.sql}`);
        template = { compiled, slots };
      } catch (error) {
        return Promise.reject(error);
      }
    }
    const { compiled, slots } = template;
    const parameters = compiled.parameters.map((fixed, i) => {
      const slot = slots[i];
      return slot === undefined ? fixed : values[slot];
    });
    // A literal of one shape (a spread copies through the runtime's slow path, once per statement).
    const query: CompiledQuery<Row> = {
      query: compiled.query,
      queryId: compiled.queryId,
      sql: compiled.sql,
      parameters,
    };
    return runner.executeQuery<Row>(query);
  };
}
