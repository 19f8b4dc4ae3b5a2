/**
 * The same Arazzo workflows as the integration suite, run by Redocly Respect against the mock: every step's
 * status code, content type and response schema must hold. The journeys' value checks (balances, replays) are
 * warnings here, since the mock answers with the spec's examples rather than real state.
 */
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
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
      },
      severity: { SUCCESS_CRITERIA_CHECK: 'warn' },
    });
    expect(result.failedSteps, result.output).toEqual([]);
    expect(result.passedSteps.length, result.output).toBeGreaterThan(0);
    expect(result.code, result.output).toBe(0);
  });
});
