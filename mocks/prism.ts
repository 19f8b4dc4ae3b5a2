/**
 * Runs Prism (`@stoplight/prism-cli`) as a child process: `mock` mode for the frontend mocks, `proxy` mode as
 * an independent contract validator in front of the real server (`--errors`: a response that violates the
 * spec becomes a 500 `application/problem+json` listing the violations). Readiness is detected by polling the
 * port (Prism prints nothing at quiet log levels); a child that fails to start is killed, and `stop()` ends it
 * by its pid.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { type AddressInfo, connect } from 'node:net';
import { dirname, join } from 'node:path';

export type PrismOptions = {
  mode: 'mock' | 'proxy';
  specPath: string;
  host: string;
  /** The server to proxy to (proxy mode), e.g. `http://127.0.0.1:3000/api/v1`. */
  upstream?: string;
  /** Extra command-line arguments. */
  args?: string[];
  log?: (line: string) => void;
  startTimeoutMs?: number;
};

export type RunningPrism = { url: string; port: number; pid: number; stop(): Promise<void> };

export async function startPrism(options: PrismOptions): Promise<RunningPrism> {
  const port = await freePort(options.host);
  const require = createRequire(import.meta.url);
  const pkgPath = require.resolve('@stoplight/prism-cli/package.json');
  const pkg = JSON.parse(readFileSync(pkgPath, 'utf8')) as { bin: string | Record<string, string> };
  const binRel = typeof pkg.bin === 'string' ? pkg.bin : (pkg.bin.prism ?? Object.values(pkg.bin)[0]);
  if (!binRel) throw new Error('@stoplight/prism-cli has no bin entry');
  const target = options.mode === 'proxy' ? [options.specPath, requireUpstream(options)] : [options.specPath];
  const child = spawn(
    process.execPath,
    [
      join(dirname(pkgPath), binRel),
      options.mode,
      ...target,
      '--host',
      options.host,
      '--port',
      String(port),
      '--errors',
      ...(options.args ?? []),
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const log = options.log ?? (() => {});
  const forwardLines = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) log(`prism: ${line}`);
  };
  child.stdout?.on('data', forwardLines);
  child.stderr?.on('data', forwardLines);
  try {
    await waitForPort(options.host, port, child, options.startTimeoutMs ?? 60_000);
  } catch (error) {
    await stopChild(child);
    throw error;
  }
  const pid = child.pid;
  if (pid === undefined) throw new Error('Prism did not start');
  return { url: `http://${options.host}:${port}`, port, pid, stop: () => stopChild(child) };
}

function requireUpstream(options: PrismOptions): string {
  if (!options.upstream) throw new Error('Prism proxy mode needs an upstream URL');
  return options.upstream;
}

async function freePort(host: string): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolvePromise) => probe.listen(0, host, () => resolvePromise()));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((resolvePromise) => probe.close(() => resolvePromise()));
  return port;
}

/** Polls until the port accepts connections. */
async function waitForPort(
  host: string,
  port: number,
  child: ChildProcess,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`Prism exited with code ${child.exitCode} before listening`);
    const open = await new Promise<boolean>((resolvePromise) => {
      const socket = connect(port, host);
      socket.once('connect', () => {
        socket.destroy();
        resolvePromise(true);
      });
      socket.once('error', () => resolvePromise(false));
    });
    if (open) return;
    await new Promise((resolvePromise) => setTimeout(resolvePromise, 100));
  }
  throw new Error(`Prism did not listen on ${host}:${port} within ${timeoutMs} ms`);
}

/** Stops a child by its pid: SIGTERM, then SIGKILL if it lingers. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolvePromise) => child.once('exit', () => resolvePromise()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3_000);
  await exited;
  clearTimeout(timer);
}
