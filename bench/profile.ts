/**
 * `npm run bench:profile -- [chat|models|rpc] [outDir]`: a CPU profile of the server under load, to find what to
 * make faster. Starts the server on a fresh SQLite file with `node --cpu-prof` (production settings, limits
 * out of the way, as the benchmark does), loads it with autocannon for PROFILE_SECONDS (default 20), stops it
 * by its pid and leaves the `.cpuprofile` in outDir (default bench/results/profile) for Chrome DevTools or
 * `node bench/profile-summary.mjs <outDir>`.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import autocannon from 'autocannon';
import { startAnvil } from '../test/support/anvil.ts';
import { repoRoot } from '../test/support/contract.ts';
import { freePort, stopPid } from '../test/support/process.ts';
import { catalogOverride, fundedKey } from './setup.ts';

const target = (['models', 'rpc'] as const).find((t) => t === process.argv[2]) ?? 'chat';
const outDir = resolve(process.argv[3] ?? join(repoRoot, 'bench', 'results', 'profile'));
const seconds = Number(process.env.PROFILE_SECONDS ?? 20);
const scratch = mkdtempSync(join(tmpdir(), 'svc-profile-'));
const url = `sqlite:${join(scratch, 'db.sqlite')}`;
const catalogPath = join(scratch, 'catalog.yaml');
writeFileSync(catalogPath, catalogOverride('http://127.0.0.1:9'));
const key = await fundedKey(url);
const anvil = target === 'rpc' ? await startAnvil() : undefined;
const port = await freePort();
const child = spawn(
  process.execPath,
  ['--cpu-prof', `--cpu-prof-dir=${outDir}`, '--import', 'tsx', 'server/main.ts'],
  {
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
  },
);
const pid = child.pid;
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
  const result = await autocannon(
    target === 'models'
      ? { url: `${base}/models`, connections: 8, duration: seconds }
      : target === 'rpc'
        ? {
            url: `${base}/crypto/rpc/base-mainnet`,
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
            body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] }),
            connections: 8,
            duration: seconds,
          }
        : {
            url: `${base}/chat/completions`,
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
            body: JSON.stringify({
              model: 'llama-3.3-70b',
              messages: [{ role: 'user', content: 'Say hello to the benchmark.' }],
              max_tokens: 16,
            }),
            connections: 8,
            duration: seconds,
          },
  );
  console.log(`${target}: ${result.requests.average} req/s, ${result.non2xx} non-2xx; profile in ${outDir}`);
} finally {
  if (pid !== undefined) await stopPid(pid, 10_000);
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
}
