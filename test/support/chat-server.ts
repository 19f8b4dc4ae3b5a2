/**
 * A real server (services + app on loopback, SQLite or PostgreSQL) for chat tests, with helpers to open
 * funded accounts and to read their ledgers.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Logger, pino } from 'pino';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { createServices, type Services } from '../../server/services.ts';
import { withCoverage } from './coverage.ts';

export type ChatServer = {
  base: string;
  origin: string;
  services: Services;
  /** The listening `node:http` server (to observe its connections). */
  http: Server;
  /** POSTs `body` as JSON to `path` (under the base path) with `key` as the bearer token. */
  post(key: string, path: string, body: unknown): Promise<Response>;
  /** A new account with `usd` of credit and an INFERENCE key. */
  account(usd: string, options?: { pro?: boolean }): Promise<{ accountId: string; key: string }>;
  close(): Promise<void>;
};

export async function startChatServer(
  options: { env?: Record<string, string>; databaseUrl?: string; catalogYaml?: string; logger?: Logger } = {},
): Promise<ChatServer> {
  const scratch = mkdtempSync(join(tmpdir(), 'chat-server-'));
  const env: Record<string, string> = {
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: options.databaseUrl ?? `sqlite:${join(scratch, 'db.sqlite')}`,
    ...options.env,
  };
  if (options.catalogYaml) {
    const path = join(scratch, 'catalog.yaml');
    writeFileSync(path, options.catalogYaml);
    env.SERVICE_CONFIG = path;
  }
  const services = await createServices(loadConfig(env), options.logger ?? pino({ level: 'silent' }));
  const server: Server = createApp(withCoverage(services.app)).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    base: `${origin}/api/v1`,
    origin,
    services,
    http: server,
    post: (key, path, body) =>
      fetch(`${origin}/api/v1${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      }),
    async account(usd, accountOptions = {}) {
      const account = await services.accounts.createApiAccount({ pro: accountOptions.pro ?? false });
      if (usd !== '0')
        await services.ledger.topUp({ accountId: account.id, amountNano: parseUsdToNano(usd) });
      const { secret } = await services.keys.create({ accountId: account.id, keyType: 'INFERENCE' });
      return { accountId: account.id, key: secret };
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await services.close();
      rmSync(scratch, { recursive: true, force: true });
    },
  };
}
