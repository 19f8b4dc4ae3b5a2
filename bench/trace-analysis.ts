/**
 * What `npm run bench:trace` makes of the stamps bench/trace-hooks.mjs took in the server: each request's
 * steps (from one stamp to the next), their medians over the requests, where the slowest requests lost their
 * time, and how long the server stayed busy after each answer (what the next request, arriving meanwhile,
 * waits for).
 */
import { percentile } from './measure.ts';

/** What the hooks write on SIGUSR2: stamps (label id, time in ms) and garbage collections. */
export type TraceDump = {
  labels: string[];
  ids: number[];
  times: number[];
  /** [start ms, duration ms, kind] (kind: 1 scavenge, 4 mark-compact, 8 incremental marking, 16 weak callbacks). */
  gcs: Array<[number, number, number]>;
};

export type Stamp = { label: string; at: number };

export type Step = {
  /** `from -> to`, with `#n` when the same pair comes again within a request (the n-th time). */
  step: string;
  /** Requests that went through it. */
  count: number;
  p50Us: number;
  p90Us: number;
};

export type TraceAnalysis = {
  requests: number;
  /** The steps most requests went through, in the order they first came. */
  steps: Step[];
  /** Sum of those steps' medians: about one request, from its arrival to the last thing it started. */
  sumOfMediansUs: number;
  /** From a request's `ended` (its last bytes written) to the next request's arrival. */
  toNextRequest: { p50Us: number; p90Us: number };
  /** From the last stamp of a request (its capture's commit, say) to the next request's arrival. */
  idleBeforeNext: { p50Us: number; p90Us: number };
  /** The slowest 1% (arrival to `ended`). */
  slowest: {
    count: number;
    /** Their durations, slowest first (µs). */
    durationsUs: number[];
    /** Of them, those during which a garbage collection ran. */
    withGc: number;
    /** Steps that took at least 100 µs more than their median, by how many of the slowest did so. */
    stepsOverMedian: Array<{ step: string; requests: number }>;
  };
  gcs: { scavenges: number; markCompacts: number; scavengeP50Ms: number };
};

/** The `q` quantile (0 to 1) of `values`, as the harness reads its percentiles (measure.ts). */
const quantile = (values: number[], q: number) =>
  percentile(
    [...values].sort((a, b) => a - b),
    q * 100,
  );

/** The stamps of each request, split where a request arrives (`req`); stamps before the first are dropped. */
export function requestsOf(dump: TraceDump): Stamp[][] {
  const requests: Stamp[][] = [];
  for (let i = 0; i < dump.ids.length; i++) {
    const label = dump.labels[dump.ids[i] as number] ?? '?';
    if (label === 'req') requests.push([]);
    requests.at(-1)?.push({ label, at: dump.times[i] as number });
  }
  return requests;
}

/** Each request's steps as `from -> to` keys with their durations (µs). */
function stepsOf(request: Stamp[]): Array<[string, number]> {
  const seen = new Map<string, number>();
  const steps: Array<[string, number]> = [];
  for (let i = 1; i < request.length; i++) {
    const from = request[i - 1] as Stamp;
    const to = request[i] as Stamp;
    const pair = `${from.label} -> ${to.label}`;
    const n = (seen.get(pair) ?? 0) + 1;
    seen.set(pair, n);
    steps.push([n > 1 ? `${pair} #${n}` : pair, (to.at - from.at) * 1000]);
  }
  return steps;
}

