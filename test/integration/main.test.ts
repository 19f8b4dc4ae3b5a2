/**
 * The server process as `npm start` runs it: first start on an empty database, a restart on the same one,
 * graceful shutdown on SIGTERM, and no secret in the logs.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, onTestFinished, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import { repoRoot } from '../support/contract.ts';

const dir = mkdtempSync(join(tmpdir(), 'main-test-'));
const running = new Set<ChildProcess>();
afterEach(() => {
  for (const child of running) child.kill('SIGKILL');
  running.clear();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Started = { child: ChildProcess; url: string; output: () => string; exit: Promise<number | null> };

async function start(env: Record<string, string>): Promise<Started> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(repoRoot, 'server', 'main.ts')], {
    cwd: repoRoot,
    env: { ...process.env, NODE_ENV: 'development', PORT: '0', LOG_LEVEL: 'debug', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(child);
  let out = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const exit = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const line = out.split('\n').find((l) => l.includes('"msg":"listening"'));
    if (line) return { child, url: (JSON.parse(line) as { url: string }).url, output: () => out, exit };
    if (child.exitCode !== null) throw new Error(`server exited early:\n${out}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`server did not start:\n${out}`);
}

describe('server/main.ts', () => {
  test('behavior: first start prints an ADMIN key once, credits the bootstrap balance; a restart does neither', {
    timeout: 90_000,
  }, async () => {
    const env = { DATABASE_URL: `sqlite:${join(dir, 'first.db')}`, BOOTSTRAP_BALANCE_USD: '7.5' };
    const first = await start(env);
    const secret = /ADMIN_API_KEY=(svc_admin_\w+)/.exec(first.output())?.[1];
    expect(secret).toBeDefined();
    const balance = await fetch(`${first.url}/billing/balance`, {
      headers: { authorization: `Bearer ${secret}` },
    });
    expect(await balance.json()).toMatchObject({ balances: { usd: 7.5 } });
    first.child.kill('SIGTERM');
    expect(await first.exit).toBe(0);
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
    const again = await fetch(`${second.url}/billing/balance`, {
      headers: { authorization: `Bearer ${secret}` },
    });
    expect(await again.json()).toMatchObject({ balances: { usd: 7.5 } });
    second.child.kill('SIGINT');
    expect(await second.exit).toBe(0);
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
    const { hostname: host, port } = new URL(server.url);
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
    server.child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    expect(server.child.exitCode).toBeNull();
    socket.write(body.slice(10));
    const code = await server.exit;
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
    const response = await fetch(`${server.url}/chat/completions`, {
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
    server.child.kill('SIGTERM');
    const rest: string[] = [];
    for (let next = await events.next(); !next.done; next = await events.next()) rest.push(next.value.data);
    expect(rest.at(-1)).toBe('[DONE]');
    const final = JSON.parse(rest.at(-2) ?? '{}') as {
      choices: unknown[];
      usage?: { completion_tokens: number };
    };
    expect(final.choices).toEqual([]);
    expect(final.usage?.completion_tokens).toBeGreaterThan(150);
    expect(await server.exit).toBe(0);
    expect(server.output()).toContain('"msg":"draining"');
  });

  test('behavior: an invalid configuration stops the start with every problem listed', {
    timeout: 30_000,
  }, async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', join(repoRoot, 'server', 'main.ts')], {
      cwd: repoRoot,
      env: { ...process.env, PORT: 'eighty', DATABASE_URL: 'mysql://nope' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    running.add(child);
    let err = '';
    child.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
    });
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    expect(code).toBe(2);
    expect(err).toContain('PORT');
    expect(err).toContain('DATABASE_URL');
  });
});
