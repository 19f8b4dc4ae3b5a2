/**
 * `npm run bench:trace -- [upstream|rpc|chat] [count]`: where one request's time goes inside the server, step by
 * step, with the client in another process as `npm run bench` measures it. Starts the server as `npm start`
 * does, with bench/trace-hooks.mjs preloaded (stamps at the request's arrival, each SQLite statement, the
 * upstream call, the answer's writes and its end; no line of the server changed), a local upstream (the chat
 * upstream adapter's, `upstream`, the default) or anvil (`rpc`) or neither (`chat`: a non-streamed chat on the
 * local engine); warms it up with TRACE_WARMUP requests (default 3000) on the measured connection, then sends
 * `count` (default 5000) one at a time and prints the analysis (bench/trace-analysis.ts) as markdown, with the
 * target measured directly for comparison. The stamps cost a few µs per request; the steps' sizes, not the
 * total, are what it is for.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startAnvil } from '../test/support/anvil.ts';
import { repoRoot } from '../test/support/contract.ts';
import { latency, type Target } from './measure.ts';
import { type Child, startNodeChild, stopAll, track } from './processes.ts';
import { catalogOverride, fundedKey } from './setup.ts';
import { analyseTrace, renderTrace, type TraceDump } from './trace-analysis.ts';

const kind = (['rpc', 'chat'] as const).find((k) => k === process.argv[2]) ?? 'upstream';
const count = Number(process.argv[3] ?? 5000);
const warmup = Number(process.env.TRACE_WARMUP ?? 3000);
const scratch = mkdtempSync(join(tmpdir(), 'svc-trace-'));
const dumpFile = join(scratch, 'trace.json');
const log = (message: string) => process.stderr.write(`[trace] ${message}\n`);

/** SIGUSR2 to the server, then the dump it writes. */
async function dumpOf(server: Child): Promise<TraceDump> {
  rmSync(dumpFile, { force: true });
  process.kill(server.pid, 'SIGUSR2');
  for (let i = 0; i < 100 && !existsSync(dumpFile); i++) await new Promise((r) => setTimeout(r, 50));
  // The file is written at once (writeFileSync): present means complete, but give it a moment to be flushed.
  await new Promise((r) => setTimeout(r, 100));
  return JSON.parse(readFileSync(dumpFile, 'utf8')) as TraceDump;
}

try {
  const upstream =
    kind === 'upstream' ? await startNodeChild('upstream', 'bench/upstream.ts', {}, '/') : undefined;
  const anvil = kind === 'rpc' ? await startAnvil() : undefined;
  if (anvil) track(anvil.pid, () => anvil.stop());
  const catalogPath = join(scratch, 'catalog.yaml');
  writeFileSync(catalogPath, catalogOverride(upstream?.origin ?? 'http://127.0.0.1:9'));
  const url = `sqlite:${join(scratch, 'trace.db')}`;
  const key = await fundedKey(url);
  const server = await startNodeChild(
    'server (traced)',
    'server/start.mjs',
    {
      NODE_ENV: 'production',
      LOG_LEVEL: 'warn',
      DATABASE_URL: url,
      ADMIN_API_KEY: `svc_admin_${randomBytes(24).toString('hex')}`,
      SERVICE_CONFIG: catalogPath,
      LOCAL_CHAT_TOKEN_DELAY_MS: '0',
      VIDEO_WORKER_ENABLED: 'false',
      RPC_REQUESTS_PER_MINUTE: '1000000000',
      RPC_CREDITS_PER_DAY: '1000000000000',
      ...(anvil ? { RPC_UPSTREAM_BASE_MAINNET: anvil.url } : {}),
      TRACE_OUT: dumpFile,
    },
    '/healthz',
    ['--import', join(repoRoot, 'bench', 'trace-hooks.mjs')],
  );
  const headers = (secret?: string) => ({
    'content-type': 'application/json',
    ...(secret ? { authorization: `Bearer ${secret}` } : {}),
  });
  const chat = (model: string, stream: boolean) =>
    JSON.stringify({
      model,
      messages: [{ role: 'user', content: 'Say hello to the benchmark.' }],
      max_tokens: 16,
      ...(stream ? { stream: true } : {}),
    });
  const rpcBody = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] });
  const api = `${server.origin}/api/v1`;
  const [traced, direct]: [Target, Target | undefined] =
    kind === 'rpc'
      ? [
          { url: `${api}/crypto/rpc/base-mainnet`, method: 'POST', headers: headers(key), body: rpcBody },
          { url: anvil?.url ?? '', method: 'POST', headers: headers(), body: rpcBody },
        ]
      : kind === 'upstream'
        ? [
            {
              url: `${api}/chat/completions`,
              method: 'POST',
              headers: headers(key),
              body: chat('bench-upstream', true),
            },
            {
              url: `${upstream?.origin}/v1/chat/completions`,
              method: 'POST',
              headers: headers(),
              body: chat('bench-upstream', true),
            },
          ]
        : [
            {
              url: `${api}/chat/completions`,
              method: 'POST',
              headers: headers(key),
              body: chat('llama-3.3-70b', false),
            },
            undefined,
          ];
  log(`${kind}: ${warmup} requests of warm-up, then ${count} traced`);
  const measured = await latency(traced, count, {
    warmup,
    afterWarmup: async () => {
      await dumpOf(server);
    },
  });
  const analysis = analyseTrace(await dumpOf(server));
  const baseline = direct ? await latency(direct, Math.min(count, 3000)) : undefined;
  process.stdout.write(
    renderTrace(
      analysis,
      `Trace: ${kind === 'upstream' ? 'chat upstream adapter (streamed)' : kind === 'rpc' ? 'JSON-RPC proxy' : 'chat, local engine'}`,
    ),
  );
  process.stdout.write(
    `- Client's view: p50 ${measured.p50Us.toFixed(0)} µs, p99 ${measured.p99Us.toFixed(0)} µs` +
      (baseline
        ? `; the upstream directly p50 ${baseline.p50Us.toFixed(0)} µs, p99 ${baseline.p99Us.toFixed(0)} µs.\n`
        : '.\n'),
  );
} finally {
  await stopAll();
  rmSync(scratch, { recursive: true, force: true });
}