export function analyseTrace(dump: TraceDump): TraceAnalysis {
  const all = requestsOf(dump);
  // The first and the last request may be cut by the dump: left out.
  const requests = all.slice(1, -1);
  const durations = new Map<string, number[]>();
  const order: string[] = [];
  for (const request of requests) {
    for (const [step, us] of stepsOf(request)) {
      let list = durations.get(step);
      if (!list) {
        list = [];
        durations.set(step, list);
        order.push(step);
      }
      list.push(us);
    }
  }
  const steps = order
    .map((step) => {
      const list = durations.get(step) ?? [];
      return { step, count: list.length, p50Us: quantile(list, 0.5), p90Us: quantile(list, 0.9) };
    })
    .filter((s) => s.count >= requests.length / 2);
  const medians = new Map(steps.map((s) => [s.step, s.p50Us]));

  const toNext: number[] = [];
  const idle: number[] = [];
  for (let i = 1; i < all.length; i++) {
    const previous = all[i - 1] as Stamp[];
    const arrival = (all[i] as Stamp[])[0] as Stamp;
    const ended = previous.findLast((s) => s.label === 'ended');
    if (ended) toNext.push((arrival.at - ended.at) * 1000);
    idle.push((arrival.at - (previous.at(-1) as Stamp).at) * 1000);
  }

  const spans = requests
    .map((request) => {
      const ended = request.findLast((s) => s.label === 'ended');
      const start = request[0] as Stamp;
      return { request, us: ended ? (ended.at - start.at) * 1000 : 0 };
    })
    .sort((a, b) => b.us - a.us);
  const slowest = spans.slice(0, Math.ceil(spans.length / 100));
  const over = new Map<string, number>();
  let withGc = 0;
  for (const { request } of slowest) {
    const start = (request[0] as Stamp).at;
    const last = (request.at(-1) as Stamp).at;
    if (dump.gcs.some(([at, ms]) => at < last && at + ms > start)) withGc++;
    for (const [step, us] of stepsOf(request)) {
      const median = medians.get(step);
      if (median !== undefined && us - median >= 100) over.set(step, (over.get(step) ?? 0) + 1);
    }
  }
  const scavenges = dump.gcs.filter(([, , kind]) => kind === 1);
  return {
    requests: requests.length,
    steps,
    sumOfMediansUs: steps.reduce((sum, s) => sum + s.p50Us, 0),
    toNextRequest: { p50Us: quantile(toNext, 0.5), p90Us: quantile(toNext, 0.9) },
    idleBeforeNext: { p50Us: quantile(idle, 0.5), p90Us: quantile(idle, 0.9) },
    slowest: {
      count: slowest.length,
      durationsUs: slowest.map((s) => s.us),
      withGc,
      stepsOverMedian: [...over.entries()]
        .map(([step, requests]) => ({ step, requests }))
        .sort((a, b) => b.requests - a.requests),
    },
    gcs: {
      scavenges: scavenges.length,
      markCompacts: dump.gcs.filter(([, , kind]) => kind === 4).length,
      scavengeP50Ms: quantile(
        scavenges.map(([, ms]) => ms),
        0.5,
      ),
    },
  };
}

const us = (value: number) => (Number.isFinite(value) ? value.toFixed(1) : '-');

/** The analysis as markdown. */
export function renderTrace(analysis: TraceAnalysis, title: string): string {
  const lines = [
    `# ${title}`,
    '',
    `${analysis.requests} requests one at a time; each step from one stamp to the next, in µs.`,
    '',
    '| step | requests | p50 µs | p90 µs |',
    '|---|---|---|---|',
    ...analysis.steps.map((s) => `| ${s.step} | ${s.count} | ${us(s.p50Us)} | ${us(s.p90Us)} |`),
    '',
    `- Sum of the steps' medians: ${us(analysis.sumOfMediansUs)} µs.`,
    `- From an answer's last bytes to the next request's arrival: p50 ${us(analysis.toNextRequest.p50Us)} µs, p90 ${us(analysis.toNextRequest.p90Us)} µs.`,
    `- From the last thing a request started (its capture's commit, say) to the next arrival: p50 ${us(analysis.idleBeforeNext.p50Us)} µs, p90 ${us(analysis.idleBeforeNext.p90Us)} µs (a few µs: the next request was waiting for it).`,
    `- Garbage collections: ${analysis.gcs.scavenges} scavenges (p50 ${analysis.gcs.scavengeP50Ms.toFixed(2)} ms), ${analysis.gcs.markCompacts} mark-compacts.`,
    `- The slowest ${analysis.slowest.count} (1%): ${analysis.slowest.durationsUs
      .slice(0, 10)
      .map((d) => d.toFixed(0))
      .join(
        ', ',
      )}${analysis.slowest.count > 10 ? ', …' : ''} µs; ${analysis.slowest.withGc} of them during a garbage collection.`,
    `- Their steps at least 100 µs over the step's median: ${
      analysis.slowest.stepsOverMedian
        .slice(0, 8)
        .map((s) => `${s.step} (${s.requests})`)
        .join(', ') || 'none'
    }.`,
  ];
  return `${lines.join('\n')}\n`;
}
