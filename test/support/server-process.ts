/**
 * The real server as an operator runs it, for the scale-out and fault tests: `server/main.ts` in its own
 * process (`node --import tsx`), one per instance, every one stopped by its pid afterwards (also the workers
 * of a `WORKERS` > 1 primary, whose pids it reads from the log). Logs are kept for assertions.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { repoRoot } from './contract.ts';
import { isAlive, stopPid } from './process.ts';

export type ServerProcess = {
  pid: number;
  /** `http://127.0.0.1:<port>` */
  origin: string;
  /** `…/api/v1` */
  base: string;
  output(): string;
  /** Parsed JSON log lines so far. */
  logs(): Array<Record<string, unknown>>;
  /** Pids of the workers a cluster primary started (from its log). */
  workerPids(): number[];
  /**
   * Resolves with the exit code (null when killed by a signal) once everything the process (and any worker
   * sharing its pipes) wrote has been read: Node may emit 'exit' before the last lines arrive.
   */
  exited: Promise<number | null>;
  /** The exit code once the process has exited, else null. */
  exitCode(): number | null;
  /** Sends a signal to the process (SIGTERM to drain, SIGKILL to crash). */
  signal(signal: NodeJS.Signals): void;
  /** Waits until `predicate` holds for the log lines (or throws after `timeoutMs`). */
  waitForLog(
    predicate: (lines: Array<Record<string, unknown>>) => boolean,
    timeoutMs?: number,
  ): Promise<void>;
  /** SIGTERM, then SIGKILL; also stops any worker still alive. */
  stop(): Promise<void>;
};

const started = new Set<ServerProcess>();

function parseLines(text: string): Array<Record<string, unknown>> {
  const lines: Array<Record<string, unknown>> = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {}
  }
  return lines;
}

/**
 * Starts `server/main.ts` with `env` (on top of a test baseline: NODE_ENV=test, PORT=0, loopback) and waits
 * for `listening` lines: one, or `listening` of them (the workers of a cluster); `listening: 0` returns at once
 * (for a start that is expected to fail: await `exited`).
 */
export async function startServerProcess(
  env: Record<string, string>,
  options: { listening?: number; timeoutMs?: number; launcher?: boolean } = {},
): Promise<ServerProcess> {
  const child: ChildProcess = spawn(
    process.execPath,
    // `launcher`: `node server/start.mjs`, as `npm start` runs it (compiled, no loader in the process).
    options.launcher
      ? [join(repoRoot, 'server', 'start.mjs')]
      : ['--import', 'tsx', join(repoRoot, 'server', 'main.ts')],
    {
      cwd: repoRoot,
      env: {
        ...process.env,
        NODE_ENV: 'test',
        HOST: '127.0.0.1',
        PORT: '0',
        LOG_LEVEL: 'info',
        VIDEO_WORKER_ENABLED: 'false',
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  if (child.pid === undefined) throw new Error('server process did not start');
  const pid = child.pid;
  let out = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const exited = new Promise<number | null>((resolve) =>
    child.once('exit', (code) => {
      // 'close' follows once the pipes are drained; a process left holding them (a worker of a killed
      // primary) must not hang the test, so give up waiting after a while.
      const timer = setTimeout(() => resolve(code), 5_000);
      child.once('close', () => {
        clearTimeout(timer);
        resolve(code);
      });
    }),
  );
  const logs = () => parseLines(out);
  const workerPids = () =>
    logs()
      .filter((l) => l.msg === 'worker started' && typeof l.worker === 'number')
      .map((l) => l.worker as number);
  const waitForLog = async (
    predicate: (lines: Array<Record<string, unknown>>) => boolean,
    timeoutMs = 60_000,
  ) => {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (predicate(logs())) return;
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`server exited (${child.exitCode ?? child.signalCode}):\n${out.slice(-4000)}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`server log condition not met in ${timeoutMs} ms:\n${out.slice(-4000)}`);
  };
  const instance: ServerProcess = {
    pid,
    origin: '',
    base: '',
    output: () => out,
    logs,
    workerPids,
    exited,
    exitCode: () => child.exitCode,
    signal: (signal) => {
      child.kill(signal);
    },
    waitForLog,
    async stop() {
      await stopPid(pid, 15_000);
      for (const worker of workerPids()) if (isAlive(worker)) await stopPid(worker, 3_000);
      started.delete(instance);
    },
  };
  started.add(instance);
  const wanted = options.listening ?? 1;
  if (wanted === 0) return instance;
  try {
    await waitForLog(
      (lines) => lines.filter((l) => l.msg === 'listening').length >= wanted,
      options.timeoutMs ?? 90_000,
    );
  } catch (error) {
    await instance.stop();
    throw error;
  }
  const url = String(logs().find((l) => l.msg === 'listening')?.url);
  instance.base = url;
  instance.origin = new URL(url).origin;
  return instance;
}

/** Stops every server process this module started that is still running (for `afterAll`). */
export async function stopServerProcesses(): Promise<void> {
  for (const instance of [...started]) await instance.stop();
}
