/**
 * The kernel's counts of a thread (bench/counters.ts), which `npm run bench:ab` reports per request: read from
 * this very thread, they follow the system calls it makes.
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync, readSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isMainThread } from 'node:worker_threads';
import { expect, test } from 'vitest';
import {
  childrenOf,
  cpuPerRequest,
  cpuReading,
  perRequest,
  systemCallUs,
  threadCounters,
  wakeupInterruptsOf,
} from '../../bench/counters.ts';

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

test.runIf(linux)(
  'behavior: the CPU readings follow the work of the main thread, within the process and the machine',
  () => {
    const before = cpuReading(process.pid);
    expect(before).toBeDefined();
    // Busy on this thread for at least 60 ms of CPU (several of /proc's 10 ms ticks).
    const start = process.cpuUsage();
    let spin = 0;
    while (process.cpuUsage(start).user < 60_000) spin++;
    const after = cpuReading(process.pid);
    expect(spin).toBeGreaterThan(0);
    const per = cpuPerRequest(before, after, 0, 1);
    expect(per.mainUs).toBeGreaterThanOrEqual(40_000);
    expect(per.othersUs).toBeGreaterThanOrEqual(0);
    // The process's time (its threads summed, each rounded to ticks apart) within two ticks of the thread's.
    expect((after?.processUs ?? 0) - (before?.processUs ?? 0)).toBeGreaterThanOrEqual(per.mainUs - 20_000);
    expect(per.idlePercent).toBeGreaterThanOrEqual(0);
    expect(per.idlePercent).toBeLessThanOrEqual(100);
  },
);

test.runIf(linux)(
  "behavior: read with its children, a process's CPU includes theirs (a cluster primary's workers)",
  async () => {
    // A child that spins 150 ms of CPU on its main thread, says so, then idles until it is killed.
    const child = spawn(
      process.execPath,
      [
        '-e',
        'const s = process.cpuUsage(); while (process.cpuUsage(s).user < 150000); console.log("done"); setInterval(() => {}, 1000);',
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    try {
      const pid = child.pid as number;
      const before = { alone: cpuReading(process.pid), tree: cpuReading(process.pid, true) };
      await new Promise<void>((resolve) => child.stdout?.once('data', () => resolve()));
      expect(childrenOf(process.pid)).toContain(pid);
      const alone = cpuPerRequest(before.alone, cpuReading(process.pid), 0, 1);
      const tree = cpuPerRequest(before.tree, cpuReading(process.pid, true), 0, 1, 2);
      // The child's 150 ms were spent between the readings (it started just before the first); this
      // process's main thread mostly waited meanwhile. Ticks are 10 ms: margins of a few.
      expect(tree.mainUs - alone.mainUs).toBeGreaterThanOrEqual(100_000);
      expect(tree.mainThreads).toBe(2);
      expect(alone.mainThreads).toBeUndefined();
    } finally {
      child.kill('SIGKILL');
    }
    expect(childrenOf(2 ** 30)).toEqual([]);
  },
);

test("behavior: CPU per request is the readings' differences over the requests; NaN for what is missing", () => {
  const before = { mainUs: 1_000_000, processUs: 1_500_000, machine: { idle: 100, all: 1_000 } };
  const after = { mainUs: 2_250_000, processUs: 2_850_000, machine: { idle: 400, all: 2_000 } };
  expect(cpuPerRequest(before, after, 175_000, 10_000)).toEqual({
    mainUs: 125,
    othersUs: 10,
    clientUs: 17.5,
    idlePercent: 30,
    // Neither reading counted the machine's wake-ups.
    wakeups: Number.NaN,
  });
  const counted = (reading: typeof before, wakeups: number) => ({
    ...reading,
    machine: { ...reading.machine, wakeups },
  });
  expect(cpuPerRequest(counted(before, 5_000), counted(after, 7_500), 0, 10_000).wakeups).toBe(0.25);
  expect(cpuPerRequest(before, counted(after, 7_500), 0, 10_000).wakeups).toBeNaN();
  // Ticks sampled apart may put the process a tick behind its main thread: never below zero.
  expect(cpuPerRequest(before, { ...after, processUs: 2_240_000 }, 0, 10_000).othersUs).toBe(0);
  const unread = cpuPerRequest(undefined, after, 175_000, 10_000);
  expect(unread.mainUs).toBeNaN();
  expect(unread.othersUs).toBeNaN();
  expect(unread.clientUs).toBe(17.5);
  expect(cpuPerRequest(before, after, 0, 0).mainUs).toBeNaN();
  expect(cpuReading(2 ** 30)).toBeUndefined();
});

test('behavior: the wake-up interrupts are the RES and CAL lines of /proc/interrupts, summed over the CPUs', () => {
  const text = [
    '           CPU0       CPU1       ',
    '  0:         37          0   IO-APIC    2-edge      timer',
    'LOC:     322379     336693   Local timer interrupts',
    'RES:     141746      92461   Rescheduling interrupts',
    'CAL:    1123011     609868   Function call interrupts',
    'TLB:      17814      20228   TLB shootdowns',
    'ERR:          0',
  ].join('\n');
  expect(wakeupInterruptsOf(text)).toBe(141_746 + 92_461 + 1_123_011 + 609_868);
  // Another architecture's file, without either line: not counted (not zero).
  expect(wakeupInterruptsOf('           CPU0\n IPI0:   12   Rescheduling interrupts\n')).toBeUndefined();
  expect(wakeupInterruptsOf('RES:  7\n')).toBe(7);
});

test.runIf(linux)('behavior: a reading of this machine counts its wake-ups when the kernel does', () => {
  let text = '';
  try {
    text = readFileSync('/proc/interrupts', 'utf8');
  } catch {}
  const counted = wakeupInterruptsOf(text);
  const wakeups = cpuReading(process.pid)?.machine?.wakeups;
  if (counted === undefined) expect(wakeups).toBeUndefined();
  else expect(wakeups).toBeGreaterThanOrEqual(counted);
});
