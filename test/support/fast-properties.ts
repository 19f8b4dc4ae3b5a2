/**
 * Run by http-server.test.ts in a process of its own, as
 * `node --allow-natives-syntax --import tsx test/support/fast-properties.ts <scratch dir>`: whether V8 keeps the
 * requests and responses of `createHttpServer` as fast objects (properties in place, not a dictionary: V8's
 * `%HasFastProperties`, which only that flag exposes), seen when each response has finished. On a small
 * Express application, on the same through `app.listen`, and on the real application (SQLite in the scratch
 * folder, chats and model lists). Prints one JSON line:
 * `{ [server]: { req: boolean[], res: boolean[], status: number[] } }`.
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import express, { type Express } from 'express';
import { createApp } from '../../server/app.ts';
import { createHttpServer } from '../../server/http/server.ts';
import { fundedServices } from './app.ts';

const hasFastProperties = new Function('o', 'return %HasFastProperties(o)') as (o: object) => boolean;
const scratch = process.argv[2];
if (!scratch) throw new Error('usage: fast-properties.ts <scratch dir>');

type Seen = { req: boolean[]; res: boolean[]; status: number[] };
const seen: Record<string, Seen> = {};

/** Listens on loopback; each response's request and response are looked at once it has finished. */
async function listen(name: string, server: Server): Promise<string> {
  const record: Seen = { req: [], res: [], status: [] };
  seen[name] = record;
  server.prependListener('request', (req, res) => {
    res.on('finish', () => {
      record.req.push(hasFastProperties(req));
      record.res.push(hasFastProperties(res));
      record.status.push(res.statusCode);
    });
  });
  if (!server.listening) server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) =>
    server.listening ? resolve() : server.once('listening', () => resolve()),
  );
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function small(): Express {
  const app = express();
  app.get('/items/:id', (req, res) => {
    res.setHeader('x-item', req.params.id);
    res.json({ id: req.params.id, query: req.query });
  });
  return app;
}

const servers: Server[] = [];
try {
  for (const [name, server] of [
    ['createHttpServer', createHttpServer(small())],
    ['app.listen', small().listen(0, '127.0.0.1')],
  ] as const) {
    servers.push(server);
    const base = await listen(name, server);
    // Past V8's slack tracking of a constructor's objects (its first seven), on one kept-alive connection.
    for (let i = 0; i < 12; i++) await (await fetch(`${base}/items/${i}?a=1`)).text();
  }

  const { services, secret } = await fundedServices(join(scratch, 'fast-properties.sqlite'));
  try {
    const server = createHttpServer(createApp(services.app));
    servers.push(server);
    const base = await listen('application', server);
    const chat = {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'llama-3.3-70b',
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 4,
      }),
    };
    for (let i = 0; i < 12; i++) {
      await (await fetch(`${base}/api/v1/chat/completions`, chat)).text();
      await (await fetch(`${base}/api/v1/models?type=text`)).text();
    }
  } finally {
    await services.close();
  }
} finally {
  for (const server of servers) {
    server.closeAllConnections();
    server.close();
  }
}
process.stdout.write(`${JSON.stringify(seen)}\n`);
process.exit(0);
