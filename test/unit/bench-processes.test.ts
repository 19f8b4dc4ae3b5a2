/**
 * The harness's children (bench/processes.ts): a child whose standard output goes to a file (`stdoutFile`, as
 * the harness starts its server at LOG_LEVEL=info) writes its lines there, not into a pipe the harness reads,
 * and keeps its standard error for error messages; stopped by its pid when the test ends, also on failure.
 * Every child runs with the node flags of `npm start` (`startFlags`, read from package.json), or another
 * tree's when given.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, expect, test, vi } from 'vitest';
import { type Child, startFlags, startNodeChild } from '../../bench/processes.ts';
import { repoRoot } from '../support/contract.ts';
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

test("behavior: startFlags are the words between node and the script of package.json's start script", () => {
  const start = (
    JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { scripts: { start: string } }
  ).scripts.start;
  expect(start).toBe(['node', ...startFlags(), 'server/start.mjs'].join(' '));
  expect(startFlags()).toEqual(['--use-largepages=silent']);
  // This node takes them: no error, no warning (`silent` where large pages are not supported).
  const run = spawnSync(process.execPath, [...startFlags(), '-e', '0'], { encoding: 'utf8' });
  expect({ status: run.status, stderr: run.stderr }).toEqual({ status: 0, stderr: '' });

  const tree = (name: string, script: string) => {
    const root = join(scratch, name);
    mkdirSync(root, { recursive: true });
    writeFileSync(join(root, 'package.json'), JSON.stringify({ scripts: { start: script } }));
    return root;
  };
  expect(startFlags(tree('plain', 'node server/start.mjs'))).toEqual([]);
  expect(startFlags(tree('two', 'node  --a=1 --b server/start.mjs '))).toEqual(['--a=1', '--b']);
  expect(() => startFlags(tree('other', 'tsx server/main.ts'))).toThrow(/start script/);
});

test('behavior: a child runs with the start flags, or with the flags it is given, before its own node arguments', async () => {
  const argv = async (child: Child) => {
    started.push(child);
    return JSON.parse(await (await fetch(`${child.origin}/argv`)).text()) as string[];
  };
  const fixture = 'test/fixtures/bench/talking-server.mjs';
  expect(await argv(await startNodeChild('talking', fixture, {}, '/ready'))).toEqual(startFlags());
  expect(
    await argv(
      await startNodeChild('talking', fixture, {}, '/ready', ['--no-warnings'], {
        flags: ['--no-deprecation'],
      }),
    ),
  ).toEqual(['--no-deprecation', '--no-warnings']);
});
