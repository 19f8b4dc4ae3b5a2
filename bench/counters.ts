/**
 * What the kernel counts of one thread of a process (Linux `/proc/<pid>/task/<tid>/`): its read and write
 * system calls (`io`: `syscr`, `syscw`, which count `read`, `pread64`, `readv` and `write`, `pwrite64`,
 * `writev` alike) and its context switches (`status`). Unlike time, these do not move with the machine's load:
 * on a VM whose speed changes from one minute to the next, a change that writes fewer WAL frames or runs one
 * transaction fewer shows here in every round (bench/HISTORY.md, twenty-second round).
 */
import { closeSync, fstatSync, openSync, readFileSync } from 'node:fs';
import { median } from './measure.ts';

export type ThreadCounters = {
  reads: number;
  writes: number;
  /** Context switches the thread asked for (it blocked) and those it was made to take. */
  voluntarySwitches: number;
  involuntarySwitches: number;
};

const field = (text: string, name: string): number => {
  const found = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(text);
  if (!found) throw new Error(`no ${name}`);
  return Number(found[1]);
};

/** The thread's counters now; undefined where the kernel does not keep them (not Linux, or not readable). */
export function threadCounters(pid: number, tid = pid): ThreadCounters | undefined {
  try {
    const io = readFileSync(`/proc/${pid}/task/${tid}/io`, 'utf8');
    const status = readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
    return {
      reads: field(io, 'syscr'),
      writes: field(io, 'syscw'),
      voluntarySwitches: field(status, 'voluntary_ctxt_switches'),
      involuntarySwitches: field(status, 'nonvoluntary_ctxt_switches'),
    };
  } catch {
    return undefined;
  }
}

/** What the thread counted between two readings, per request (NaN for each when either reading is missing). */
export function perRequest(
  before: ThreadCounters | undefined,
  after: ThreadCounters | undefined,
  requests: number,
): ThreadCounters {
  const per = (key: keyof ThreadCounters) =>
    before && after && requests > 0 ? (after[key] - before[key]) / requests : Number.NaN;
  return {
    reads: per('reads'),
    writes: per('writes'),
    voluntarySwitches: per('voluntarySwitches'),
    involuntarySwitches: per('involuntarySwitches'),
  };
}

/**
 * What one system call costs from Node on this machine, in µs: the median of 5 batches of 20,000 `fstat`s of
 * an open file (Node's binding included). It tells the kinds of VM apart that the runs meet: 2.2 to 2.5 µs on
 * the one of the twenty-second round (bench/HISTORY.md), where a proxied request's 60 or so system calls (WAL
 * frames, the WAL's locks, sockets) cost about 150 µs of its main thread.
 */
export function systemCallUs(batches = 5, calls = 20_000): number {
  const fd = openSync(process.execPath, 'r');
  try {
    const perCall: number[] = [];
    for (let batch = 0; batch < batches; batch++) {
      const start = process.hrtime.bigint();
      for (let n = 0; n < calls; n++) fstatSync(fd);
      perCall.push(Number(process.hrtime.bigint() - start) / 1000 / calls);
    }
    return median(perCall);
  } finally {
    closeSync(fd);
  }
}
