/**
 * The server process as `npm start` runs it: first start on an empty database, a restart on the same one,
 * graceful shutdown on SIGTERM, and no secret in the logs.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
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
