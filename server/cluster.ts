/**
 * Several worker processes on one machine (`WORKERS` > 1) with `node:cluster`: the primary forks the workers,
 * which share the listening port (the primary hands connections out round-robin) and the database. The
 * primary serves nothing itself; it replaces a worker that dies and, on SIGTERM/SIGINT, drains every worker
 * (each finishes its in-flight requests as a single process would) before it exits.
 */
import cluster, { type Worker } from 'node:cluster';
import type { Logger } from 'pino';

export type SuperviseOptions = {
  workers: number;
  /** How long a worker may drain after SIGTERM; the primary kills what is left a little later. */
  shutdownGraceMs: number;
  logger: Logger;
  /** Pause before a dead worker is replaced, so a worker that cannot start does not spin (default 1000). */
  restartDelayMs?: number;
};

/** Forks the workers and supervises them until a signal stops the primary. Call only in the primary. */
export function superviseWorkers(options: SuperviseOptions): void {
  const { logger } = options;
  let stopping = false;
  const live = () => Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined);

  const fork = () => {
    const worker = cluster.fork();
    logger.info({ worker: worker.process.pid }, 'worker started');
  };

  cluster.on('exit', (worker, code, signal) => {
    if (stopping) {
      if (live().length === 0) {
        logger.info('stopped');
        process.exit(0);
      }
      return;
    }
    logger.warn({ worker: worker.process.pid, code, signal }, 'worker died; starting a replacement');
    setTimeout(() => {
      if (!stopping) fork();
    }, options.restartDelayMs ?? 1000);
  });

  for (let i = 0; i < options.workers; i++) fork();

  const shutdown = (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal, workers: live().length }, 'draining');
    const workers = live();
    if (workers.length === 0) process.exit(0);
    for (const worker of workers) worker.process.kill('SIGTERM');
    const timer = setTimeout(() => {
      logger.warn('workers still running after the grace period: killing them');
      for (const worker of live()) worker.process.kill('SIGKILL');
    }, options.shutdownGraceMs + 5_000);
    timer.unref();
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}
