/**
 * The server's log destination (server/observability/log-destination.ts): lines are gathered and handed to
 * the writer a batch at a time, in order, at most `flushMs` after the first of a batch or at once past
 * `maxBytes`; `flush` and `flushSync` hand on what is gathered now; a process that exits writes what it had
 * gathered, with the real writer on a real file.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeEach, describe, expect, test, vi } from 'vitest';
import { createLogDestination, type LogDestination } from '../../server/observability/log-destination.ts';
import { repoRoot } from '../support/contract.ts';

/** A writer that records what it is given. */
function recorder() {
  const batches: string[] = [];
  const calls: string[] = [];
  const writer: LogDestination = {
    write(batch) {
      batches.push(batch);
      return true;
    },
    flush(done) {
      calls.push('flush');
      done?.();
    },
    flushSync() {
      calls.push('flushSync');
    },
  };
  return { writer, batches, calls };
}

const line = (n: number) => `{"msg":"line ${n}"}\n`;

describe('gathering', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  test('lines wait for flushMs after the first of a batch, then go together, in order', () => {
    const { writer, batches } = recorder();
    const destination = createLogDestination({ writer, flushMs: 100, maxBytes: 1024 });
    destination.write(line(1));
    vi.advanceTimersByTime(60);
    destination.write(line(2)); // does not push the batch's time back
    destination.write(line(3));
    vi.advanceTimersByTime(39);
    expect(batches).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(batches).toEqual([line(1) + line(2) + line(3)]);
    // Nothing gathered: no timer, no empty batch.
    vi.advanceTimersByTime(1000);
    expect(batches).toHaveLength(1);
    // The next line starts a batch of its own.
    destination.write(line(4));
    vi.advanceTimersByTime(100);
    expect(batches).toEqual([line(1) + line(2) + line(3), line(4)]);
  });

  test('a batch reaching maxBytes goes at once, and its timer with it', () => {
    const { writer, batches } = recorder();
    const destination = createLogDestination({ writer, flushMs: 100, maxBytes: 2 * line(1).length });
    destination.write(line(1));
    expect(batches).toEqual([]);
    destination.write(line(2));
    expect(batches).toEqual([line(1) + line(2)]);
    vi.advanceTimersByTime(100);
    expect(batches).toHaveLength(1);
  });

  test('flush and flushSync hand on what is gathered now, then ask the writer to write it', () => {
    const { writer, batches, calls } = recorder();
    const destination = createLogDestination({ writer, flushMs: 100 });
    destination.write(line(1));
    const done = vi.fn();
    destination.flush(done);
    expect(batches).toEqual([line(1)]);
    expect(calls).toEqual(['flush']);
    expect(done).toHaveBeenCalledOnce();
    destination.write(line(2));
    destination.flushSync();
    expect(batches).toEqual([line(1), line(2)]);
    expect(calls).toEqual(['flush', 'flushSync']);
    vi.advanceTimersByTime(100);
    expect(batches).toHaveLength(2);
  });
});

describe('on a real file', () => {
  const scratch = mkdtempSync(join(tmpdir(), 'log-destination-'));
  afterAll(() => rmSync(scratch, { recursive: true, force: true }));

  /**
   * Runs `body` in a fresh process (a module with `destination` on `file`, flushMs a minute, one thread in
   * libuv's pool); its exit status and output.
   */
  function inProcess(file: string, body: string[]) {
    const script = [
      "import { openSync, readFileSync } from 'node:fs';",
      "import { createLogDestination } from './server/observability/log-destination.ts';",
      `const file = ${JSON.stringify(file)};`,
      "const destination = createLogDestination({ fd: openSync(file, 'a'), flushMs: 60_000 });",
      ...body,
    ].join('\n');
    const run = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: repoRoot,
      timeout: 30_000,
      encoding: 'utf8',
      env: { ...process.env, UV_THREADPOOL_SIZE: '1' },
    });
    return { status: run.status, out: run.stdout, written: readFileSync(file, 'utf8') };
  }

  test('a process that exits with lines gathered writes them, in order', () => {
    const run = inProcess(join(scratch, 'exit.log'), [
      'for (let i = 1; i <= 3; i++) destination.write(\'{"msg":"line \' + i + \'"}\\n\');',
      'process.exit(3);',
    ]);
    expect(run.status).toBe(3);
    expect(run.written).toBe(line(1) + line(2) + line(3));
  });

  test('flushSync writes through to the file before it returns, even with the thread pool busy', () => {
    // One thread in libuv's pool, kept busy for a while: a write handed to the pool would wait behind it.
    const run = inProcess(join(scratch, 'sync.log'), [
      "const { pbkdf2 } = await import('node:crypto');",
      "pbkdf2('x', 'y', 3_000_000, 32, 'sha256', () => {});",
      'destination.write(`{"msg":"line 1"}\\n`);',
      "const before = readFileSync(file, 'utf8');",
      'destination.flushSync();',
      "process.stdout.write(JSON.stringify({ before, after: readFileSync(file, 'utf8') }));",
    ]);
    expect(run.status).toBe(0);
    expect(JSON.parse(run.out)).toEqual({ before: '', after: line(1) });
  });
});
