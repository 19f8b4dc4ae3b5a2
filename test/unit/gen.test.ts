import { execFileSync } from 'node:child_process';
import {
  appendFileSync,
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { diffDirs, quoteHexScalars } from '../../scripts/gen.ts';
import { repoRoot } from '../support/contract.ts';

const scratch = mkdtempSync(join(tmpdir(), 'gen-test-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** The check's own temporary directory, so that a test can see what it leaves behind there. */
const checkTmp = join(scratch, 'tmp');
mkdirSync(checkTmp);

function check(against: string): { status: number; output: string; leftBehind: string[] } {
  const run = (): { status: number; output: string } => {
    try {
      const output = execFileSync(
        process.execPath,
        ['--import', 'tsx', join(repoRoot, 'scripts', 'gen.ts'), '--check', '--against', against],
        { cwd: repoRoot, stdio: 'pipe', env: { ...process.env, TMPDIR: checkTmp } },
      ).toString();
      return { status: 0, output };
    } catch (error) {
      const e = error as { status: number; stderr: Buffer };
      return { status: e.status, output: e.stderr.toString() };
    }
  };
  const result = run();
  return { ...result, leftBehind: readdirSync(checkTmp).filter((name) => name.startsWith('gen-check-')) };
}

describe('quoteHexScalars', () => {
  test('behavior: plain 0x scalars become quoted strings; numbers, quoted values and prose stay as they are', () => {
    const text = [
      '  data: 0x08c379a0',
      "  result: '0x2105'",
      '  - 0xdeadbeef',
      '  amount: 42',
      '  note: paid 0x12 twice',
    ].join('\n');
    expect(quoteHexScalars(text)).toBe(
      [
        "  data: '0x08c379a0'",
        "  result: '0x2105'",
        "  - '0xdeadbeef'",
        '  amount: 42',
        '  note: paid 0x12 twice',
      ].join('\n'),
    );
  });

  test('behavior: the committed bundle has no plain 0x scalar (each reads back as the string the spec wrote)', () => {
    const text = readFileSync(join(repoRoot, 'generated', 'openapi.yaml'), 'utf8');
    expect(quoteHexScalars(text) === text).toBe(true);
  });
});

describe('diffDirs', () => {
  test('behavior: lists changed, missing and extra files', () => {
    const a = join(scratch, 'a');
    const b = join(scratch, 'b');
    mkdirSync(a);
    mkdirSync(b);
    writeFileSync(join(a, 'same'), 'x');
    writeFileSync(join(b, 'same'), 'x');
    writeFileSync(join(a, 'changed'), 'x');
    writeFileSync(join(b, 'changed'), 'y');
    writeFileSync(join(a, 'missing'), 'x');
    writeFileSync(join(b, 'extra'), 'x');
    expect(diffDirs(a, b)).toEqual(['changed', 'extra', 'missing']);
  });
});

describe('the drift gate (npm run check:generated)', () => {
  test('behavior: passes on the committed generated/ and fails on a stale copy', { timeout: 60_000 }, () => {
    const copy = join(scratch, 'generated');
    cpSync(join(repoRoot, 'generated'), copy, { recursive: true });
    expect(check(copy)).toMatchObject({ status: 0 });

    appendFileSync(join(copy, 'api.d.ts'), '\n// hand edit\n');
    const stale = check(copy);
    expect(stale.status).toBe(1);
    expect(stale.output).toContain('api.d.ts');
    // A failed check removes its scratch copy too (process.exit() in it once skipped the clean-up).
    expect(stale.leftBehind).toEqual([]);

    rmSync(join(copy, 'openapi.yaml'));
    expect(check(copy).output).toContain('openapi.yaml');
  });
});
