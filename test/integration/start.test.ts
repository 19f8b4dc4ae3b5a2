/**
 * `npm start` (`server/start.mjs`): the server compiled once at start and run without a TypeScript loader in
 * the process. It serves and streams like `server/main.ts` under tsx, its compiled modules keep their own
 * paths (the spec and the catalogue next to them are found), and outside production its stack traces map
 * back to the `.ts` sources. The build does not wrap functions in esbuild's `__name` (no `keepNames`), and it
 * runs on a worker thread (server/compile.mjs), never in the thread that then runs the server.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { threadId } from 'node:worker_threads';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import { compile } from '../../server/compile.mjs';
import { repoRoot } from '../support/contract.ts';
import { startServerProcess, stopServerProcesses } from '../support/server-process.ts';

const dir = mkdtempSync(join(tmpdir(), 'start-test-'));
afterEach(stopServerProcesses);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The build the launcher imported, as it names it on stderr. */
function buildOf(output: string): string {
  const path = /server\/start\.mjs: compiled in \d+ ms on worker thread [1-9]\d*: (\S+)/.exec(output)?.[1];
  expect(path).toBeDefined();
  return join(repoRoot, path ?? '');
}

describe('server/start.mjs', () => {
  test('behavior: serves the contract and streams a chat to [DONE], with source maps to the .ts files outside production', {
    timeout: 120_000,
  }, async () => {
    const secret = 'svc_admin_start_test_secret_0123456789abcdef';
    const server = await startServerProcess(
      { NODE_ENV: 'development', DATABASE_URL: `sqlite:${join(dir, 'dev.db')}`, ADMIN_API_KEY: secret },
      { launcher: true },
    );
    const models = await fetch(`${server.base}/models`);
    expect(models.status).toBe(200);
    const response = await fetch(`${server.base}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'llama-3.3-70b',
        stream: true,
        messages: [{ role: 'user', content: 'Write 20 words about rivers.' }],
      }),
    });
    expect(response.status).toBe(200);
    const data: string[] = [];
    for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>))
      data.push(event.data);
    expect(data.at(-1)).toBe('[DONE]');
    const text = data
      .slice(0, -1)
      .map(
        (d) => (JSON.parse(d) as { choices: { delta?: { content?: string } }[] }).choices[0]?.delta?.content,
      )
      .join('');
    expect(text).toMatch(/^\[local engine\] /);

    const build = buildOf(server.output());
    const map = JSON.parse(readFileSync(join(build, 'main.js.map'), 'utf8')) as { sources: string[] };
    expect(map.sources.map((s) => join(build, s))).toContain(join(repoRoot, 'server', 'main.ts'));
    server.signal('SIGTERM');
    expect(await server.exited).toBe(0);
  });

  test('behavior: with NODE_ENV=production the build carries no source maps', {
    timeout: 120_000,
  }, async () => {
    const server = await startServerProcess(
      {
        NODE_ENV: 'production',
        DATABASE_URL: `sqlite:${join(dir, 'prod.db')}`,
        ADMIN_API_KEY: 'svc_admin_start_prod_secret_0123456789abcdef',
      },
      { launcher: true },
    );
    expect((await fetch(`${server.base}/models`)).status).toBe(200);
    const build = buildOf(server.output());
    expect(existsSync(join(build, 'main.js'))).toBe(true);
    expect(existsSync(join(build, 'main.js.map'))).toBe(false);
    // No esbuild `keepNames` helper: it would define `name` on every closure the server makes per request.
    const modules = [
      join(build, 'main.js'),
      ...readdirSync(join(build, 'chunks')).map((f) => join(build, 'chunks', f)),
    ];
    expect(modules.filter((path) => readFileSync(path, 'utf8').includes('__name('))).toEqual([]);
  });

  test('behavior: compile builds a module of ours on a worker thread; the build imports and works', {
    timeout: 60_000,
  }, async () => {
    const logged: string[] = [];
    const url = await compile({
      entry: 'server/money.ts',
      name: 'start-test-money',
      sourceMaps: false,
      log: (message) => logged.push(message),
    });
    expect(url).toMatch(/\/node_modules\/\.cache\/service-api\/start-test-money-[0-9a-f]{16}\/money\.js$/);
    // Not the caller's thread: esbuild's API run there left Node's `process.nextTick` megamorphic.
    const thread = Number(/compiled in \d+ ms on worker thread (\d+): /.exec(logged.join('\n'))?.[1]);
    expect(thread).toBeGreaterThan(0);
    expect(thread).not.toBe(threadId);
    const money = (await import(url as string)) as typeof import('../../server/money.ts');
    expect(money.parseUsdToNano('1.5')).toBe(1_500_000_000n);
    rmSync(dirname(fileURLToPath(url as string)), { recursive: true, force: true });
    await expect(
      compile({ entry: 'server/no-such-module.ts', name: 'start-test-none', sourceMaps: false }),
    ).rejects.toThrow(/no-such-module/);
  });
});
