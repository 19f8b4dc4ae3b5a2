/**
 * What the kernel counts of one thread of a process (Linux `/proc/<pid>/task/<tid>/`): its read and write
 * system calls (`io`: `syscr`, `syscw`, which count `read`, `pread64`, `readv` and `write`, `pwrite64`,
 * `writev` alike) and its context switches (`status`). Unlike time, these do not move with the machine's load:
 * on a VM whose speed changes from one minute to the next, a change that writes fewer WAL frames or runs one
 * transaction fewer shows here in every round (bench/HISTORY.md, twenty-second round).
 */
import { readFileSync } from 'node:fs';

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
