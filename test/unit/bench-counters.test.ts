/**
 * The kernel's counts of a thread (bench/counters.ts), which `npm run bench:ab` reports per request: read from
 * this very thread, they follow the system calls it makes.
 */
import { closeSync, openSync, readSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isMainThread } from 'node:worker_threads';
import { expect, test } from 'vitest';
import { perRequest, systemCallUs, threadCounters } from '../../bench/counters.ts';

// The thread read is the process's main one (its tid is the pid): the test must run there (vitest's forks).
const linux = process.platform === 'linux' && isMainThread;

test.runIf(linux)('behavior: the counts follow the reads and writes this thread makes', () => {
  const file = join(tmpdir(), `counters-${process.pid}.bin`);
  const fd = openSync(file, 'w+');
  try {
    const before = threadCounters(process.pid);
    for (let n = 0; n < 100; n++) writeSync(fd, 'x', n);
    for (let n = 0; n < 50; n++) readSync(fd, Buffer.alloc(1), 0, 1, n);
    const after = threadCounters(process.pid);
    const per = perRequest(before, after, 10);
    // Vitest's own threads are others; this one made at least these calls (and little else meanwhile).
    expect(per.writes).toBeGreaterThanOrEqual(10);
    expect(per.writes).toBeLessThan(11);
    expect(per.reads).toBeGreaterThanOrEqual(5);
    expect(per.reads).toBeLessThan(6);
  } finally {
    closeSync(fd);
    rmSync(file, { force: true });
  }
});

test('behavior: a thread that cannot be read gives no counts, and per request NaN', () => {
  expect(threadCounters(2 ** 30)).toBeUndefined();
  const per = perRequest(undefined, undefined, 10);
  expect(per.writes).toBeNaN();
  expect(per.reads).toBeNaN();
  const some = { reads: 1, writes: 1 };
  expect(perRequest(some, some, 0).writes).toBeNaN();
});

test('behavior: the cost of a system call is a measured, finite number (no bound on it: no timed assertion)', () => {
  const us = systemCallUs(3, 2_000);
  expect(Number.isFinite(us)).toBe(true);
  expect(us).toBeGreaterThan(0);
});
