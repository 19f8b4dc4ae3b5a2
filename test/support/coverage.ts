/**
 * Contract coverage of the test suites: every real server a test starts (not the fake-port apps of
 * test/support/app.ts) records each answered request as
 * `operationId <TAB> status` into `coverage/contract/` (one file per test process), and the typed client with
 * contract validation on records each validated response as `operationId <TAB> status <TAB> client`. `npm run coverage:contract`
 * (the last step of `npm test`) compares the records with the operations and documented statuses of
 * `generated/openapi.yaml`: it fails if an operation was never called, and reports the documented statuses the
 * suites never produced.
 */
import { appendFileSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { AppDeps } from '../../server/app.ts';
import type { Metrics } from '../../server/observability/metrics.ts';
import { repoRoot } from './contract.ts';

export const COVERAGE_DIR = join(repoRoot, 'coverage', 'contract');
const file = join(COVERAGE_DIR, `${process.pid}-${Math.random().toString(36).slice(2)}.tsv`);

/** Removes the records of an earlier run (the integration project's global setup calls it). */
export function resetCoverage(): void {
  rmSync(COVERAGE_DIR, { recursive: true, force: true });
  mkdirSync(COVERAGE_DIR, { recursive: true });
}

function record(operation: string, status: number, source?: 'client'): void {
  const line = source ? `${operation}\t${status}\t${source}\n` : `${operation}\t${status}\n`;
  try {
    appendFileSync(file, line);
  } catch {
    mkdirSync(COVERAGE_DIR, { recursive: true });
    appendFileSync(file, line);
  }
}

/**
 * Records a response the typed client received and validated (`operationId <TAB> status <TAB> client`): the
 * coverage gate counts an operation as exercised only through these (test/support/client-validation.ts).
 */
export function recordClientCall(operation: string, status: number): void {
  record(operation, status, 'client');
}

/** Wraps the app's metrics so that every answered operation is also recorded for the coverage report. */
export function recordingMetrics(metrics: Metrics): Metrics {
  return {
    ...metrics,
    observeRequest(operation, status, seconds) {
      if (operation && operation !== 'unmatched') record(operation, status);
      metrics.observeRequest(operation, status, seconds);
    },
  };
}

export function withCoverage(app: AppDeps): AppDeps {
  return { ...app, metrics: recordingMetrics(app.metrics) };
}
