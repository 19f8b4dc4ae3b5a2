/**
 * What the kernel counts of one thread of a process (Linux `/proc/<pid>/task/<tid>/io`): its read and write
 * system calls (`syscr`, `syscw`, which count `read`, `pread64`, `readv` and `write`, `pwrite64`, `writev`
 * alike). Unlike time, these do not move with the machine's load: on a VM whose speed changes from one minute
 * to the next, a change that writes fewer WAL frames shows here in every round (bench/HISTORY.md,
 * twenty-second round).
 */
import { closeSync, fstatSync, openSync, readFileSync } from 'node:fs';
import { type Latency, latencies, median, requestsServed, type Target } from './measure.ts';

export type ThreadCounters = { reads: number; writes: number };

const field = (text: string, name: string): number => {
  const found = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(text);
  if (!found) throw new Error(`no ${name}`);
  return Number(found[1]);
};

/** The thread's counters now; undefined where the kernel does not keep them (not Linux, or not readable). */
export function threadCounters(pid: number, tid = pid): ThreadCounters | undefined {
  try {
    const io = readFileSync(`/proc/${pid}/task/${tid}/io`, 'utf8');
    return { reads: field(io, 'syscr'), writes: field(io, 'syscw') };
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
  return { reads: per('reads'), writes: per('writes') };
}

/**
 * `latencies` of `targets`, with what the main thread of each process in `pids` counted per request meanwhile
 * (one entry per pid, in order): from the end of the warm-up, over the requests each target was sent
 * (`requestsServed`). Each pid must serve one of the targets alone: another target's requests to the same
 * process would be counted with its own.
 */
export async function countedLatencies(
  targets: readonly Target[],
  count: number,
  options: { warmup?: number; block?: number },
  pids: readonly number[],
): Promise<{ measured: Latency[]; counted: ThreadCounters[] }> {
  let before: Array<ThreadCounters | undefined> = [];
  const measured = await latencies(targets, count, {
    ...options,
    afterWarmup: async () => {
      before = pids.map((pid) => threadCounters(pid));
    },
  });
  const served = requestsServed(targets.length, count, options.block);
  return {
    measured,
    counted: pids.map((pid, i) => perRequest(before[i], threadCounters(pid), served)),
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
