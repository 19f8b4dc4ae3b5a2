/**
 * The same Arazzo workflows as the integration suite, run by Redocly Respect against the mock: every step's
 * status code, content type and response schema must hold. The journeys' value checks (balances, replays) are
 * warnings here, since the mock answers with the spec's examples rather than real state.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse } from 'yaml';
import { type RunningMock, startMock } from '../../mocks/front.ts';
import { repoRoot } from '../support/contract.ts';
import { runWorkflows } from '../support/respect.ts';

const files = readdirSync(join(repoRoot, 'test', 'workflows')).filter((f) => f.endsWith('.arazzo.yaml'));
let mock: RunningMock;

beforeAll(async () => {
  mock = await startMock({ port: 0, log: () => {} });
});

afterAll(async () => {
  await mock?.close();
});

describe('workflows against the mock', () => {
  test('behavior: there are workflows to run', () => {
    expect(files.length).toBeGreaterThan(0);
  });

  test.each(files)('behavior: %s keeps the contract on the mock', async (file) => {
    const result = await runWorkflows(file, {
      server: mock.url,
      inputs: {
        apiKey: 'svc_inference_mockmockmockmockmockmockmockmockmockmockmock',
        idempotencyKey: 'mock-1',
        // The wallet journey's signed values: the mock accepts any credential and any payment header.
        wallet: '0x5268B7a3c9D1e2F4a6B8c0D2e4F6a8B0c2D43999',
        payment: Buffer.from('{"x402Version":2}').toString('base64'),
        signInBalance: 'mock-sign-in',
        signInChat: 'mock-sign-in',
        signInTransactions: 'mock-sign-in',
        signInBalanceAfter: 'mock-sign-in',
      },
      severity: { SUCCESS_CRITERIA_CHECK: 'warn' },
    });
    expect(result.failedSteps, result.output).toEqual([]);
    // Every step of every workflow ran and kept the contract.
    const workflows = (
      parse(readFileSync(join(repoRoot, 'test', 'workflows', file), 'utf8')) as {
        workflows: { steps: { stepId: string }[] }[];
      }
    ).workflows;
    expect(result.passedSteps, result.output).toEqual(workflows.flatMap((w) => w.steps.map((s) => s.stepId)));
    expect(result.code, result.output).toBe(0);
  });
});
