/**
 * createHttpServer (server/http/server.ts): requests and responses are built on the Express application's
 * prototypes from the start, so Express's per-request `setPrototypeOf` changes nothing; everything else must be
 * as with `app.listen`. Checked on a small application and on the real one (SQLite), against `app.listen`. The
 * real application is served through its own entry (app.ts `serve`, without Express's dispatch): the same
 * answers as through Express, Express's dispatch not entered, and an error answer that fails answered in the
 * interface's shape with the server still serving.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, IncomingMessage, type Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import express from 'express';
import { afterAll, describe, expect, test } from 'vitest';
import { createApp } from '../../server/app.ts';
import type { Handler } from '../../server/http/contract.ts';
import { ApiError } from '../../server/http/errors.ts';
import { createHttpServer } from '../../server/http/server.ts';
import { fundedServices } from '../support/app.ts';
import { repoRoot } from '../support/contract.ts';

const scratch = mkdtempSync(join(tmpdir(), 'http-server-'));
const servers: Server[] = [];

afterAll(async () => {
  for (const server of servers) {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
  rmSync(scratch, { recursive: true, force: true });
});

async function listening(server: Server): Promise<string> {
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe('createHttpServer', () => {
  test('behavior: requests and responses are born with the application prototypes, on new and reused connections', async () => {
    const app = express();
    app.use((_req, res) => {
      res.json({ ok: true });
    });
    const born: boolean[] = [];
    const server = createHttpServer(app);
    server.prependListener('request', (req, res) => {
      born.push(Object.getPrototypeOf(req) === app.request && Object.getPrototypeOf(res) === app.response);
    });
    const base = await listening(server);
    for (let i = 0; i < 3; i++) expect((await fetch(`${base}/x`)).status).toBe(200);
    const fresh = await fetch(`${base}/y`, { headers: { connection: 'close' } });
    expect(fresh.status).toBe(200);
    expect(born).toEqual([true, true, true, true]);
  });

  test('behavior: its requests and responses stay fast objects in V8, through the whole application, as with app.listen', () => {
    // In a process of its own: V8's `%HasFastProperties` needs --allow-natives-syntax (test/support/fast-properties.ts).
    const output = execFileSync(
      process.execPath,
      ['--allow-natives-syntax', '--import', 'tsx', join('test', 'support', 'fast-properties.ts'), scratch],
      { cwd: repoRoot, encoding: 'utf8', timeout: 60_000 },
    );
    const seen = JSON.parse(output) as Record<string, { req: boolean[]; res: boolean[]; status: number[] }>;
    expect(Object.keys(seen)).toEqual(['createHttpServer', 'app.listen', 'application']);
    for (const [name, { req, res, status }] of Object.entries(seen)) {
      expect(req.length, name).toBeGreaterThanOrEqual(12);
      expect(
        status.every((code) => code === 200),
        `${name}: ${status}`,
      ).toBe(true);
      expect({ name, req: req.every(Boolean), res: res.every(Boolean) }).toEqual({
        name,
        req: true,
        res: true,
      });
    }
  });

  test('behavior: Express works as ever (routing, query, locals, status, JSON, errors, HEAD) and Node options reach the response', async () => {
    const app = express();
    app.set('query parser', 'extended');
    app.get('/items/:id', (req, res) => {
      res.locals.seen = req.params.id;
      res.status(201).json({
        id: req.params.id,
        path: req.path,
        query: req.query,
        seen: res.locals.seen,
        objects: req instanceof IncomingMessage && res instanceof ServerResponse,
      });
    });
    // A body written to a HEAD response: refused only if the server's option reached the response.
    let refused: string | undefined;
    app.head('/raw', (_req, res) => {
      try {
        res.write('body');
      } catch (error) {
        refused = (error as { code?: string }).code;
      }
      res.end();
    });
    app.get('/fail', () => {
      throw new Error('boom');
    });
    app.use((error: Error, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
      res.status(500).json({ error: error.message });
    });
    const base = await listening(createHttpServer(app, { rejectNonStandardBodyWrites: true }));
    const response = await fetch(`${base}/items/7?a[b]=1&c=2`);
    expect(response.status).toBe(201);
    expect(response.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(await response.json()).toEqual({
      id: '7',
      path: '/items/7',
      query: { a: { b: '1' }, c: '2' },
      seen: '7',
      objects: true,
    });
    const failed = await fetch(`${base}/fail`);
    expect([failed.status, await failed.json()]).toEqual([500, { error: 'boom' }]);
    const head = await fetch(`${base}/items/8`, { method: 'HEAD' });
    expect([head.status, await head.text()]).toEqual([201, '']);
    expect((await fetch(`${base}/nowhere`)).status).toBe(404);
    expect((await fetch(`${base}/raw`, { method: 'HEAD' })).status).toBe(200);
    expect(refused).toBe('ERR_HTTP_BODY_NOT_ALLOWED');
  });

  test('behavior: the real application answers the same through it as through app.listen', async () => {
    const { services, secret } = await fundedServices(join(scratch, 'db.sqlite'));
    try {
      const app = createApp(services.app);
      const bases = [await listening(createHttpServer(app)), await listening(app.listen(0, '127.0.0.1'))];
      const chat = (body: unknown, headers: Record<string, string> = {}) => ({
        path: '/api/v1/chat/completions',
        init: {
          method: 'POST',
          headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json', ...headers },
          body: JSON.stringify(body),
        },
      });
      const requests: { path: string; init: RequestInit }[] = [
        { path: '/api/v1/models?type=text', init: {} },
        chat({ model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, seed: 7 }),
        chat({ model: 'llama-3.3-70b', messages: 'not a list' }),
        chat({ model: 'llama-3.3-70b', messages: [] }, { 'accept-encoding': 'gzip' }),
        { path: '/api/v1/chat/completions', init: { method: 'GET' } },
        { path: '/api/v1/nowhere', init: {} },
        { path: '/api/v1/api_keys', init: {} },
        { path: '/healthz', init: { headers: { origin: 'http://example.test' } } },
        chat({
          model: 'llama-3.3-70b',
          messages: [{ role: 'user', content: 'Hi' }],
          max_tokens: 3,
          stream: true,
        }),
        {
          path: '/api/v1/chat/completions',
          init: {
            method: 'POST',
            headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
            body: '{"model":',
          },
        },
        { path: '/api/v1/models', init: { method: 'HEAD' } },
        {
          path: '/api/v1/chat/completions',
          init: {
            method: 'OPTIONS',
            headers: { origin: 'http://example.test', 'access-control-request-method': 'POST' },
          },
        },
        { path: '/API/V1/models/', init: {} },
        { path: '/api/v1/models/%E0%A4%A', init: {} },
        { path: '/chat/completions', init: { method: 'POST' } },
      ];
      // Ids, times and balances differ between two calls; the rest must not.
      const comparable = (text: string) =>
        text
          .replace(/"(id|created|cfRay)":"?[^",]*"?/g, '"$1":_')
          .replace(/chatcmpl-[0-9a-f]+-[A-Z]+/g, 'chatcmpl-_');
      const answers = await Promise.all(
        bases.map(async (base) => {
          const out = [];
          for (const { path, init } of requests) {
            const response = await fetch(`${base}${path}`, init);
            const headers = [...response.headers.keys()].filter((name) => !['date', 'cf-ray'].includes(name));
            out.push({
              status: response.status,
              type: response.headers.get('content-type'),
              headers: headers.filter((name) => !name.startsWith('x-service-balance')).sort(),
              body: comparable(await response.text()),
            });
          }
          return out;
        }),
      );
      expect(answers[0]?.map((a) => a.status)).toEqual([
        200, 200, 400, 400, 405, 404, 401, 200, 200, 400, 405, 204, 404, 404, 404,
      ]);
      expect(answers[0]).toEqual(answers[1]);
    } finally {
      await services.close();
    }
  });

  test("behavior: the real application is served without Express's dispatch, and through it for objects not born on its prototypes", async () => {
    const { services } = await fundedServices(join(scratch, 'entry.sqlite'));
    try {
      const app = createApp(services.app);
      let dispatched = 0;
      // Express's dispatch (`app.handle`, not in its types), counted.
      const dispatcher = app as unknown as { handle(...args: unknown[]): unknown };
      const handle = dispatcher.handle.bind(app);
      dispatcher.handle = (...args: unknown[]) => {
        dispatched++;
        return handle(...args);
      };
      const direct = await listening(createHttpServer(app));
      for (let i = 0; i < 3; i++) expect((await fetch(`${direct}/api/v1/models`)).status).toBe(200);
      expect((await fetch(`${direct}/api/v1/nowhere`)).status).toBe(404);
      expect(dispatched).toBe(0);
      // A plain node:http server's objects (Node's prototypes): Express's dispatch, and the same answer.
      const plain = await listening(createServer(app.serve));
      const answer = await fetch(`${plain}/api/v1/models`);
      expect([answer.status, dispatched]).toEqual([200, 1]);
      expect((await answer.json()).object).toBe('list');
      // Something added to the application afterwards: its requests go through Express, which runs it.
      app.use((_req, _res, next) => next());
      expect((await fetch(`${direct}/api/v1/models`)).status).toBe(200);
      expect(dispatched).toBe(2);
    } finally {
      await services.close();
    }
  });

  test('behavior: an error answer that itself fails is a 500 in the interface shape, and the server goes on serving', async () => {
    const { services, secret } = await fundedServices(join(scratch, 'failing.sqlite'));
    try {
      // A refusal whose header cannot be written: the error handler throws while answering it.
      const refuse: Handler<'createChatCompletion'> = () => {
        throw new ApiError(429, 'Slow down', { headers: { 'Retry-After': 'soon\nand later' } });
      };
      const app = createApp({
        ...services.app,
        handlers: { ...services.app.handlers, createChatCompletion: refuse },
      });
      const base = await listening(createHttpServer(app));
      const response = await fetch(`${base}/api/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'Hi' }] }),
      });
      expect(response.status).toBe(500);
      expect(response.headers.get('content-type')).toBe('application/json; charset=utf-8');
      expect(await response.json()).toEqual({ error: 'Internal server error', code: 'INTERNAL_ERROR' });
      expect((await fetch(`${base}/api/v1/models`)).status).toBe(200);
    } finally {
      await services.close();
    }
  });
});
