/**
 * The opcodes of the program SQLite compiles for a statement (`EXPLAIN`), its `?` parameters bound to NULL:
 * what the tests read to tell whether a statement builds a table of its own at every run (`OpenEphemeral`,
 * `SorterOpen`, `OpenAutoindex`; bench/HISTORY.md, thirty-seventh round).
 */
import { CompiledQuery, type QueryResult } from 'kysely';

/** What runs a compiled statement: a database's Kysely instance or a transaction. */
type Runner = { executeQuery<R>(query: CompiledQuery<R>): Promise<QueryResult<R>> };

export async function sqliteOpcodes(db: Runner, text: string): Promise<string[]> {
  const nulls = [...text.matchAll(/\?/g)].map(() => null);
  const { rows } = await db.executeQuery<{ opcode: string }>(CompiledQuery.raw(`explain ${text}`, nulls));
  return rows.map((op) => op.opcode);
}
