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
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startAnvil } from '../test/support/anvil.ts';
import { latency, type Target } from './measure.ts';
import { startNodeChild, stopAll, track } from './processes.ts';
import { catalogOverride, chatBody, fundedKey, json, RPC_BODY } from './setup.ts';
import { analyseTrace, renderTrace } from './trace-analysis.ts';
import { startTracedServer } from './trace-server.ts';

const kinds = ['upstream', 'rpc', 'chat'] as const;
const kind = kinds.find((k) => k === (process.argv[2] ?? 'upstream'));
const count = Number(process.argv[3] ?? 5000);
const warmup = Number(process.env.TRACE_WARMUP ?? 3000);
if (!kind || !Number.isSafeInteger(count) || count < 100 || !Number.isSafeInteger(warmup) || warmup < 0) {
  process.stderr.write(
    'usage: npm run bench:trace -- [upstream|rpc|chat] [count >= 100]  (TRACE_WARMUP: warm-up requests, >= 0)\n',
  );
  process.exit(2);
}
const scratch = mkdtempSync(join(tmpdir(), 'svc-trace-'));
const log = (message: string) => process.stderr.write(`[trace] ${message}\n`);

try {
  const upstream =
    kind === 'upstream' ? await startNodeChild('upstream', 'bench/upstream.ts', {}, '/') : undefined;
  const anvil = kind === 'rpc' ? await startAnvil() : undefined;
  if (anvil) track(anvil.pid, () => anvil.stop());
  const catalogPath = join(scratch, 'catalog.yaml');
  writeFileSync(catalogPath, catalogOverride(upstream?.origin ?? 'http://127.0.0.1:9'));
  const databaseUrl = `sqlite:${join(scratch, 'trace.db')}`;
  const key = await fundedKey(databaseUrl);
  const server = await startTracedServer({
    databaseUrl,
    catalogPath,
    dumpFile: join(scratch, 'trace.json'),
    env: anvil ? { RPC_UPSTREAM_BASE_MAINNET: anvil.url } : {},
  });
  const api = `${server.origin}/api/v1`;
  const [traced, direct]: [Target, Target | undefined] =
    kind === 'rpc'
      ? [
          { url: `${api}/crypto/rpc/base-mainnet`, method: 'POST', headers: json(key), body: RPC_BODY },
          { url: anvil?.url ?? '', method: 'POST', headers: json(), body: RPC_BODY },
        ]
      : kind === 'upstream'
        ? [
            {
              url: `${api}/chat/completions`,
              method: 'POST',
              headers: json(key),
              body: chatBody('bench-upstream', true, 16),
            },
            {
              url: `${upstream?.origin}/v1/chat/completions`,
              method: 'POST',
              headers: json(),
              body: chatBody('bench-upstream', true, 16),
            },
          ]
        : [
            {
              url: `${api}/chat/completions`,
              method: 'POST',
              headers: json(key),
              body: chatBody('llama-3.3-70b', false, 16),
            },
            undefined,
          ];
  log(`${kind}: ${warmup} requests of warm-up, then ${count} traced`);
  const measured = await latency(traced, count, {
    warmup,
    afterWarmup: async () => {
      await server.dump();
    },
  });
  const analysis = analyseTrace(await server.dump());
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
