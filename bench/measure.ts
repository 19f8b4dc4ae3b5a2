/**
 * The three kinds of measurement of the harness:
 * - throughput: autocannon against one URL for a bounded time (requests/s, p50/p99 under load, failures); a
 *   target whose every request needs a header of its own (a wallet's sign-in) gets it from a pool signed before
 *   the run, one signer per connection;
 * - latency: one connection, one request at a time, timed in microseconds (the added latency of a proxy path
 *   is its p50/p99 minus that of the upstream called directly the same way);
 * - streams: N concurrent SSE chats, each timed to its first event, counting how many were open at once.
 */
import { Agent, request } from 'node:http';
import autocannon, { type Client } from 'autocannon';

export type Target = {
  url: string;
  method: 'GET' | 'POST';
  headers?: Record<string, string>;
  body?: string;
  /**
   * A header that must be new on every request, and its signers (one per wallet, each returning a fresh value
   * synchronously): a wallet's Sign-In-With-X, whose nonce the server accepts once. `probe` and `latencies`
   * sign with the first; `throughput` gives each connection a signer of its own.
   */
  signed?: { header: string; signers: ReadonlyArray<() => string> };
  /**
   * A header whose value is the same on every request of a connection and differs between connections: a key
   * per connection, so that each connection charges an account of its own. `probe` and `latencies` send the
   * first value; `throughput` gives connection i the value i.
   */
  perConnection?: { header: string; values: readonly string[] };
};

export type Throughput = {
  rps: number;
  p50Ms: number;
  p99Ms: number;
  requests: number;
  failures: number;
  /** A signed target's headers: signed before the run, and signed during it when a connection's ran out. */
  signed?: { before: number; during: number };
};

/**
 * Each target under load for `seconds` at `connections`, one after the other, not recorded (none when `seconds`
 * is 0): V8 compiles a server's hot code over its first thousands of requests, and a measurement of a fresh
 * server reads that. Without it `npm run bench`'s first round of two workers read 3,409 chats/s against 7,494
 * in its third (fortieth round), and each half of `bench:ab` read its first round about a quarter slower than
 * the next on both sides (forty-fifth round). A signed target signs during the run (no pool).
 */
export async function warmUp(
  targets: readonly Target[],
  seconds: number,
  connections: number,
  run: (target: Target, seconds: number, connections: number) => Promise<unknown> = throughput,
): Promise<void> {
  if (seconds <= 0) return;
  for (const target of targets) await run(target, seconds, connections);
}

/**
 * How many of a signed target's headers to sign for each connection before a throughput run of `seconds`,
 * when `rps` bounds what the target can serve (the same request with an API key, measured earlier in the same
 * round: a wallet's sign-in only adds work): 30% above that bound spread over the connections, plus `margin`
 * for each, since autocannon does not serve its connections evenly and each builds its next request before
 * the run stops. Without a bound (not measured, or nothing served), the margin alone; what runs short is
 * signed during the run and counted.
 */
export function headersPerConnection(rps: number, seconds: number, connections: number, margin = 16): number {
  const bound = Number.isFinite(rps) && rps > 0 && seconds > 0 ? Math.ceil(rps * seconds * 1.3) : 0;
  return Math.ceil(bound / Math.max(1, connections)) + margin;
}

/**
 * `connections` connections for `seconds`. A signed target (`Target.signed`) needs a signer per connection:
 * each connection signs with its own (a wallet has at most 5 paid requests in flight, so one wallet per
 * connection never meets that cap) and takes its headers from a pool of `presign` signed before the run starts,
 * so that signing does not compete with the server for the CPUs while it is measured; a connection whose pool
 * runs out signs during the run, and the result counts those.
 */
export async function throughput(
  target: Target,
  seconds: number,
  connections: number,
  options: { presign?: number } = {},
): Promise<Throughput> {
  const pools = target.signed ? signedPools(target.signed, connections, options.presign ?? 0) : undefined;
  const fixed = target.perConnection ? valuePerConnection(target.perConnection, connections) : undefined;
  const setupClient = pools?.setupClient ?? fixed;
  const result = await autocannon({
    url: target.url,
    method: target.method,
    headers: target.headers ?? {},
    ...(target.body === undefined ? {} : { body: target.body }),
    connections,
    duration: seconds,
    timeout: 30,
    ...(setupClient ? { setupClient } : {}),
  });
  return {
    rps: result.requests.average,
    p50Ms: result.latency.p50,
    p99Ms: result.latency.p99,
    requests: result['2xx'],
    failures: result.errors + result.timeouts + result.non2xx,
    ...(pools ? { signed: { before: pools.before, during: pools.during() } } : {}),
  };
}

/**
 * Each connection's signer and pool of headers, and autocannon's `setupClient` that hands them out
 * (`headerPerConnection`): a connection takes the next header of its pool, and signs one when it has run out.
 */
