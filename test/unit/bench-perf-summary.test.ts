/**
 * bench/perf-summary.mjs: samples of `perf script -F ip,sym` (leaf first) summed by the JavaScript function
 * nearest the leaf, the native code it called counted to it, and, for PERF_FUNCTION, that native code's paths.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { repoRoot } from '../support/contract.ts';

const scratch = mkdtempSync(join(tmpdir(), 'perf-summary-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const sample = (...frames: string[]) => frames.map((f, i) => `\t    7f00000${i}00 ${f}`).join('\n');
// Four samples: JSON.parse's parser under `stream` (twice), `stream`'s own code, and the collector.
const text = [
  sample(
    'v8::internal::JsonParser<unsigned char>::BuildJsonObject',
    'v8::internal::Builtin_JsonParse',
    'JS:*stream file:///work/main/server/providers/chat/openai-compatible.ts:1:738',
    'JS:*next file:///work/main/server/domains/chat/service.ts:1:2946',
  ),
  sample(
    'v8::internal::JsonParser<unsigned char>::BuildJsonObject',
    'v8::internal::Builtin_JsonParse',
    'JS:^stream file:///work/main/server/providers/chat/openai-compatible.ts:1:738',
  ),
  sample('JS:*stream file:///work/main/server/providers/chat/openai-compatible.ts:1:738'),
  sample('v8::internal::ScavengerCollector::CollectGarbage', 'v8::internal::Heap::Scavenge'),
].join('\n\n');

function summary(env: Record<string, string> = {}, requests = '2'): string {
  const file = join(scratch, 'perf.txt');
  writeFileSync(file, `${text}\n`);
  return execFileSync(process.execPath, [join(repoRoot, 'bench', 'perf-summary.mjs'), file, requests], {
    encoding: 'utf8',
    env: { PATH: process.env.PATH ?? '', ...env },
  });
}

test('behavior: each sample counts to the nearest JavaScript function, whatever its tier, in share and µs a request', () => {
  const out = summary();
  expect(out).toContain('4 samples, 2 requests');
  // 3 of 4 samples, 100 µs each, over 2 requests.
  expect(out).toMatch(/ 75\.00% +150\.0 µs stream server\/providers\/chat\/openai-compatible\.ts:1:738\n/);
  expect(out).toMatch(/ 25\.00% +50\.0 µs \(no JavaScript frame\)\n/);
  expect(out).not.toContain('next server/domains/chat/service.ts');
});

test('behavior: PERF_FUNCTION lists the native call paths under the functions it matches', () => {
  const out = summary({ PERF_FUNCTION: '^stream ' });
  expect(out).toMatch(
    / 50\.00% +100\.0 µs JsonParser<unsigned char>::BuildJsonObject <- Builtin_JsonParse\n/,
  );
  expect(out).toMatch(/ 25\.00% +50\.0 µs \(its own code\)\n/);
  expect(summary({ PERF_FUNCTION: '^\\(no' })).toMatch(
    / 25\.00% +50\.0 µs ScavengerCollector::CollectGarbage <- Heap::Scavenge\n/,
  );
});
