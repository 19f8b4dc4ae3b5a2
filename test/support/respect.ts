/**
 * Runs Arazzo workflows (test/workflows/*.arazzo.yaml) with Redocly Respect against a running server: every
 * step's status and response schema are checked against the contract by Respect itself, plus the workflow's
 * own success criteria. Asynchronous, so a server in the same process keeps answering while Respect runs.
 */
import { execFile } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './contract.ts';

export type RespectResult = { code: number; output: string; failedSteps: string[]; passedSteps: string[] };

export async function runWorkflows(
  file: string,
  options: {
    server: string;
    inputs?: Record<string, string>;
    workflows?: string[];
    timeoutMs?: number;
    /** Check severities, e.g. `{ SUCCESS_CRITERIA_CHECK: 'warn' }` for the mock (it answers with examples). */
    severity?: Record<string, 'error' | 'warn' | 'off'>;
  },
): Promise<RespectResult> {
  const jsonOut = join(tmpdir(), `respect-${process.pid}-${Date.now()}.json`);
  const args = [
    'respect',
    join(repoRoot, 'test', 'workflows', file),
    '--server',
    `api=${options.server}`,
    '--json-output',
    jsonOut,
    '--max-fetch-timeout',
    String(options.timeoutMs ?? 30_000),
  ];
  for (const [name, value] of Object.entries(options.inputs ?? {})) args.push('--input', `${name}=${value}`);
  for (const workflow of options.workflows ?? []) args.push('--workflow', workflow);
  if (options.severity) args.push('--severity', JSON.stringify(options.severity));
  const { code, output } = await new Promise<{ code: number; output: string }>((resolve) => {
    execFile(
      join(repoRoot, 'node_modules', '.bin', 'redocly'),
      args,
      {
        cwd: repoRoot,
        timeout: 300_000,
        maxBuffer: 32 * 1024 * 1024,
        env: { ...process.env, NO_COLOR: '1' },
      },
      (error, stdout, stderr) => {
        const status = error ? (typeof error.code === 'number' ? error.code : 1) : 0;
        resolve({ code: status, output: `${stdout}\n${stderr}` });
      },
    );
  });
  const failedSteps: string[] = [];
  const passedSteps: string[] = [];
  try {
    const report = JSON.parse(readFileSync(jsonOut, 'utf8')) as {
      files?: Record<
        string,
        {
          executedWorkflows?: {
            executedSteps?: { stepId: string; checks?: { passed: boolean; severity?: string }[] }[];
          }[];
        }
      >;
    };
    for (const fileReport of Object.values(report.files ?? {})) {
      for (const workflow of fileReport.executedWorkflows ?? []) {
        for (const step of workflow.executedSteps ?? []) {
          // A failed check at severity `warn` (or `off`) does not fail the step.
          const failed = step.checks?.some((c) => !c.passed && (c.severity ?? 'error') === 'error');
          (failed ? failedSteps : passedSteps).push(step.stepId);
        }
      }
    }
  } catch {
    // No report: the output says why.
  } finally {
    rmSync(jsonOut, { force: true });
  }
  return { code, output, failedSteps, passedSteps };
}
