/**
 * The video worker: runs queued jobs. Every server instance may run one; they share the job store, and a job
 * is claimed by exactly one of them (a conditional UPDATE, see storage/video-jobs.ts). While a job runs its lease
 * is renewed; if the worker dies, the lease runs out and another worker takes the job over (resuming an upstream
 * job from its stored handle). A job taken over too often fails. A failed job is refunded (REFUND ledger entry);
 * a worker that died between the failure and the refund leaves it pending, and the next pass refunds it.
 *
 * `start()` polls in the background (and `wake()` shortens the wait after a queue); `stop()` aborts the jobs in
 * hand and gives them back to the queue; `runOnce()` does one pass, for tests and for callers that drive it.
 */
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend } from '../../catalog/types.ts';
import { type VideoProvider, VideoProviderError } from '../../providers/video/types.ts';
import type { LedgerRepository } from '../../storage/ledger.ts';
import type { VideoFailure, VideoJob, VideoJobsRepository } from '../../storage/video-jobs.ts';
import { refundJob, type StoredVideoParams } from './service.ts';

export type VideoWorkerDeps = {
  jobs: VideoJobsRepository;
  ledger: LedgerRepository;
  catalog: CatalogService;
  providerFor(backend: Backend): VideoProvider;
  /** How long a claim holds without renewal (default 60 s). */
  leaseMs?: number;
  /** Pause between polls when idle (default 1 s). */
  pollIntervalMs?: number;
  /** Jobs run at once by this worker (default 1). */
  concurrency?: number;
  /** Claims of one job before it fails (default 3). */
  maxAttempts?: number;
  /** Unpaid jobs older than this are failed and refunded if charged (default 10 minutes). */
  unpaidGraceMs?: number;
  logger?: Logger;
  /** This worker's name in the lease (default a random id). */
  id?: string;
};

export type VideoWorker = ReturnType<typeof createVideoWorker>;

/** The job's failure as stored: the code retrieve answers with. */
export function failureOf(error: unknown): VideoFailure {
  if (error instanceof VideoProviderError) {
    switch (error.kind) {
      case 'content_policy':
        return {
          code: 'CONTENT_POLICY_VIOLATION',
          message: error.message,
          ...(error.recommendedModel ? { recommendedModel: error.recommendedModel } : {}),
        };
      case 'bad_request':
        return { code: 'INVALID_REQUEST', message: error.message };
      case 'timeout':
        return { code: 'REQUEST_TIMEOUT', message: error.message };
      default:
        return { code: 'INFERENCE_FAILED', message: error.message };
    }
  }
  return { code: 'INFERENCE_FAILED', message: error instanceof Error ? error.message : String(error) };
}

