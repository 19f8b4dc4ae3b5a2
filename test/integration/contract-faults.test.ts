/**
 * Seeded faults on the server side, caught by the validating typed client and the coverage gate: a removed
 * handler (the operation answers 501, which no operation documents) and a handler whose response field has
 * another type (our own response validation off, so the body leaves the server as written).
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ContractViolationError } from '../../client/index.ts';
import { contractOperations, coverageReport } from '../../scripts/contract-coverage.ts';
import { startTestApp, type TestApp } from '../support/app.ts';
import { contractValidation, validatingClient } from '../support/client-validation.ts';
import { loadBundle } from '../support/contract.ts';

const doc = loadBundle();
let app: TestApp;

beforeAll(async () => {
  app = await startTestApp({
    env: { VALIDATE_RESPONSES: 'false' },
    // listModels is removed; listModelTraits answers `data` with another type.
    handlers: {
      listModelTraits: async () => ({
        status: 200,
        body: { object: 'list', type: 'text', data: ['default'] } as never,
      }),
      listImageStyles: async () => ({ status: 200, body: { object: 'list', data: ['Anime'] } }),
    },
  });
});

afterAll(async () => {
  await app?.close();
});

describe('seeded server faults', () => {
  const validation = contractValidation(doc, { record: false });
  const client = () => validatingClient({ baseUrl: app.url }, validation);

  test('behavior: a handler within the contract passes', async () => {
    const { data } = await client().GET('/image/styles');
    expect(data?.data).toEqual(['Anime']);
  });

  test('fault: removing a handler fails the validating client (501 is documented nowhere) and the coverage gate', async () => {
    const error = await client()
      .GET('/models')
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractViolationError);
    expect((error as ContractViolationError).problems).toEqual(['status 501 is not declared for listModels']);
    const report = coverageReport(contractOperations(doc as never), ['listModels\t501']);
    expect(report.uncalled).toContain('listModels');
    expect(report.undeclared).toEqual(['listModels 501']);
  });

  test('fault: a response field of another type fails the validating client', async () => {
    const error = await client()
      .GET('/models/traits')
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractViolationError);
    expect((error as ContractViolationError).problems.join('\n')).toMatch(/^body\/data must be object/m);
  });
});
