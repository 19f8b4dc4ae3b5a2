/**
 * Migration 0023_check_comparisons: the CHECKs of SQLite's tables without IN lists.
 *
 * SQLite codes `"status" in ('held', 'captured', 'released', 'expired')`, a list of more than two constants,
 * as an ephemeral table that the check builds every time it runs: a B-tree opened with a page cache of its own,
 * a zeroed 4 KB page, a row per constant, then closed. Each reservation and each capture ran one (the status),
 * and each ledger entry another (its type): about 65,000 of the 1.52 million instructions a chat cost, and
 * 8 KB of fresh pages per entry through a first-level cache of 48 KB (bench/HISTORY.md, thirty-seventh round).
 * Written as comparisons, `("status" = 'held' or "status" = 'captured' or ...)`, the check is a few opcodes;
 * it holds for exactly the same values (NULL included: both give NULL, which a CHECK lets through).
 *
 * A CHECK cannot be changed in place, so each table whose text has such a list is made again
 * (https://sqlite.org/lang_altertable.html#otheralter): with foreign keys off (they cannot change inside a
 * transaction), in one transaction, its new text under a temporary name, every row copied, the old table
 * dropped, the new one renamed, its indexes and triggers made again from their own texts, its AUTOINCREMENT
 * counter kept, and `foreign_key_check` run before the commit. What refers to a table refers to it by name, and
 * the name is the same. PostgreSQL evaluates such a list without building anything: it is left as it is.
 *
 * New tables write their enumerations as comparisons from the start (`oneOf` in migrations.ts).
 */
import { type Kysely, type Migration, sql } from 'kysely';
import type { Dialect } from './database.ts';

/** A string literal of SQL: quotes, with a quote inside doubled. */
const LITERAL = "'(?:[^']|'')*'";
const LITERALS = new RegExp(LITERAL, 'g');
/**
 * A whole CHECK that tests one column (quoted or bare) against a list of string literals, as the migrations up
 * to 0022 wrote them: `check ("status" in ('held', ...))`. Nothing else is matched (a `not in`, a list inside a
 * larger expression), so nothing else can be rewritten wrongly; such a check would keep its table.
 */
const IN_LIST_CHECK = new RegExp(
  String.raw`check \(("[A-Za-z_][A-Za-z0-9_]*"|[A-Za-z_][A-Za-z0-9_]*) in \((${LITERAL}(?:\s*,\s*${LITERAL})*)\)\)`,
  'gi',
);

/**
 * A table's text with each `check (column in ('a', 'b', 'c'))` of three or more strings written as
 * `check ((column = 'a' or column = 'b' or column = 'c'))`; shorter lists (which SQLite already codes as
 * comparisons) and everything else as it was.
 */
export function withoutInLists(text: string): string {
  return text.replace(IN_LIST_CHECK, (whole, column: string, list: string) => {
    const values = list.match(LITERALS) ?? [];
    if (values.length < 3) return whole;
    return `check ((${values.map((value) => `${column} = ${value}`).join(' or ')}))`;
  });
}

type SchemaRow = { type: string; name: string; sql: string };

export function checkComparisons(dialect: Dialect): Migration {
  return {
    async up(db: Kysely<unknown>) {
      if (dialect === 'postgres') return;
      const { rows: tables } = await sql<SchemaRow>`select type, name, sql from sqlite_master
        where type = 'table' and sql is not null and name not like 'sqlite_%' order by name`.execute(db);
      const changed = tables.filter((table) => withoutInLists(table.sql) !== table.sql);
      if (changed.length === 0) return;
      await sql`pragma foreign_keys = off`.execute(db);
      try {
        await db.transaction().execute(async (trx) => {
          for (const table of changed) await remake(trx, table);
          const { rows: broken } = await sql`pragma foreign_key_check`.execute(trx);
          if (broken.length > 0) {
            throw new Error(`foreign_key_check found ${broken.length} rows without their parent`);
          }
        });
      } finally {
        await sql`pragma foreign_keys = on`.execute(db);
      }
    },
  };
}

/** `table` made again from its text without IN lists, as the header says. */
async function remake(db: Kysely<unknown>, table: SchemaRow) {
  const { name } = table;
  const temporary = `${name}__remade`;
  const head = new RegExp(`^CREATE TABLE ("${name}"|${name}) `, 'i');
  if (!head.test(table.sql)) throw new Error(`unexpected text of table ${name}: ${table.sql.slice(0, 80)}`);
  const remade = withoutInLists(table.sql).replace(head, `CREATE TABLE "${temporary}" `);
  const { rows: dependents } = await sql<SchemaRow>`select type, name, sql from sqlite_master
    where tbl_name = ${name} and type in ('index', 'trigger') and sql is not null order by name`.execute(db);
  const { rows: counters } = await sql<{ seq: number | bigint }>`select seq from sqlite_sequence
    where name = ${name}`
    .execute(db)
    .catch(() => ({ rows: [] as { seq: number | bigint }[] }));

  await sql.raw(remade).execute(db);
  await sql`insert into ${sql.table(temporary)} select * from ${sql.table(name)}`.execute(db);
  await sql`drop table ${sql.table(name)}`.execute(db);
  await sql`alter table ${sql.table(temporary)} rename to ${sql.table(name)}`.execute(db);
  for (const dependent of dependents) await sql.raw(dependent.sql).execute(db);
  // AUTOINCREMENT never gives a number again, even one whose row is gone: the counter goes on from where it was.
  for (const { seq } of counters) {
    await sql`delete from sqlite_sequence where name = ${name}`.execute(db);
    await sql`insert into sqlite_sequence (name, seq) values (${name}, ${seq})`.execute(db);
  }
}