export function createVideoWorker(deps: VideoWorkerDeps) {
  const id = deps.id ?? `worker-${randomUUID()}`;
  const leaseMs = deps.leaseMs ?? 60_000;
  const pollIntervalMs = deps.pollIntervalMs ?? 1_000;
  const concurrency = deps.concurrency ?? 1;
  const maxAttempts = deps.maxAttempts ?? 3;
  const unpaidGraceMs = deps.unpaidGraceMs ?? 10 * 60_000;
  const log = deps.logger;

  let stopping: AbortController = new AbortController();
  let running = false;
  let loop: Promise<void> | undefined;
  let wakeUp: (() => void) | undefined;
  const inHand = new Set<Promise<void>>();

  async function failAndRefund(job: VideoJob, failure: VideoFailure): Promise<void> {
    if (!(await deps.jobs.fail(job.id, id, failure))) return; // lost the job: its new owner decides
    log?.warn({ queueId: job.id, code: failure.code, reason: failure.message }, 'video job failed');
    await refundJob(deps, job);
  }

  async function run(job: VideoJob): Promise<void> {
    if (job.attempts > maxAttempts) {
      await failAndRefund(job, {
        code: 'INFERENCE_FAILED',
        message: `The job was interrupted ${job.attempts - 1} times`,
      });
      return;
    }
    const model = deps.catalog.getModel(job.modelId);
    const backend = model?.backends.find((b) => b.name === job.backend) ?? model?.backends[0];
    if (!model || !backend) {
      await failAndRefund(job, { code: 'INFERENCE_FAILED', message: `No backend serves ${job.modelId}` });
      return;
    }
    const provider = deps.providerFor(backend);
    const lost = new AbortController();
    const signal = AbortSignal.any([lost.signal, stopping.signal]);
    const heartbeat = setInterval(
      () => {
        deps.jobs
          .renew(job.id, id, leaseMs)
          .then((held) => {
            if (!held) lost.abort();
          })
          .catch(() => undefined);
      },
      Math.max(10, Math.floor(leaseMs / 3)),
    );
    heartbeat.unref();
    let handle = job.upstreamHandle ?? undefined;
    try {
      const { downloadToken: _secret, ...params } = job.params as StoredVideoParams;
      const result = await provider.generate(
        { ...params, model: backend.kind === 'local' ? model.id : backend.upstreamModel },
        {
          signal,
          ...(handle ? { resume: handle } : {}),
          onHandle: async (next) => {
            handle = next;
            if (!(await deps.jobs.setHandle(job.id, id, next))) lost.abort();
          },
        },
      );
      if (await deps.jobs.complete(job.id, id, { contentType: result.contentType, bytes: result.bytes })) {
        log?.info({ queueId: job.id, bytes: result.bytes.length }, 'video job completed');
        if (handle && provider.discard) await provider.discard(handle);
      }
    } catch (error) {
      if (lost.signal.aborted) return; // another worker holds the job now
      if (stopping.signal.aborted) {
        await deps.jobs.release(job.id, id);
        return;
      }
      if (error instanceof VideoProviderError && error.kind === 'capacity') {
        // Leave the claim to run out: the lease is the back-off, and each retry counts as an attempt.
        log?.warn(
          { queueId: job.id, reason: error.message },
          'video backend at capacity; job will be retried',
        );
        return;
      }
      await failAndRefund(job, failureOf(error));
    } finally {
      clearInterval(heartbeat);
    }
  }

  /** Refunds failed jobs whose refund a dead worker left pending, fails stale unpaid jobs, prunes old ones. */
  async function housekeeping(): Promise<void> {
    for (const job of await deps.jobs.staleUnpaid(unpaidGraceMs)) {
      await deps.jobs.failUnpaid(job.id, {
        code: 'INFERENCE_FAILED',
        message: 'The job was never handed to the workers',
      });
    }
    for (const job of await deps.jobs.pendingRefunds()) await refundJob(deps, job);
    await deps.jobs.pruneExpired();
  }

  /** One pass: housekeeping, then claims and runs jobs until none is left (at most `concurrency` at once). */
  async function runOnce(): Promise<number> {
    await housekeeping();
    let count = 0;
    const slots: Promise<void>[] = [];
    const next = async (): Promise<void> => {
      while (!stopping.signal.aborted) {
        const job = await deps.jobs.claim({ owner: id, leaseMs });
        if (!job) return;
        count++;
        const work = run(job).catch((error: unknown) =>
          log?.error({ err: error, queueId: job.id }, 'video job crashed'),
        );
        inHand.add(work);
        try {
          await work;
        } finally {
          inHand.delete(work);
        }
      }
    };
    for (let i = 0; i < concurrency; i++) slots.push(next());
    await Promise.all(slots);
    return count;
  }

  return {
    id,
    runOnce,
    /** Runs passes in the background until `stop()`. */
    start(): void {
      if (running) return;
      running = true;
      stopping = new AbortController();
      loop = (async () => {
        while (!stopping.signal.aborted) {
          try {
            await runOnce();
          } catch (error) {
            log?.error({ err: error }, 'video worker pass failed');
          }
          if (stopping.signal.aborted) break;
          await new Promise<void>((resolve) => {
            const timer = setTimeout(done, pollIntervalMs);
            function done() {
              clearTimeout(timer);
              wakeUp = undefined;
              stopping.signal.removeEventListener('abort', done);
              resolve();
            }
            wakeUp = done;
            stopping.signal.addEventListener('abort', done, { once: true });
          });
        }
      })();
    },
    /** Shortens the idle wait: a job was just queued. */
    wake(): void {
      wakeUp?.();
    },
    /** Stops polling, aborts the jobs in hand (they go back to the queue) and waits for them. */
    async stop(): Promise<void> {
      stopping.abort();
      await Promise.allSettled([...inHand]);
      await loop;
      running = false;
      loop = undefined;
    },
  };
}
