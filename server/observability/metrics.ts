/**
 * Prometheus metrics in the text exposition format, without a client library: request counts and latency by
 * operation and status, upstream latency by provider, and gauges and counters read at scrape time (requests in
 * flight, ledger totals, the money the ledger entries moved).
 */
import { innerMap } from '../objects.ts';

const BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

type Histogram = { counts: number[]; sum: number; count: number };

/** Values read at scrape time, by their labels (`a="x",b="y"`, or '' for none). */
export type Gauge = { name: string; help: string; read: () => Promise<Record<string, number>> };
/** A counter kept elsewhere (it only grows), read at scrape time like a gauge. */
export type Counter = Gauge;

export type Metrics = {
  observeRequest(operation: string, status: number, seconds: number): void;
  observeUpstream(upstream: string, outcome: string, seconds: number): void;
  addGauge(gauge: Gauge): void;
  addCounter(counter: Counter): void;
  render(): Promise<string>;
};

export function createMetrics(): Metrics {
  /** Requests by operation, then by status. */
  const requests = new Map<string, Map<number, number>>();
  const durations = new Map<string, Histogram>();
  const upstream = new Map<string, Histogram>();
  /** Gauges and counters read at scrape time, in the order they were added. */
  const readAtScrape: Array<Gauge & { type: 'gauge' | 'counter' }> = [];

  const observe = (map: Map<string, Histogram>, key: string, seconds: number) => {
    let h = map.get(key);
    if (!h) {
      h = { counts: BUCKETS.map(() => 0), sum: 0, count: 0 };
      map.set(key, h);
    }
    for (let i = 0; i < BUCKETS.length; i++)
      if (seconds <= (BUCKETS[i] ?? Infinity)) h.counts[i] = (h.counts[i] ?? 0) + 1;
    h.sum += seconds;
    h.count += 1;
  };

  const renderHistogram = (name: string, help: string, label: string, map: Map<string, Histogram>) => {
    const lines = [`# HELP ${name} ${help}`, `# TYPE ${name} histogram`];
    for (const [key, h] of map) {
      const l = `${label}="${escapeLabel(key)}"`;
      BUCKETS.forEach((b, i) => {
        lines.push(`${name}_bucket{${l},le="${b}"} ${h.counts[i]}`);
      });
      lines.push(
        `${name}_bucket{${l},le="+Inf"} ${h.count}`,
        `${name}_sum{${l}} ${h.sum}`,
        `${name}_count{${l}} ${h.count}`,
      );
    }
    return lines;
  };

  return {
    observeRequest(operation, status, seconds) {
      // By operation, then by status: no key concatenated per request (V8 flattens and hashes a new string
      // before each lookup; the operation's id is one string from the spec, hashed once).
      const byStatus = innerMap(requests, operation);
      byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
      observe(durations, operation, seconds);
    },
    observeUpstream(name, outcome, seconds) {
      observe(upstream, `${name}:${outcome}`, seconds);
    },
    addGauge(gauge) {
      readAtScrape.push({ ...gauge, type: 'gauge' });
    },
    addCounter(counter) {
      readAtScrape.push({ ...counter, type: 'counter' });
    },
    async render() {
      const lines = [
        '# HELP http_requests_total Requests by operation and status.',
        '# TYPE http_requests_total counter',
      ];
      for (const [operation, byStatus] of requests) {
        for (const [status, count] of byStatus) {
          lines.push(
            `http_requests_total{operation="${escapeLabel(operation)}",status="${status}"} ${count}`,
          );
        }
      }
      lines.push(
        ...renderHistogram(
          'http_request_duration_seconds',
          'Request latency by operation.',
          'operation',
          durations,
        ),
      );
      lines.push(
        ...renderHistogram(
          'upstream_request_duration_seconds',
          'Upstream latency by upstream and outcome.',
          'upstream',
          upstream,
        ),
      );
      for (const series of readAtScrape) {
        lines.push(`# HELP ${series.name} ${series.help}`, `# TYPE ${series.name} ${series.type}`);
        for (const [labels, value] of Object.entries(await series.read())) {
          lines.push(`${series.name}${labels ? `{${labels}}` : ''} ${value}`);
        }
      }
      return `${lines.join('\n')}\n`;
    },
  };
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}
