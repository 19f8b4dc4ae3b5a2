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
      'listModels\t200',
      'listModels\t200',
      'createSpeech\t501',
      '',
    ]);
    expect(report.uncalled).toContain('createChatCompletion');
    expect(report.uncalled).not.toContain('listModels');
    expect(report.undeclared).toEqual(['createSpeech 501']);
    const models = report.operations.find((row) => row.operationId === 'listModels');
    expect(models?.produced).toEqual({ '200': 2 });
    expect(models?.neverProduced).toContain('500');
    expect(models?.neverProduced).not.toContain('200');
  });
});