function signedPools(signed: NonNullable<Target['signed']>, connections: number, presign: number) {
  let during = 0;
  const pools = signed.signers.slice(0, connections).map((sign) => {
    const headers = Array.from({ length: presign }, () => sign());
    return () => {
      const value = headers.pop();
      if (value !== undefined) return value;
      during++;
      return sign();
    };
  });
  return {
    before: presign * pools.length,
    during: () => during,
    setupClient: headerPerConnection(signed.header, pools, signed.signers.length, connections, 'signers'),
  };
}

/**
 * autocannon's `setupClient` for a header of each connection's own (`Target.perConnection`): connection i sends
 * value i on every request.
 */
function valuePerConnection({ header, values }: NonNullable<Target['perConnection']>, connections: number) {
  const fixed = values.slice(0, connections).map((value) => () => value);
  return headerPerConnection(header, fixed, values.length, connections, `values of ${header}`);
}

/**
 * autocannon's `setupClient` that gives connection i the header `header` from `sources[i]`, called for every
 * request it sends (`available` of them for `connections`: one each, or it throws, naming them `what`).
 * autocannon calls `setupClient` once per connection, which replaces that connection's request with one whose
 * `setupRequest` sets the header. Not `setupRequest`'s `context`: with a single request it is reset before
 * every request, so it cannot tell connections apart.
 */
function headerPerConnection(
  header: string,
  sources: ReadonlyArray<() => string>,
  available: number,
  connections: number,
  what: string,
) {
  if (available < connections) {
    throw new Error(`${available} ${what} for ${connections} connections: one per connection`);
  }
  let next = 0;
  return (client: Client) => {
    const value = sources[next++ % sources.length];
    if (!value) throw new Error(`no ${what} for this connection`);
    client.setRequests([
      {
        setupRequest: (request) => {
          // A copy of the target's headers made for this request by autocannon: set in place.
          request.headers[header] = value();
          return request;
        },
      },
    ]);
  };
}

/**
 * The target's headers for one request: with a fresh signed header when it needs one (its first signer's), or
 * the first connection's value of a header per connection.
 */
function headersOf(target: Target): Record<string, string> | undefined {
  const sign = target.signed?.signers[0];
  if (target.signed && sign) return { ...target.headers, [target.signed.header]: sign() };
  const first = target.perConnection?.values[0];
  return target.perConnection && first !== undefined
    ? { ...target.headers, [target.perConnection.header]: first }
    : target.headers;
}

/** One request on a keep-alive agent (with `headers`, signed beforehand); resolves with the status and body. */
function send(
  agent: Agent,
  target: Target,
  headers = headersOf(target),
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const url = new URL(target.url);
    const req = request(
      {
        agent,
        host: url.hostname,
        port: url.port,
        path: url.pathname + url.search,
        method: target.method,
        headers: {
          ...(target.body === undefined
            ? {}
            : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(target.body) }),
          ...headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }),
        );
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(target.body);
  });
}

/** Sends one request and throws with its body unless it succeeds (the harness checks every target first). */
export async function probe(target: Target): Promise<string> {
  const agent = new Agent({ keepAlive: false });
  try {
    const { status, body } = await send(agent, target);
    if (status < 200 || status >= 300) throw new Error(`${target.method} ${target.url}: ${status} ${body}`);
    return body;
  } finally {
    agent.destroy();
  }
}

export type Latency = { p50Us: number; p99Us: number; count: number };

/** Requests per turn of `latencies` unless told. */
const DEFAULT_BLOCK = 100;

/** The `p`th percentile (0 to 100) of values sorted ascending; NaN for none. */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? 0;
}

/**
 * `count` sequential requests on one keep-alive connection after a warm-up on the same connection (`warmup`
 * requests, 50 unless told; then `afterWarmup`, awaited, before the first measured one); microseconds.
 */
export async function latency(
  target: Target,
  count: number,
  options: { warmup?: number; afterWarmup?: () => Promise<void> } = {},
): Promise<Latency> {
  const [result] = await latencies([target], count, options);
  if (!result) throw new Error('no latency measured');
  return result;
}

/**
 * How many requests `latencies` sends each of its `targets` after the warm-up: the measured `count`, and with
 * more than one target the uncounted first request of each turn of `block`.
 */
export function requestsServed(targets: number, count: number, block = DEFAULT_BLOCK): number {
  return targets > 1 ? count + Math.ceil(count / Math.max(1, block)) : count;
}

