/**
 * The spec lint gate (`npm run lint:spec`, redocly.yaml) catches a dropped example: the contract's bundle
 * passes, and the same bundle with one response example removed fails with the rule that requires one on every
 * body (the mocks serve examples and the docs show them).
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { loadBundle, repoRoot } from '../support/contract.ts';

const dir = mkdtempSync(join(tmpdir(), 'lint-faults-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function lint(doc: unknown, name: string): Promise<{ code: number; output: string }> {
  const file = join(dir, name);
  writeFileSync(file, stringify(doc));
  return new Promise((resolve) => {
    execFile(
      join(repoRoot, 'node_modules', '.bin', 'redocly'),
      ['lint', file, '--config', join(repoRoot, 'redocly.yaml'), '--format=stylish'],
      { cwd: repoRoot, env: { ...process.env, NO_COLOR: '1' }, timeout: 120_000 },
      (error, stdout, stderr) =>
        resolve({
          code: error ? (typeof error.code === 'number' ? error.code : 1) : 0,
          output: `${stdout}${stderr}`,
        }),
    );
  });
}

describe('spec lint gate', () => {
  test('fault: dropping a response example fails the lint; the bundle as it is passes', {
    timeout: 120_000,
  }, async () => {
    const doc = loadBundle();
    const intact = await lint(doc, 'intact.yaml');
    expect(intact.code, intact.output).toBe(0);

    const dropped = structuredClone(doc) as unknown as {
      paths: Record<
        string,
        { get: { responses: Record<string, { content: Record<string, Record<string, unknown>> }> } }
      >;
    };
    const media = dropped.paths['/models/traits']?.get.responses['200']?.content['application/json'];
    expect(media?.examples ?? media?.example).toBeDefined();
    delete media?.examples;
    delete media?.example;
    const result = await lint(dropped, 'dropped.yaml');
    expect(result.code).not.toBe(0);
    expect(result.output).toContain('media-type-has-examples');
  });
});
