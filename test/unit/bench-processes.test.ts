/**
 * The harness's children (bench/processes.ts): a child whose standard output goes to a file (`stdoutFile`, as
 * the harness starts its server at LOG_LEVEL=info) writes its lines there, not into a pipe the harness reads,
 * and keeps its standard error for error messages; stopped by its pid when the test ends, also on failure.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, expect, test, vi } from 'vitest';
import { type Child, startNodeChild } from '../../bench/processes.ts';
import { isAlive } from '../support/process.ts';

const started: Child[] = [];
const scratch = mkdtempSync(join(tmpdir(), 'bench-processes-'));

afterEach(async () => {
  await Promise.all(started.splice(0).map((child) => child.stop()));
});
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

test("behavior: a child started with stdoutFile writes its standard output to the file, its output() is its standard error's", async () => {
  const file = join(scratch, 'server.log');
  const child = await startNodeChild('talking', 'test/fixtures/bench/talking-server.mjs', {}, '/ready', [], {
    stdoutFile: file,
  });
  started.push(child);
  await (await fetch(`${child.origin}/second`)).text();
  // The harness's readiness probe, then this request: each a line in the file, in order.
  expect(readFileSync(file, 'utf8')).toBe('served /ready\nserved /second\n');
  // The pipe is read as its data comes: waited for, not assumed there when the answer is.
  await vi.waitFor(() => expect(child.output()).toBe('listening'));
  await child.stop();
  expect(isAlive(child.pid)).toBe(false);
});

test('behavior: without stdoutFile both streams are read into output()', async () => {
  const child = await startNodeChild('talking', 'test/fixtures/bench/talking-server.mjs', {}, '/ready');
  started.push(child);
  await vi.waitFor(() => expect(child.output().split('\n').sort()).toEqual(['listening', 'served /ready']));
});
