/**
 * The traced server of `npm run bench:trace` (and of its test): the server as `npm start` runs it, with
 * bench/trace-hooks.mjs preloaded, and the stamps it keeps read back on demand.
 */
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../test/support/contract.ts';
import { type Child, startNodeChild } from './processes.ts';
import { serverEnv } from './setup.ts';
import type { TraceDump } from './trace-analysis.ts';

export type TracedServer = Child & {
  /** The stamps taken since the last call (or the start), from a SIGUSR2 to the server; the next start afresh. */
  dump(): Promise<TraceDump>;
};

/**
 * Starts the server on `databaseUrl` with the catalogue at `catalogPath` as the harness starts it (setup.ts,
 * `serverEnv`), writing its stamps to `dumpFile`; `env` adds to its environment.
 */
export async function startTracedServer(input: {
  databaseUrl: string;
  catalogPath: string;
  dumpFile: string;
  env?: Record<string, string>;
}): Promise<TracedServer> {
  const { dumpFile } = input;
  const server = await startNodeChild(
    'server (traced)',
    'server/start.mjs',
    serverEnv(input.databaseUrl, input.catalogPath, { ...input.env, TRACE_OUT: dumpFile }),
    '/healthz',
    [
      ...(process.env.TRACE_NODE_FLAGS ?? '').split(' ').filter(Boolean),
      '--import',
      join(repoRoot, 'bench', 'trace-hooks.mjs'),
    ],
  );
  return Object.assign(server, {
    async dump(): Promise<TraceDump> {
      rmSync(dumpFile, { force: true });
      process.kill(server.pid, 'SIGUSR2');
      // The hooks write the file aside and rename it into place: once it is there, it is whole.
      for (let i = 0; i < 200 && !existsSync(dumpFile); i++) await new Promise((r) => setTimeout(r, 25));
      return JSON.parse(readFileSync(dumpFile, 'utf8')) as TraceDump;
    },
  });
}
