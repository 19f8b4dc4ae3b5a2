/**
 * `npm run bench:trace` reads the server through bench/trace-hooks.mjs, preloaded into the server as `npm start`
 * runs it: its request, statement and answer stamps must keep coming from the real server (a change in how it
 * runs its SQLite statements or writes its answers would otherwise leave the trace silently empty).
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { latency } from '../../bench/measure.ts';
import { startNodeChild, stopAll } from '../../bench/processes.ts';
import { catalogOverride, fundedKey } from '../../bench/setup.ts';
import { analyseTrace, requestsOf, type TraceDump } from '../../bench/trace-analysis.ts';
import { repoRoot } from '../support/contract.ts';

const scratch = mkdtempSync(join(tmpdir(), 'bench-trace-'));

afterAll(async () => {
  await stopAll();
  rmSync(scratch, { recursive: true, force: true });
});

test('the hooks stamp each request of the real server: arrival, statements, answer, capture', async () => {
  const dumpFile = join(scratch, 'trace.json');
  const catalogPath = join(scratch, 'catalog.yaml');
  writeFileSync(catalogPath, catalogOverride('http://127.0.0.1:9'));
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
      TRACE_OUT: dumpFile,
    },
    '/healthz',
    ['--import', join(repoRoot, 'bench', 'trace-hooks.mjs')],
  );
  const dump = async (): Promise<TraceDump> => {
    rmSync(dumpFile, { force: true });
    process.kill(server.pid, 'SIGUSR2');
    for (let i = 0; i < 100 && !existsSync(dumpFile); i++) await new Promise((r) => setTimeout(r, 50));
    return JSON.parse(readFileSync(dumpFile, 'utf8')) as TraceDump;
  };
  const measured = await latency(
    {
      url: `${server.origin}/api/v1/chat/completions`,
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: JSON.stringify({
        model: 'llama-3.3-70b',
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 4,
      }),
    },
    12,
    // The stamps of the warm-up (and of the start) are dropped: the dump after it starts afresh.
    { warmup: 5, afterWarmup: async () => void (await dump()) },
  );
  expect(measured.count).toBe(12);
  const trace = await dump();
  const requests = requestsOf(trace);
  expect(requests).toHaveLength(12);
  for (const request of requests) {
    const labels = request.map((s) => s.label);
    // Admission's count, the reservation's transaction, the answer, and the capture's transaction after it.
    expect(labels).toContain('sql insert rate_limit_counters');
    expect(labels).toContain('sql insert reservations');
    expect(labels).toContain('sql insert ledger_entries');
    expect(labels.filter((l) => l === 'sql commit')).toHaveLength(2);
    expect(labels.indexOf('end')).toBeLessThan(labels.indexOf('ended'));
    expect(labels.indexOf('sql insert reservations')).toBeLessThan(labels.indexOf('end'));
    expect(labels).toContain('finish');
    // Every statement's stamp is followed by its end.
    labels.forEach((label, i) => {
      if (label.startsWith('sql ') && label !== 'sql done') expect(labels[i + 1]).toBe('sql done');
    });
    // In time order.
    for (let i = 1; i < request.length; i++)
      expect((request[i] as { at: number }).at).toBeGreaterThanOrEqual((request[i - 1] as { at: number }).at);
  }
  const analysis = analyseTrace(trace);
  expect(analysis.requests).toBe(10);
  expect(analysis.steps.map((s) => s.step)).toContain('sql commit -> sql done');
});
