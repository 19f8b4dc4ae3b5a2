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

/**
 * CPU time, in µs, of a process's main thread and of all its threads, and of the machine's CPUs; for a process
 * read with its children (cpuReading), the sums over it and them.
 */
export type CpuReading = {
  mainUs: number;
  processUs: number;
  machine?: { idle: number; all: number; wakeups?: number };
};

/**
 * CPU per request between two readings: the server's main thread, its other threads, the client's process.
 * `mainThreads`: how many main threads `mainUs` sums (a `WORKERS` server's workers; one when absent), each of
 * which serves its own requests.
 */
export type CpuPerRequest = {
  mainUs: number;
  othersUs: number;
  clientUs: number;
  idlePercent: number;
  /** The machine's wake-up interrupts per request (wakeupInterruptsOf); NaN where the kernel does not count them. */
  wakeups?: number;
  mainThreads?: number;
};

/**
 * The wake-up interrupts a `/proc/interrupts` text counts, summed over its CPUs: the rescheduling (`RES`) and
 * function-call (`CAL`) inter-processor interrupts (x86), which a process sends when it wakes a thread that
 * sleeps on another CPU (a socket's reader, a loopback peer). A server that answers a client whose CPU went idle
 * pays for that wake-up inside its own write; on a VM whose idle vCPUs halt, about 19 µs an answer (bench/
 * HISTORY.md, fiftieth round). Undefined when the text has neither line (other architectures).
 */
export function wakeupInterruptsOf(text: string): number | undefined {
  let total: number | undefined;
  for (const line of text.split('\n')) {
    const match = /^\s*(RES|CAL):((?:\s+\d+)+)/.exec(line);
    if (!match) continue;
    total =
      (total ?? 0) +
      (match[2] as string)
        .trim()
        .split(/\s+/)
        .reduce((sum, n) => sum + Number(n), 0);
  }
  return total;
}

function wakeupInterrupts(): number | undefined {
  try {
    return wakeupInterruptsOf(readFileSync('/proc/interrupts', 'utf8'));
  } catch {
    return undefined;
  }
}

/** The pids of a process's children (forked by its main thread: a `node:cluster` primary's workers); [] unread. */
export function childrenOf(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8')
      .split(' ')
      .filter((text) => text.trim() !== '')
      .map(Number);
  } catch {
    return [];
  }
}

/** A process and its children: a `node:cluster` primary and its workers. */
export const processTree = (pid: number): number[] => [pid, ...childrenOf(pid)];

/** Clock ticks of `/proc/<pid>/stat`-like text (utime + stime, fields 14 and 15), after the command's parentheses. */
function ticksOf(stat: string): number {
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]);
}

// Linux's USER_HZ: what /proc's utime and stime count in (100 on every architecture Node runs on).
const TICK_US = 10_000;

/**
 * A process's CPU time so far (Linux `/proc/<pid>/stat`, which keeps the threads that ended, and its main
 * thread's `/proc/<pid>/task/<pid>/stat`), with the machine's CPU times (`/proc/stat`: idle and all);
 * undefined where the kernel does not give them. In clock ticks (10 ms): over a run of seconds and thousands of
 * requests, well under a µs per request. `withChildren`: summed over the process and its children (a
 * `node:cluster` primary and its workers: their main threads, and all their threads).
 */
export function cpuReading(pid: number, withChildren = false): CpuReading | undefined {
  try {
    let processUs = 0;
    let mainUs = 0;
    for (const one of withChildren ? processTree(pid) : [pid]) {
      processUs += ticksOf(readFileSync(`/proc/${one}/stat`, 'utf8')) * TICK_US;
      mainUs += ticksOf(readFileSync(`/proc/${one}/task/${one}/stat`, 'utf8')) * TICK_US;
    }
    const cpu = readFileSync('/proc/stat', 'utf8')
      .split('\n', 1)[0]
      ?.trim()
      .split(/\s+/)
      .slice(1)
      .map(Number);
    // user nice system idle iowait …: idle and iowait are the time no process ran.
    const wakeups = wakeupInterrupts();
    const machine =
      cpu && cpu.length >= 5
        ? {
            idle: (cpu[3] ?? 0) + (cpu[4] ?? 0),
            all: cpu.reduce((a, b) => a + b, 0),
            ...(wakeups === undefined ? {} : { wakeups }),
          }
        : undefined;
    return { mainUs, processUs, ...(machine ? { machine } : {}) };
  } catch {
    return undefined;
  }
}

/**
 * What the server (`before`/`after`: cpuReading of its process) and the client (`clientUs`: the harness's own
 * process.cpuUsage() over the same span, user and system) spent per request, and the share of the machine's
 * CPU time left idle meanwhile; NaN for what a reading is missing. `mainThreads`: how many main threads the
 * readings sum (a `WORKERS` server read with its children), carried into the result.
 */
export function cpuPerRequest(
  before: CpuReading | undefined,
  after: CpuReading | undefined,
  clientUs: number,
  requests: number,
  mainThreads?: number,
): CpuPerRequest {
  const per = (us: number) => (requests > 0 ? us / requests : Number.NaN);
  const threads = mainThreads === undefined ? {} : { mainThreads };
  if (!before || !after)
    return {
      mainUs: Number.NaN,
      othersUs: Number.NaN,
      clientUs: per(clientUs),
      idlePercent: Number.NaN,
      wakeups: Number.NaN,
      ...threads,
    };
  const main = after.mainUs - before.mainUs;
  const [from, to] = [before.machine, after.machine];
  const all = from && to ? to.all - from.all : 0;
  return {
    mainUs: per(main),
    // Sampled in ticks on both sides: never below zero.
    othersUs: per(Math.max(0, after.processUs - before.processUs - main)),
    clientUs: per(clientUs),
    idlePercent: from && to && all > 0 ? ((to.idle - from.idle) / all) * 100 : Number.NaN,
    wakeups:
      from?.wakeups !== undefined && to?.wakeups !== undefined ? per(to.wakeups - from.wakeups) : Number.NaN,
    ...threads,
  };
}
