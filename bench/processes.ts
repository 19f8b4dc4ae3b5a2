/**
 * The child processes of a benchmark run: each one is started on a free loopback port, waited for until it
 * answers HTTP, sampled for memory from `/proc/<pid>/status`, and stopped by its pid. Every process started
 * here is recorded, so `stopAll()` (called on success, failure and Ctrl-C) leaves nothing running.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../test/support/contract.ts';
import { freePort, stopPid } from '../test/support/process.ts';

export type Child = {
  name: string;
  pid: number;
  port: number;
  origin: string;
  /** Current resident set size in bytes (0 when unknown). */
  rss(): number;
  /** Peak resident set size since start in bytes (`VmHWM`; 0 when unknown). */
  peakRss(): number;
  /** The last lines the process wrote (for error messages). */
  output(): string;
  stop(): Promise<void>;
};

const stoppers = new Map<number, () => Promise<void>>();

/** Registers a process started elsewhere (PostgreSQL, anvil, Prism) so that stopAll() stops it too. */
export function track(pid: number, stop: () => Promise<void>): void {
  stoppers.set(pid, stop);
}

/** Stops every process this run started, by pid, in parallel. */
export async function stopAll(): Promise<void> {
  const all = [...stoppers.entries()];
  stoppers.clear();
  await Promise.all(all.map(([, stop]) => stop().catch(() => {})));
}

/**
 * On Ctrl-C or SIGTERM: says so, runs `cleanUp` (by default, stops every process this run started), then
 * exits 130.
 */
export function cleanUpOnInterrupt(
  say: (message: string) => void,
  cleanUp: () => Promise<unknown> = stopAll,
): void {
  const interrupted = () => {
    say('interrupted: stopping every process');
    void cleanUp().finally(() => process.exit(130));
  };
  process.on('SIGINT', interrupted);
  process.on('SIGTERM', interrupted);
}

function statusField(pid: number, field: string): number {
  try {
    const line = readFileSync(`/proc/${pid}/status`, 'utf8')
      .split('\n')
      .find((l) => l.startsWith(`${field}:`));
    const kb = Number.parseInt(line?.split(/\s+/)[1] ?? '', 10);
    return Number.isFinite(kb) ? kb * 1024 : 0;
  } catch {
    return 0;
  }
}

/**
 * The node flags `npm start` gives the server: the words between `node` and the script in the `start` script
 * of `<root>/package.json` (`--use-largepages=silent`). The harness starts every node process of its own (the
 * servers, the ceiling, the floors, the local upstream) with them, so that the server runs as an operator runs
 * it and the processes it is measured against run on the same terms; `bench:ab` reads each side's own
 * `package.json`. The in-process tools (inproc.ts, and perf.sh and instructions.sh over it) do not use them:
 * Node's code moved to large pages is anonymous memory, where `perf` finds no symbols.
 */
export function startFlags(root: string = repoRoot): string[] {
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
    scripts?: Record<string, string>;
  };
  const words = (manifest.scripts?.start ?? '').trim().split(/\s+/);
  if (words[0] !== 'node' || words.at(-1) !== 'server/start.mjs') {
    throw new Error(
      `package.json's start script is not "node [flags] server/start.mjs": ${manifest.scripts?.start}`,
    );
  }
  return words.slice(1, -1);
}

async function waitForHttp(url: string, child: ChildProcess, log: () => string, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`process exited with ${child.exitCode}:\n${log()}`);
    try {
      const response = await fetch(url);
      await response.arrayBuffer();
      if (response.status < 500) return;
    } catch {}
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${url} did not answer within ${timeoutMs} ms:\n${log()}`);
}

/**
 * Starts `node <flags> --import tsx <script>` (`node <flags> <script>` for a `.mjs` script such as
 * `server/start.mjs`, the server as `npm start` runs it; the process itself, no wrapper: its pid is the
 * server's) with `PORT` set to a free port, and waits until `readyPath` answers. `<flags>` are `npm start`'s
 * (`startFlags`; `options.flags` for another tree's), then `nodeArgs` (`--import` of a preload, say).
 * `stdoutFile`: the process's standard output goes to that file, as an operator's `npm start > server.log`
 * sends it, instead of a pipe that this process reads (at `LOG_LEVEL=info` the server writes a line per
 * request, and reading them here would take this process's CPU from the load it sends); `output()` then holds
 * only its standard error.
 */
export async function startNodeChild(
  name: string,
  script: string,
  env: Record<string, string>,
  readyPath = '/',
  nodeArgs: readonly string[] = [],
  options: { stdoutFile?: string; flags?: readonly string[] } = {},
): Promise<Child> {
  const port = await freePort();
  const loader = script.endsWith('.mjs') ? [] : ['--import', 'tsx'];
  const stdoutFd = options.stdoutFile === undefined ? undefined : openSync(options.stdoutFile, 'a');
  let child: ChildProcess;
  try {
    const flags = options.flags ?? startFlags();
    child = spawn(process.execPath, [...flags, ...nodeArgs, ...loader, join(repoRoot, script)], {
      cwd: repoRoot,
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env, PORT: String(port) },
      stdio: ['ignore', stdoutFd ?? 'pipe', 'pipe'],
    });
  } finally {
    // The child has its own copy of the descriptor once spawned.
    if (stdoutFd !== undefined) closeSync(stdoutFd);
  }
  const pid = child.pid;
  if (pid === undefined) throw new Error(`${name} did not start`);
  const lines: string[] = [];
  const keep = (chunk: Buffer) => {
    lines.push(...chunk.toString('utf8').split('\n').filter(Boolean));
    if (lines.length > 40) lines.splice(0, lines.length - 40);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  const stop = () => stopPid(pid, 5000);
  track(pid, stop);
  const origin = `http://127.0.0.1:${port}`;
  const output = () => lines.join('\n');
  try {
    await waitForHttp(`${origin}${readyPath}`, child, output, 60_000);
  } catch (error) {
    await stop();
    stoppers.delete(pid);
    throw new Error(`${name}: ${(error as Error).message}`);
  }
  return {
    name,
    pid,
    port,
    origin,
    rss: () => statusField(pid, 'VmRSS'),
    peakRss: () => statusField(pid, 'VmHWM'),
    output,
    async stop() {
      stoppers.delete(pid);
      await stop();
    },
  };
}

/** Resident set size of any pid (bytes; 0 when unknown). */
export function rssOf(pid: number): { rss: number; peak: number } {
  return { rss: statusField(pid, 'VmRSS'), peak: statusField(pid, 'VmHWM') };
}
