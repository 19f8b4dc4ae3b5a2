/**
 * Starts the real HTTP app on a loopback port for a test, with whatever ports the test provides.
 */
import type { AddressInfo } from 'node:net';
import { type Logger, pino } from 'pino';
import { type App, type AppDeps, createApp } from '../../server/app.ts';
import { type Config, loadConfig } from '../../server/config.ts';
import { discoveryPaymentRequired } from '../../server/domains/wallet/discovery.ts';
import { createHandlers, type HandlerGroups } from '../../server/handlers.ts';
import type { AuthPorts } from '../../server/http/auth.ts';
import { createHttpServer } from '../../server/http/server.ts';
import { loadContract } from '../../server/http/spec.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { createMetrics } from '../../server/observability/metrics.ts';
import { createServices, type Services } from '../../server/services.ts';

export type TestApp = { url: string; origin: string; config: Config; app: App; close(): Promise<void> };

export async function startTestApp(
  options: {
    env?: Record<string, string>;
    handlers?: HandlerGroups;
    auth?: Partial<AuthPorts>;
    readiness?: () => Promise<void>;
    /** The app's logger (silent by default). */
    logger?: Logger;
    /** Routes outside the contract (AppDeps.mountRoutes). */
    mountRoutes?: AppDeps['mountRoutes'];
  } = {},
): Promise<TestApp> {
  const config = loadConfig({ NODE_ENV: 'test', LOG_LEVEL: 'silent', PORT: '0', ...options.env });
  const contract = loadContract();
  const auth: AuthPorts = {
    authenticateApiKey: async () => undefined,
    paymentRequired: (req, op) =>
      discoveryPaymentRequired(
        { publicOrigin: config.publicOrigin, payToBase: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B' },
        { path: req.originalUrl.split('?')[0] ?? '', description: op.summary },
      ),
    ...options.auth,
  };
  const app = createApp({
    config,
    contract,
    logger: options.logger ?? pino({ level: 'silent' }),
    auth,
    handlers: createHandlers(options.handlers ?? {}),
    metrics: createMetrics(),
    readiness: options.readiness ?? (async () => {}),
    ...(options.mountRoutes ? { mountRoutes: options.mountRoutes } : {}),
  });
  // The server as `npm start` makes it (its requests through the application's own entry).
  const server = createHttpServer(app).listen(0, '127.0.0.1');
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: `${origin}/api/v1`,
    origin,
    config,
    app,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * The real services on the SQLite file `file` (test settings, silent), with an account funded with 5 USD and an
 * INFERENCE key of it: for tests that serve the whole application through a server of their own. The caller
 * closes `services`.
 */
export async function fundedServices(file: string): Promise<{ services: Services; secret: string }> {
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: `sqlite:${file}`,
    VIDEO_WORKER_ENABLED: 'false',
  });
  const services = await createServices(config, pino({ level: 'silent' }));
  try {
    const account = await services.accounts.createApiAccount({});
    await services.ledger.topUp({ accountId: account.id, amountNano: parseUsdToNano('5') });
    const { secret } = await services.keys.create({ accountId: account.id, keyType: 'INFERENCE' });
    return { services, secret };
  } catch (error) {
    await services.close();
    throw error;
  }
}
