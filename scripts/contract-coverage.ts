/**
 * Contract coverage report (`npm run coverage:contract`, the last step of `npm test`): reads what the
 * integration suites' servers answered (`coverage/contract/*.tsv`, written by test/support/coverage.ts) and
 * compares it with every operation and documented status of `generated/openapi.yaml`.
 *
 * Fails when an operation of the contract was never called through the generated typed client with response
 * validation on (records ending in `<TAB>client`, written by test/support/client-validation.ts), or when a
 * suite produced a status an operation does not document. Reports, without failing, the documented statuses
 * never produced (written to `coverage/contract-coverage.md` and `.json`); statuses seen by the server alone
 * (requests sent with fetch or an SDK) count there too.
 */
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const METHODS = ['get', 'put', 'post', 'delete', 'patch'] as const;

type Operation = { operationId: string; method: string; path: string; declared: string[] };

export type CoverageReport = {
  operations: Array<
    Operation & {
      produced: Record<string, number>;
      /** Statuses received through the typed client with validation on. */
      viaClient: Record<string, number>;
      neverProduced: string[];
    }
  >;
  /** Operations never called through the typed client with validation on (the gate). */
  uncalled: string[];
  undeclared: string[];
};

export function contractOperations(doc: { paths: Record<string, Record<string, unknown>> }): Operation[] {
  const operations: Operation[] = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method] as { operationId: string; responses: Record<string, unknown> } | undefined;
      if (op)
        operations.push({ operationId: op.operationId, method, path, declared: Object.keys(op.responses) });
    }
  }
  return operations;
}

function count(into: Map<string, Map<string, number>>, operationId: string, status: string): void {
  const counts = into.get(operationId) ?? new Map<string, number>();
  counts.set(status, (counts.get(status) ?? 0) + 1);
  into.set(operationId, counts);
}

/**
 * Compares the recorded lines with the contract: `operationId <TAB> status` (answered by a test server) and
 * `operationId <TAB> status <TAB> client` (received and validated by the typed client).
 */
export function coverageReport(operations: Operation[], lines: string[]): CoverageReport {
  const produced = new Map<string, Map<string, number>>();
  const viaClient = new Map<string, Map<string, number>>();
  for (const line of lines) {
    const [operationId, status, source] = line.split('\t');
    if (!operationId || !status) continue;
    count(source === 'client' ? viaClient : produced, operationId, status);
  }
  const undeclared: string[] = [];
  const rows = operations.map((op) => {
    const counts = produced.get(op.operationId) ?? new Map<string, number>();
    const client = viaClient.get(op.operationId) ?? new Map<string, number>();
    for (const status of new Set([...counts.keys(), ...client.keys()])) {
      // Including 501: an operation that is not built yet fails the report.
      if (!op.declared.includes(status)) undeclared.push(`${op.operationId} ${status}`);
    }
    return {
      ...op,
      produced: Object.fromEntries([...counts].sort()),
      viaClient: Object.fromEntries([...client].sort()),
      neverProduced: op.declared.filter((status) => !counts.has(status) && !client.has(status)),
    };
  });
  return {
    operations: rows,
    uncalled: rows.filter((row) => Object.keys(row.viaClient).length === 0).map((row) => row.operationId),
    undeclared,
  };
}

function markdown(report: CoverageReport): string {
  const lines = [
    '# Contract coverage of the test suites',
    '',
    '| operation | through the typed client, validated (count) | answered by the server (count) | documented, never produced |',
    '|---|---|---|---|',
  ];
  for (const row of report.operations) {
    const list = (counts: Record<string, number>) =>
      Object.entries(counts)
        .map(([status, n]) => `${status} (${n})`)
        .join(', ');
    lines.push(
      `| \`${row.method.toUpperCase()} ${row.path}\` ${row.operationId} | ${list(row.viaClient) || '**none**'} | ${list(row.produced)} | ${row.neverProduced.join(', ')} |`,
    );
  }
  return `${lines.join('\n')}\n`;
}

function main(): number {
  const doc = parse(readFileSync(join(root, 'generated', 'openapi.yaml'), 'utf8'));
  const dir = join(root, 'coverage', 'contract');
  if (!existsSync(dir)) {
    console.error(
      'coverage:contract: no records in coverage/contract/; run `npm run test:integration` first',
    );
    return 1;
  }
  const lines = readdirSync(dir)
    .filter((name) => name.endsWith('.tsv'))
    .flatMap((name) => readFileSync(join(dir, name), 'utf8').split('\n'));
  const report = coverageReport(contractOperations(doc), lines);
  writeFileSync(join(root, 'coverage', 'contract-coverage.json'), `${JSON.stringify(report, null, 2)}\n`);
  writeFileSync(join(root, 'coverage', 'contract-coverage.md'), markdown(report));
  const total = report.operations.reduce((sum, row) => sum + row.declared.length, 0);
  const never = report.operations.reduce((sum, row) => sum + row.neverProduced.length, 0);
  console.log(
    `coverage:contract: ${report.operations.length - report.uncalled.length}/${report.operations.length} operations called through the validating typed client; ` +
      `${total - never}/${total} documented statuses produced (see coverage/contract-coverage.md)`,
  );
  for (const row of report.operations) {
    if (row.neverProduced.length > 0)
      console.log(`  ${row.operationId}: never produced ${row.neverProduced.join(', ')}`);
  }
  let failed = false;
  if (report.uncalled.length > 0) {
    console.error(
      `coverage:contract: operations never called through the typed client with validation on: ${report.uncalled.join(', ')}`,
    );
    failed = true;
  }
  if (report.undeclared.length > 0) {
    console.error(
      `coverage:contract: statuses the contract does not document: ${report.undeclared.join(', ')}`,
    );
    failed = true;
  }
  return failed ? 1 : 0;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exit(main());
}