/**
 * `latency` of several targets measured together, taking turns (A B C A B C …) so that what the machine does
 * meanwhile (another process's burst, a compile in the background, a late flush) weighs on each of them alike,
 * as the "interleaved (A B A B)" asks: one keep-alive connection each, one request at a time, `block`
 * requests (100 unless told) per turn. The first request of a turn is not counted: it follows another
 * target's requests, whose process may still be finishing the last one's work (a proxy's capture after its
 * answer), and that overlap would favour the target whose turn ends. One target runs its `count` requests in a
 * single turn. Each target is warmed up on its own connection first (`warmup`), then `afterWarmup` runs.
 */
export async function latencies(
  targets: readonly Target[],
  count: number,
  options: { warmup?: number; block?: number; afterWarmup?: () => Promise<void> } = {},
): Promise<Latency[]> {
  // Each target with its own connection and samples.
  const runs = targets.map((target) => ({
    target,
    agent: new Agent({ keepAlive: true, maxSockets: 1 }),
    samples: [] as number[],
  }));
  const check = (target: Target, status: number) => {
    if (status < 200 || status >= 300) throw new Error(`${target.url} answered ${status}`);
  };
  try {
    const warmup = options.warmup ?? Math.min(50, count);
    for (const { target, agent } of runs) {
      for (let n = 0; n < warmup; n++) await send(agent, target);
    }
    await options.afterWarmup?.();
    const block = runs.length === 1 ? count : Math.max(1, options.block ?? DEFAULT_BLOCK);
    for (let done = 0; done < count; done += block) {
      const turn = Math.min(block, count - done);
      for (const { target, agent, samples } of runs) {
        if (runs.length > 1) check(target, (await send(agent, target)).status);
        for (let n = 0; n < turn; n++) {
          // A signed target's header is signed before the clock starts.
          const headers = headersOf(target);
          const start = process.hrtime.bigint();
          const { status } = await send(agent, target, headers);
          samples.push(Number(process.hrtime.bigint() - start) / 1000);
          check(target, status);
        }
      }
    }
    return runs.map(({ samples }) => {
      samples.sort((a, b) => a - b);
      return { p50Us: percentile(samples, 50), p99Us: percentile(samples, 99), count: samples.length };
    });
  } finally {
    for (const { agent } of runs) agent.destroy();
  }
}

export type Streams = {
  requested: number;
  /** Streams that ended with `data: [DONE]`. */
  completed: number;
  /** Most streams open at the same moment (first byte received, end not yet). */
  maxOpen: number;
  ttfbP50Ms: number;
  ttfbP99Ms: number;
  failures: number;
  /** One failure message, when there were failures. */
  firstFailure?: string;
};

/** Opens `count` streamed chats at once and follows each to its end. */
export async function streams(target: Target, count: number, timeoutMs: number): Promise<Streams> {
  const agent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });
  const url = new URL(target.url);
  const ttfb: number[] = [];
  let open = 0;
  let maxOpen = 0;
  let completed = 0;
  let failures = 0;
  let firstFailure: string | undefined;
  const fail = (message: string) => {
    failures++;
    firstFailure ??= message;
  };
  const one = () =>
    new Promise<void>((resolve) => {
      const start = process.hrtime.bigint();
      let first = true;
      let tail = '';
      const req = request(
        {
          agent,
          host: url.hostname,
          port: url.port,
          path: url.pathname,
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(target.body ?? ''),
            ...target.headers,
          },
          timeout: timeoutMs,
        },
        (res) => {
          if (res.statusCode !== 200) {
            let body = '';
            res.on('data', (c: Buffer) => {
              body += c.toString();
            });
            res.on('end', () => {
              fail(`status ${res.statusCode}: ${body.slice(0, 200)}`);
              resolve();
            });
            return;
          }
          res.on('data', (chunk: Buffer) => {
            if (first) {
              first = false;
              ttfb.push(Number(process.hrtime.bigint() - start) / 1e6);
              open++;
              maxOpen = Math.max(maxOpen, open);
            }
            tail = (tail + chunk.toString('utf8')).slice(-64);
          });
          res.on('end', () => {
            if (!first) open--;
            if (tail.includes('data: [DONE]')) completed++;
            else fail('stream ended without [DONE]');
            resolve();
          });
          res.on('error', (error) => {
            if (!first) open--;
            fail(error.message);
            resolve();
          });
        },
      );
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.on('error', (error) => {
        fail(error.message);
        resolve();
      });
      req.end(target.body);
    });
  try {
    await Promise.all(Array.from({ length: count }, one));
  } finally {
    agent.destroy();
  }
  ttfb.sort((a, b) => a - b);
  return {
    requested: count,
    completed,
    maxOpen,
    ttfbP50Ms: percentile(ttfb, 50),
    ttfbP99Ms: percentile(ttfb, 99),
    failures,
    ...(firstFailure ? { firstFailure } : {}),
  };
}

export function median(values: number[]): number {
  const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? (sorted[mid] ?? 0) : ((sorted[mid - 1] ?? 0) + (sorted[mid] ?? 0)) / 2;
}
