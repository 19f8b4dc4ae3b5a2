/**
 * bench/perf-map.mjs: a `--perf-basic-prof` symbol map rewritten so that every address has one name, the newest
 * (V8 reuses the memory of collected code), the kept lines in their order, the file rewritten in place.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
// @ts-expect-error: a plain ES module of the bench folder, without types.
import { newestEntries } from '../../bench/perf-map.mjs';
import { repoRoot } from '../support/contract.ts';

const scratch = mkdtempSync(join(tmpdir(), 'perf-map-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const map = [
  '1000 100 Builtin:A', // kept: nothing later overlaps it
  '2000 100 JS:*startup yaml.js:1:1', // same start as a later entry: dropped
  '3000 200 JS:*old a.js:1:1', // partly overlapped by a later entry: dropped
  '2000 80 JS:*writeReply app.ts:1:9070',
  '3100 40 JS:*newer b.js:1:1',
  '3140 c0 JS:*next c.js:1:1', // ends at 0x3200: touches nothing later
  '3200 10 JS:*adjacent d.js:1:1', // starts where the previous one ends: both kept
  '4000 0 JS:*empty e.js:1:1', // no size: overlaps nothing
].join('\n');

test('behavior: an address keeps only its newest name; disjoint and adjacent entries stay, in their order', () => {
  expect(newestEntries(map)).toEqual([
    '1000 100 Builtin:A',
    '2000 80 JS:*writeReply app.ts:1:9070',
    '3100 40 JS:*newer b.js:1:1',
    '3140 c0 JS:*next c.js:1:1',
    '3200 10 JS:*adjacent d.js:1:1',
    '4000 0 JS:*empty e.js:1:1',
  ]);
});

test('behavior: an entry overlapped by one of two later disjoint entries is dropped; a later one inside an earlier one replaces it', () => {
  expect(newestEntries(['5000 300 JS:*big', '5100 10 JS:*inside', '5400 10 JS:*after'].join('\n'))).toEqual([
    '5100 10 JS:*inside',
    '5400 10 JS:*after',
  ]);
  expect(newestEntries(['5100 10 JS:*inside', '5000 300 JS:*big'].join('\n'))).toEqual(['5000 300 JS:*big']);
});

test('behavior: the command rewrites the file in place', () => {
  const file = join(scratch, 'perf-1.map');
  writeFileSync(file, `${map}\n`);
  execFileSync(process.execPath, [join(repoRoot, 'bench', 'perf-map.mjs'), file]);
  expect(readFileSync(file, 'utf8')).toBe(`${newestEntries(map).join('\n')}\n`);
});
