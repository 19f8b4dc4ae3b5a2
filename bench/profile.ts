/**
 * `npm run bench:profile -- [chat|models|rpc] [outDir]`: a CPU profile of the server under load, to find what to
 * make faster. Starts the server on a fresh SQLite file with `node --cpu-prof` (production settings, limits
 * out of the way, as the benchmark does), loads it with autocannon for PROFILE_SECONDS (default 20), stops it
 * by its pid and leaves the `.cpuprofile` in outDir (default bench/results/profile) for Chrome DevTools or
 * `node bench/profile-summary.mjs <outDir>`.
 *
 * PROFILE_PERF=1: Linux `perf` instead of V8's profiler (as bench/perf.sh does for one request at a time, but
 * under load, where commits are shared and the framework's share grows): the server runs with
 * `--perf-basic-prof`, is loaded for PROFILE_WARMUP_SECONDS (default 3) first, then sampled at 10 kHz with
 * call chains over the measured load; its main thread's samples are summed by bench/perf-summary.mjs, per
 * request answered (PERF_FUNCTION and PERF_TOP as there). `perf.txt` stays in outDir.
 *
 * PROFILE_DATABASE=postgres: the server on a throwaway embedded PostgreSQL (test/support/postgres.ts) instead
 * of a SQLite file, stopped with it.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import autocannon from 'autocannon';
import { startAnvil } from '../test/support/anvil.ts';
import { repoRoot } from '../test/support/contract.ts';
import { startPostgres } from '../test/support/postgres.ts';
import { freePort, stopPid } from '../test/support/process.ts';
import { catalogOverride, fundedKey } from './setup.ts';

const target = (['models', 'rpc'] as const).find((t) => t === process.argv[2]) ?? 'chat';
const outDir = resolve(process.argv[3] ?? join(repoRoot, 'bench', 'results', 'profile'));
const seconds = Number(process.env.PROFILE_SECONDS ?? 20);
const scratch = mkdtempSync(join(tmpdir(), 'svc-profile-'));
const postgres = process.env.PROFILE_DATABASE === 'postgres' ? await startPostgres() : undefined;
const url = postgres ? await postgres.createDatabase('profile') : `sqlite:${join(scratch, 'db.sqlite')}`;
const catalogPath = join(scratch, 'catalog.yaml');
writeFileSync(catalogPath, catalogOverride('http://127.0.0.1:9'));
const key = await fundedKey(url);
const anvil = target === 'rpc' ? await startAnvil() : undefined;
const port = await freePort();
const withPerf = process.env.PROFILE_PERF === '1';
const warmupSeconds = Number(process.env.PROFILE_WARMUP_SECONDS ?? 3);
mkdirSync(outDir, { recursive: true });
// --perf-basic-prof turns V8's log on too: given no file of its own (here in the scratch folder) it writes
// isolate-*.log files into the working folder.
const profiler = withPerf
  ? ['--perf-basic-prof', '--no-logfile-per-isolate', `--logfile=${join(scratch, 'v8.log')}`]
  : ['--cpu-prof', `--cpu-prof-dir=${outDir}`];
const child = spawn(process.execPath, [...profiler, 'server/start.mjs'], {
  cwd: repoRoot,
  stdio: 'inherit',
  env: {
    PATH: process.env.PATH ?? '',
    NODE_ENV: 'production',
    LOG_LEVEL: 'warn',
    DATABASE_URL: url,
    PORT: String(port),
    SERVICE_CONFIG: catalogPath,
    VIDEO_WORKER_ENABLED: 'false',
    RPC_REQUESTS_PER_MINUTE: '1000000000',
    RPC_CREDITS_PER_DAY: '1000000000000',
    ...(anvil ? { RPC_UPSTREAM_BASE_MAINNET: anvil.url } : {}),
  },
});
const pid = child.pid;
let recorder: ChildProcess | undefined;
try {
  if (pid === undefined) throw new Error('the server did not start');
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/healthz`)).ok) break;
    } catch {}
    if (i > 300) throw new Error('the server did not answer /healthz');
    await new Promise((r) => setTimeout(r, 200));
  }
  const base = `http://127.0.0.1:${port}/api/v1`;
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${key}` };
  const request =
    target === 'models'
      ? { url: `${base}/models` }
      : target === 'rpc'
        ? {
            url: `${base}/crypto/rpc/base-mainnet`,
            method: 'POST' as const,
            headers,
            body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] }),
          }
        : {
            url: `${base}/chat/completions`,
            method: 'POST' as const,
            headers,
            body: JSON.stringify({
              model: 'llama-3.3-70b',
              messages: [{ role: 'user', content: 'Say hello to the benchmark.' }],
              max_tokens: 16,
            }),
          };
  const load = (duration: number) => autocannon({ ...request, connections: 8, duration });
  if (withPerf) await load(warmupSeconds);
  recorder = withPerf ? startPerf(pid, join(outDir, 'perf.data')) : undefined;
  const result = await load(seconds);
  if (recorder) await stopPerf(recorder);
  recorder = undefined;
  console.log(`${target}: ${result.requests.average} req/s, ${result.non2xx} non-2xx; profile in ${outDir}`);
  if (withPerf) summarisePerf(pid, outDir, result.requests.total);
} finally {
  if (recorder) await stopPerf(recorder);
  if (pid !== undefined) await stopPid(pid, 10_000);
  if (withPerf && pid !== undefined) rmSync(`/tmp/perf-${pid}.map`, { force: true });
  await anvil?.stop();
  await postgres?.stop();
  rmSync(scratch, { recursive: true, force: true });
}

/** `perf record` of the process's threads, call chains at 10 kHz, into `file`. */
function startPerf(pid: number, file: string): ChildProcess {
  return spawn(
    'perf',
    ['record', '-q', '-e', 'cpu-clock', '-F', '10000', '-g', '-p', String(pid), '-o', file],
    {
      stdio: 'ignore',
    },
  );
}

/** Stops the recording (SIGINT: perf writes its file out) and waits for it. */
function stopPerf(recorder: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (recorder.exitCode !== null || recorder.signalCode !== null) return resolve();
    recorder.once('exit', () => resolve());
    recorder.kill('SIGINT');
  });
}

/** The main thread's samples summed per request (bench/perf-report.sh, as perf.sh does). */
function summarisePerf(pid: number, outDir: string, requests: number) {
  const script = join(repoRoot, 'bench', 'perf-report.sh');
  const args = [String(pid), join(outDir, 'perf.data'), join(outDir, 'perf.txt'), String(requests)];
  spawnSync('bash', [script, ...args], { stdio: 'inherit' });
}
