import { describe, expect, test } from 'vitest';
import { contractOperations, coverageReport } from '../../scripts/contract-coverage.ts';
import { loadBundle } from '../support/contract.ts';

const operations = contractOperations(loadBundle() as never);

describe('contract coverage report', () => {
  test('behavior: it lists every operation of the bundle with its documented statuses', () => {
    expect(operations.length).toBe(32);
    expect(operations.find((op) => op.operationId === 'listModels')?.declared).toContain('200');
  });

  test('behavior: uncalled operations, undeclared statuses and never-produced statuses are reported', () => {
    const report = coverageReport(operations, [
      'listModels\t200\tclient',
      'listModels\t200',
      'listModels\t401\tclient',
      'createSpeech\t501',
      '',
    ]);
    expect(report.uncalled).toContain('createChatCompletion');
    expect(report.uncalled).not.toContain('listModels');
    expect(report.undeclared).toEqual(['createSpeech 501']);
    const models = report.operations.find((row) => row.operationId === 'listModels');
    expect(models?.produced).toEqual({ '200': 1 });
    expect(models?.viaClient).toEqual({ '200': 1, '401': 1 });
    expect(models?.neverProduced).toContain('500');
    expect(models?.neverProduced).not.toContain('200');
    expect(models?.neverProduced).not.toContain('401');
  });

  test('fault: an operation answered only to fetch, never through the validating typed client, fails the gate', () => {
    const report = coverageReport(operations, ['listModels\t200', 'listModelTraits\t200\tclient']);
    expect(report.uncalled).toContain('listModels');
    expect(report.uncalled).not.toContain('listModelTraits');
    // A status the client saw but the contract does not document fails too.
    expect(coverageReport(operations, ['listModels\t418\tclient']).undeclared).toEqual(['listModels 418']);
  });
});
