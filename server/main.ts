/**
 * The server's only impure entry: read the environment, build the services, bootstrap, listen, prove the
 * contract loaded with a smoke request, and drain gracefully on SIGTERM/SIGINT. With `WORKERS` > 1 this
 * process becomes the primary of a `node:cluster` (`cluster.ts`): it migrates and bootstraps once, then forks
 * that many workers, each of which runs the rest of this file.
 */
import cluster from 'node:cluster';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setFlagsFromString } from 'node:v8';
import { createApp } from './app.ts';
import { bootstrap } from './bootstrap.ts';
import { superviseWorkers } from './cluster.ts';
import { type Config, ConfigError, loadConfig } from './config.ts';
import { answerClientErrors } from './http/client-errors.ts';
import { pollWhileServing } from './http/idle-poll.ts';
import { createHttpServer } from './http/server.ts';
import { createLogDestination } from './observability/log-destination.ts';
import { createLogger } from './observability/logger.ts';
import { createServices, type Services } from './services.ts';

// V8's heap sizing: after a full GC the old generation grows to 1.3x its live data instead of up to 4x.
// Measured at 1,000 open streams (`npm run bench -- --only streams`): peak RSS about 330 MB by default, 250 MB
// with it. `--optimize-for-size` reached 200 MB but cost 10-30% CPU per request (it also tunes code for size),
// this costs no measurable CPU. Set at run time, so it holds however the server is started.
setFlagsFromString('--heap-growing-percent=30');

let config: Config;
try {
  config = loadConfig(process.env);
} catch (error) {
  if (error instanceof ConfigError) {
    console.error(error.message);
    process.exit(2);
  }
  throw error;
}

// Lines gathered and written a batch at a time, not one thread-pool write per request (observability/log-destination.ts).
const logDestination = createLogDestination();
const logger = createLogger(config.logLevel, logDestination);
const primary = cluster.isPrimary && config.workers > 1;
const services = await createServices(config, logger).catch((error: unknown) => {
  logger.fatal({ err: error }, 'start-up failed');
  process.exit(1);
});

const boot = await bootstrap(services, {
  adminApiKey: config.adminApiKey,
  bootstrapBalanceUsd: config.bootstrapBalanceUsd,
}).catch(async (error: unknown) => {
  logger.fatal({ err: error }, 'bootstrap failed');
  await services.close();
  process.exit(1);
});
if (boot.action === 'generated-key') {
  // After the lines logged so far (they are gathered, this is not).
  logDestination.flushSync();
  // Printed once, to the terminal only: the logger never sees the secret.
  process.stdout.write(
    `\nFirst start: an ADMIN API key was created for account ${boot.accountId}. It is shown only this once:\n\n` +
      `  ADMIN_API_KEY=${boot.secret}\n\n` +
      `The account was credited ${config.bootstrapBalanceUsd} USD. Keep the key; set ADMIN_API_KEY to reuse it.\n\n`,
  );
}

if (primary) {
  // Migrations and the first-start bootstrap ran once, here; the workers find both done.
  await services.close();
  superviseWorkers({ workers: config.workers, shutdownGraceMs: config.shutdownGraceMs, logger });
} else await serve(services);

async function serve(services: Services) {
  const app = createApp(services.app);
  // Every operation's request validation built before the port opens, rather than by its first request, which
  // every request arriving meanwhile would wait for (http/validator-warmup.ts).
  const warmed = await app.warmRequestValidation();
  logger.info({ operations: warmed.operations, ms: Math.round(warmed.ms) }, 'request validation built');
  // Requests and responses built on Express's prototypes from the start (see http/server.ts).
  const server: Server = createHttpServer(app);
  answerClientErrors(server);
  // Counted by the app's in-flight requests (every request passes its first layer).
  if (services.app.inFlight) pollWhileServing(server, services.app.inFlight, config.idlePollUs);
  server.listen(config.port, config.host);
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  }).catch(async (error: unknown) => {
    logger.fatal({ err: error }, 'cannot listen');
    await services.close();
    process.exit(1);
  });
  const { port } = server.address() as AddressInfo;
  const localHost = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  const base = `http://${localHost.includes(':') ? `[${localHost}]` : localHost}:${port}`;

  // express-openapi-validator loads the spec lazily and would fail every request if it could not: prove it now.
  const smoke = await fetch(`${base}/api/v1/models`).catch((error: unknown) => error);
  if (!(smoke instanceof Response) || smoke.status !== 200) {
    logger.fatal(
      { status: smoke instanceof Response ? smoke.status : String(smoke) },
      'smoke request failed',
    );
    server.close();
    await services.close();
    process.exit(1);
  }
  // The video worker: any number of instances may run one; each job is claimed by exactly one of them.
  if (config.video.workerEnabled) services.video.worker.start();

  logger.info(
    { url: `${base}/api/v1`, docs: `${base}/docs`, database: services.database.dialect },
    'listening',
  );
  // Shown at once, not with the next batch: whoever waits for the server reads this line.
  logDestination.flush();

  // Housekeeping every minute: reservations of requests that never finished (a crash) are released when they
  // expire; rate-limit windows older than a day, refusal-log entries older than 30 days and expired idempotency
  // records are dropped.
  // The first sweep runs at start: a restart after a crash releases what the dead process left held.
  const sweepOnce = () => {
    const now = Date.now();
    Promise.all([
      services.ledger.expireReservations(now),
      services.rateLimits.prune(now - 2 * 86_400_000),
      services.rateLimits.pruneEvents(now - 30 * 86_400_000),
      services.idempotency.prune(now),
      services.rpc.credits.prune(now - 2 * 86_400_000),
    ])
      .then(([released]) =>
        released > 0 ? logger.info({ released }, 'expired reservations released') : undefined,
      )
      .catch((error: unknown) => logger.error({ err: error }, 'sweep failed'));
  };
  sweepOnce();
  const sweep = setInterval(sweepOnce, 60_000);
  sweep.unref();

  let stopping = false;
  async function shutdown(signal: string) {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'draining');
    clearInterval(sweep);
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    server.closeIdleConnections();
    const timer = setTimeout(() => {
      logger.warn('grace period over: closing remaining connections');
      server.closeAllConnections();
    }, config.shutdownGraceMs);
    timer.unref();
    await closed;
    clearTimeout(timer);
    // Jobs in hand go back to the queue for another instance (services.close() also stops the worker).
    await services.video.worker.stop();
    await services.close();
    logger.info('stopped');
    process.exit(0);
  }
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
}
