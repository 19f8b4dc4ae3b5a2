/**
 * `npm run bench:trace` reads the server through bench/trace-hooks.mjs, preloaded into the server as `npm start`
 * runs it: its request, statement and answer stamps must keep coming from the real server (a change in how it
 * runs its SQLite statements or writes its answers would otherwise leave the trace silently empty).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { latency } from '../../bench/measure.ts';
import { stopAll } from '../../bench/processes.ts';
import { catalogOverride, chatBody, fundedKey, json } from '../../bench/setup.ts';
import { analyseTrace, requestsOf } from '../../bench/trace-analysis.ts';
import { startTracedServer } from '../../bench/trace-server.ts';

const scratch = mkdtempSync(join(tmpdir(), 'bench-trace-'));

afterAll(async () => {
  await stopAll();
  rmSync(scratch, { recursive: true, force: true });
});

test('the hooks stamp each request of the real server: arrival, statements, answer, capture', async () => {
  const catalogPath = join(scratch, 'catalog.yaml');
  writeFileSync(catalogPath, catalogOverride('http://127.0.0.1:9'));
  const databaseUrl = `sqlite:${join(scratch, 'trace.db')}`;
  const key = await fundedKey(databaseUrl);
  const server = await startTracedServer({ databaseUrl, catalogPath, dumpFile: join(scratch, 'trace.json') });
  const measured = await latency(
    {
      url: `${server.origin}/api/v1/chat/completions`,
      method: 'POST',
      headers: json(key),
      body: chatBody('llama-3.3-70b', false, 4, 'Hi'),
    },
    12,
    // The stamps of the warm-up (and of the start) are dropped: the dump after it starts afresh.
    { warmup: 5, afterWarmup: async () => void (await server.dump()) },
  );
  expect(measured.count).toBe(12);
  const trace = await server.dump();
  const requests = requestsOf(trace);
  expect(requests).toHaveLength(12);
  for (const request of requests) {
    const labels = request.map((s) => s.label);
    // The reservation: one read of the account and its key, outside any transaction (held in memory:
    // held-reservations.ts, Database.readNow), before the answer's end; the reservation's row is the capture's
    // (the admission's counts are held by the process and written behind: held-counts.ts).
    const reserved = labels.indexOf('sql select accounts');
    expect(reserved).toBeGreaterThanOrEqual(0);
    expect(reserved).toBeLessThan(labels.indexOf('end'));
    const begun = labels.indexOf('sql begin immediate');
    if (begun >= 0) expect(begun).toBeGreaterThan(reserved);
    expect(labels.indexOf('end')).toBeLessThan(labels.indexOf('ended'));
    expect(labels).toContain('finish');
    // Every statement's stamp is followed by its end.
    labels.forEach((label, i) => {
      if (label.startsWith('sql ') && label !== 'sql done') expect(labels[i + 1]).toBe('sql done');
    });
    // In time order.
    for (let i = 1; i < request.length; i++)
      expect((request[i] as { at: number }).at).toBeGreaterThanOrEqual((request[i - 1] as { at: number }).at);
  }
  // The captures (two ledger entries in one statement each): after their answers, so a capture may be stamped
  // after the next request's arrival (the next request waits for it), and the last one after the dump.
  const captures = requests.flat().filter((s) => s.label === 'sql insert ledger_entries').length;
  expect(requests.flat().filter((s) => s.label === 'sql insert reservations').length).toBe(captures);
  expect(captures).toBeGreaterThanOrEqual(11);
  expect(captures).toBeLessThanOrEqual(12);
  const analysis = analyseTrace(trace);
  expect(analysis.requests).toBe(10);
  expect(analysis.steps.map((s) => s.step)).toContain('sql commit -> sql done');
});
