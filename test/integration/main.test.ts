/**
 * The server process as `npm start` runs it: first start on an empty database, a restart on the same one,
 * graceful shutdown on SIGTERM, and no secret in the logs.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Sqlite from 'better-sqlite3';
import { afterAll, afterEach, describe, expect, onTestFinished, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import { awayFromMinuteEdge } from '../support/clock.ts';
import { startServerProcess, stopServerProcesses } from '../support/server-process.ts';

const dir = mkdtempSync(join(tmpdir(), 'main-test-'));
afterEach(stopServerProcesses);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** `npm start` as an operator runs it (development mode, debug logs). */
const start = (env: Record<string, string>) =>
  startServerProcess({ NODE_ENV: 'development', LOG_LEVEL: 'debug', ...env });

describe('server/main.ts', () => {
  test('behavior: first start prints an ADMIN key once, credits the bootstrap balance; a restart does neither', {
    timeout: 90_000,
  }, async () => {
    const env = { DATABASE_URL: `sqlite:${join(dir, 'first.db')}`, BOOTSTRAP_BALANCE_USD: '7.5' };
    const first = await start(env);
    const secret = /ADMIN_API_KEY=(svc_admin_\w+)/.exec(first.output())?.[1];
    expect(secret).toBeDefined();
    const balance = await fetch(`${first.base}/billing/balance`, {
      headers: { authorization: `Bearer ${secret}` },
    });
    expect(await balance.json()).toMatchObject({ balances: { usd: 7.5 } });
    first.signal('SIGTERM');
    expect(await first.exited).toBe(0);
    expect(first.output()).toContain('"msg":"stopped"');
    // The secret is printed once for the operator and never written by the logger.
    const logLines = first
      .output()
      .split('\n')
      .filter((l) => l.startsWith('{'));
    expect(logLines.length).toBeGreaterThan(2);
    expect(logLines.join('\n')).not.toContain(secret);

    const second = await start(env);
    expect(second.output()).not.toContain('ADMIN_API_KEY=');
    const again = await fetch(`${second.base}/billing/balance`, {
      headers: { authorization: `Bearer ${secret}` },
    });
    expect(await again.json()).toMatchObject({ balances: { usd: 7.5 } });
    second.signal('SIGINT');
    expect(await second.exited).toBe(0);
  });

  test('behavior: SIGTERM drains a request that is still in flight before exiting', {
    timeout: 90_000,
  }, async () => {
    const secret = 'svc_admin_drain_test_secret_0123456789abcdef';
    const server = await start({
      DATABASE_URL: `sqlite:${join(dir, 'drain.db')}`,
      ADMIN_API_KEY: secret,
      SHUTDOWN_GRACE_MS: '8000',
    });
    const { hostname: host, port } = new URL(server.base);
    const body = JSON.stringify({ apiKeyType: 'INFERENCE', description: 'Created during shutdown' });
    const socket = connect(Number(port), host);
    onTestFinished(() => {
      socket.destroy();
    });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('error', reject);
    });
    let response = '';
    socket.on('data', (d: Buffer) => {
      response += d.toString();
    });
    // Headers and half of the body: the request is in flight when the signal arrives.
    socket.write(
      `POST /api/v1/api_keys HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${secret}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n` +
        body.slice(0, 10),
    );
    await new Promise((r) => setTimeout(r, 200));
    server.signal('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    expect(server.exitCode()).toBeNull();
    socket.write(body.slice(10));
    const code = await server.exited;
    expect(code).toBe(0);
    expect(response).toMatch(/^HTTP\/1\.1 200/);
    expect(response).toContain('svc_inference_');
    // Every request's log line carries its CF-RAY id.
    const line = server
      .output()
      .split('\n')
      .find((l) => l.includes('"msg":"request"') && l.includes('/api_keys'));
    const cfRay = /CF-RAY: (\S+)/i.exec(response)?.[1];
    expect(line).toContain(`"cfRay":"${cfRay}"`);
  });

  test('behavior: SIGTERM lets an open chat stream finish with its usage chunk and [DONE] before exiting', {
    timeout: 90_000,
  }, async () => {
    const secret = 'svc_admin_drain_stream_secret_0123456789abcdef';
    const server = await start({
      DATABASE_URL: `sqlite:${join(dir, 'drain-stream.db')}`,
      ADMIN_API_KEY: secret,
      SHUTDOWN_GRACE_MS: '30000',
      LOCAL_CHAT_TOKEN_DELAY_MS: '5',
    });
    const response = await fetch(`${server.base}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'llama-3.3-70b',
        stream: true,
        messages: [{ role: 'user', content: 'Write 150 words about rivers.' }],
      }),
    });
    expect(response.status).toBe(200);
    const events = readSseEvents(response.body as ReadableStream<Uint8Array>)[Symbol.asyncIterator]();
    const first = await events.next();
    expect(first.done).toBe(false);
    server.signal('SIGTERM');
    const rest: string[] = [];
    for (let next = await events.next(); !next.done; next = await events.next()) rest.push(next.value.data);
    expect(rest.at(-1)).toBe('[DONE]');
    const final = JSON.parse(rest.at(-2) ?? '{}') as {
      choices: unknown[];
      usage?: { completion_tokens: number };
    };
    expect(final.choices).toEqual([]);
    expect(final.usage?.completion_tokens).toBeGreaterThan(150);
    expect(await server.exited).toBe(0);
    expect(server.output()).toContain('"msg":"draining"');
  });

  test('behavior: an invalid configuration stops the start with every problem listed', {
    timeout: 30_000,
  }, async () => {
    const server = await startServerProcess(
      { PORT: 'eighty', DATABASE_URL: 'mysql://nope' },
      { listening: 0 },
    );
    const code = await server.exited;
    const err = server.output();
    expect(code).toBe(2);
    expect(err).toContain('PORT');
    expect(err).toContain('DATABASE_URL');
  });

  test('behavior: the rate-limit counts one process holds reach their rows at SIGTERM, and a restart goes on from them', {
    timeout: 90_000,
  }, async () => {
    await awayFromMinuteEdge();
    const secret = 'svc_admin_held_counts_secret_0123456789ab';
    const file = join(dir, 'held.db');
    // Written only at shutdown within this test: the interval is longer than it runs.
    const env = {
      DATABASE_URL: `sqlite:${file}`,
      ADMIN_API_KEY: secret,
      SQLITE_RATE_LIMIT_FLUSH_MS: '60000',
    };
    const remaining = async (base: string) => {
      const answer = await fetch(`${base}/billing/balance`, {
        headers: { authorization: `Bearer ${secret}` },
      });
      expect(answer.status).toBe(200);
      return Number(answer.headers.get('x-ratelimit-remaining-requests'));
    };
    const counted = () => {
      const sqlite = new Sqlite(file, { readonly: true });
      try {
        const row = sqlite
          .prepare("select sum(used) as used from rate_limit_counters where bucket like '%:manage:RPM'")
          .get() as { used: number | null };
        return row.used ?? 0;
      } finally {
        sqlite.close();
      }
    };
    const minute = Math.floor(Date.now() / 60_000);
    const first = await start(env);
    const before = [await remaining(first.base), await remaining(first.base), await remaining(first.base)];
    expect(before[1]).toBe((before[0] as number) - 1);
    expect(counted()).toBe(0);
    first.signal('SIGTERM');
    expect(await first.exited).toBe(0);
    expect(counted()).toBe(3);
    const second = await start(env);
    const after = await remaining(second.base);
    // The restart read the minute's count from its row (unless a new minute began meanwhile).
    if (Math.floor(Date.now() / 60_000) === minute) expect(after).toBe((before[2] as number) - 1);
    second.signal('SIGTERM');
    expect(await second.exited).toBe(0);
    expect(counted()).toBe(4);
  });
});
