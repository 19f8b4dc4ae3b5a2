/**
 * The real server for integration tests: `createServices` + `bootstrap` + `createApp` on a loopback port, on
 * whatever `DATABASE_URL` the test gives. When `VIA_PRISM_PROXY=1` (the `proxy` test project), `base` points at
 * a Prism validation proxy (`prism proxy --errors --validate-request false`) in front of the server, so every
 * JSON response of the suite is also checked by an independent validator; a violation turns into a 500 that
 * fails the test. `directBase` always reaches the server itself (for paths outside the contract, streams and
 * binaries, which the proxy cannot carry faithfully).
 */
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { pino } from 'pino';
import { startPrism } from '../../mocks/prism.ts';
import { createApp } from '../../server/app.ts';
import { type BootstrapResult, bootstrap } from '../../server/bootstrap.ts';
import { loadConfig } from '../../server/config.ts';
import { answerClientErrors } from '../../server/http/client-errors.ts';
import { createHttpServer } from '../../server/http/server.ts';
import { createServices, type Services, type ServicesOptions } from '../../server/services.ts';
import { repoRoot } from './contract.ts';
import { withCoverage } from './coverage.ts';

export const TEST_ADMIN_KEY = 'svc_admin_bootstrap_secret_for_tests_0123456789';

export type StartedServer = {
  services: Services;
  /** What bootstrap did (the admin key's account id, unless the database already had keys). */
  boot: BootstrapResult;
  /** Base URL of the API (`…/api/v1`, or the Prism proxy in front of it). */
  base: string;
  /** Base URL of the server itself, never proxied. */
  directBase: string;
  /** Origin of the server (operations surface: /healthz, /metrics, /docs). */
  origin: string;
  /** True when `base` goes through the Prism validation proxy. */
  proxied: boolean;
  close(): Promise<void>;
};

export const viaPrismProxy = () => process.env.VIA_PRISM_PROXY === '1';

export async function startServer(
  databaseUrl: string,
  env: Record<string, string> = {},
  options: { proxy?: boolean; services?: ServicesOptions } = {},
): Promise<StartedServer> {
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: databaseUrl,
    ADMIN_API_KEY: TEST_ADMIN_KEY,
    BOOTSTRAP_BALANCE_USD: '10',
    ...env,
  });
  const services = await createServices(config, pino({ level: 'silent' }), options.services);
  const boot = await bootstrap(services, {
    adminApiKey: config.adminApiKey,
    bootstrapBalanceUsd: config.bootstrapBalanceUsd,
  });
  // The server as `npm start` makes it (its requests through the application's own entry).
  const server = createHttpServer(createApp(withCoverage(services.app))).listen(0, '127.0.0.1');
  answerClientErrors(server);
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const directBase = `${origin}/api/v1`;
  const closeServer = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await services.close();
  };
  let prism: Awaited<ReturnType<typeof startPrism>> | undefined;
  if (options.proxy ?? viaPrismProxy()) {
    try {
      prism = await startPrism({
        mode: 'proxy',
        specPath: join(repoRoot, 'generated', 'openapi.yaml'),
        host: '127.0.0.1',
        upstream: directBase,
        args: ['--validate-request', 'false', '-v', 'error'],
      });
    } catch (error) {
      await closeServer();
      throw error;
    }
  }
  return {
    services,
    boot,
    base: prism ? prism.url : directBase,
    directBase,
    origin,
    proxied: prism !== undefined,
    async close() {
      await prism?.stop();
      await closeServer();
    },
  };
}
