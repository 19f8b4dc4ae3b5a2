/**
 * A real server (services + app on loopback, SQLite or PostgreSQL) for chat tests, with helpers to open
 * funded accounts and to read their ledgers.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
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
  account(
    usd: string,
    options?: { pro?: boolean },
  ): Promise<{ accountId: string; key: string; keyId: string }>;
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
      const { key, secret } = await services.keys.create({ accountId: account.id, keyType: 'INFERENCE' });
      return { accountId: account.id, key: secret, keyId: key.id };
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await services.close();
      rmSync(scratch, { recursive: true, force: true });
    },
  };
}

/**
 * POSTs `body` as JSON to `path` (under the base path) on a connection of its own, and records what the server
 * hands its side of that connection: one entry per socket write. For tests of how an answer leaves.
 */
export async function postWatchingWrites(
  server: ChatServer,
  key: string,
  path: string,
  body: unknown,
): Promise<{ text: string; writes: string[] }> {
  const writes: string[] = [];
  server.http.once('connection', (socket: Socket) => {
    const writable = socket as Socket & {
      _write(chunk: Buffer | string, encoding: string, cb: () => void): void;
      _writev(chunks: Array<{ chunk: Buffer | string }>, cb: () => void): void;
    };
    const write = writable._write.bind(writable);
    const writev = writable._writev.bind(writable);
    writable._write = (chunk, encoding, cb) => {
      writes.push(String(chunk));
      write(chunk, encoding, cb);
    };
    writable._writev = (chunks, cb) => {
      writes.push(chunks.map((c) => String(c.chunk)).join(''));
      writev(chunks, cb);
    };
  });
  const text = await new Promise<string>((resolve, reject) => {
    const req = request(
      `${server.base}${path}`,
      {
        method: 'POST',
        // A connection of its own: the one the server sees next.
        agent: false,
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      },
      (res) => {
        let all = '';
        res.setEncoding('utf8');
        res.on('data', (part: string) => {
          all += part;
        });
        res.on('end', () => resolve(all));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
  return { text, writes };
}
