/**
 * directValidator (server/http/validator-direct.ts): express-openapi-validator's middlewares call their inner
 * middlewares directly once built, with the same answers as the library's own, and without its promise hop.
 */
import { createHook } from 'node:async_hooks';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import express, { type NextFunction, type Request, type Response } from 'express';
import * as OpenApiValidator from 'express-openapi-validator';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { sequence } from '../../server/http/pipeline.ts';
import { directValidator, validatorDirect } from '../../server/http/validator-direct.ts';

const spec = {
  openapi: '3.1.0',
  info: { title: 't', version: '1' },
  paths: {
    '/api/v1/things/{id}': {
      post: {
        operationId: 'postThing',
        parameters: [{ name: 'id', in: 'path', required: true, schema: { type: 'integer' } }],
        requestBody: {
          required: true,
          content: {
            'application/json': {
              schema: {
                type: 'object',
                required: ['name'],
                additionalProperties: false,
                properties: { name: { type: 'string', minLength: 1 }, n: { type: 'integer', default: 3 } },
              },
            },
          },
        },
        responses: { '200': { description: 'ok' } },
      },
    },
  },
};

function middlewares() {
  const list = OpenApiValidator.middleware({
    apiSpec: structuredClone(spec) as unknown as string,
    validateApiSpec: false,
    validateRequests: { allErrors: true },
    validateResponses: false,
    validateSecurity: false,
    ignoreUndocumented: false,
    fileUploader: { limits: { fileSize: 1024, files: 1 } },
  });
  return { list, instance: (OpenApiValidator.middleware as { _oav?: unknown })._oav };
}

type Step = (req: Request, res: Response, next: NextFunction) => unknown;
/** Promises made from the first step to the handler (the hook enabled and disabled around them). */
let madeInChain = 0;

/** An app running `steps` as the server runs them (one `sequence` layer), answering what it got. */
function appOf(steps: Step[]) {
  const app = express();
  app.use(express.json());
  let made = 0;
  const hook = createHook({
    init(_id, type) {
      if (type === 'PROMISE') made++;
    },
  });
  const start: Step = (_req, _res, next) => {
    made = 0;
    hook.enable();
    next();
  };
  const end: Step = (req, res) => {
    hook.disable();
    madeInChain = made;
    const openapi = (req as Request & { openapi?: { schema?: { operationId?: string } } }).openapi;
    res.json({ operationId: openapi?.schema?.operationId, params: req.params, body: req.body });
  };
  app.use(sequence([start, ...steps, end]));
  app.use((error: { status?: number; message: string }, _req: Request, res: Response, _n: NextFunction) => {
    hook.disable();
    res.status(error.status ?? 500).json({ error: error.message });
  });
  return app;
}

async function listen(app: express.Express) {
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { server, base: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

const requests: { path: string; method?: string; body?: string; type?: string }[] = [
  { path: '/api/v1/things/7', body: '{"name":"a"}' },
  { path: '/api/v1/things/7', body: '{"name":""}' },
  { path: '/api/v1/things/7', body: '{"name":"a","extra":1}' },
  { path: '/api/v1/things/x', body: '{"name":"a"}' },
  { path: '/api/v1/things/7', body: 'name=a', type: 'application/x-www-form-urlencoded' },
  { path: '/api/v1/things/7', method: 'GET' },
  { path: '/api/v1/nothing', body: '{}' },
  { path: '/api/v1/things/8', body: '{"name":"b","n":5}' },
];

describe('directValidator', () => {
  const library = middlewares();
  const direct = middlewares();
  const wrapped = directValidator(direct.list, direct.instance);
  let servers: Awaited<ReturnType<typeof listen>>[] = [];

  beforeAll(async () => {
    servers = [await listen(appOf(library.list)), await listen(appOf(wrapped))];
  });
  afterAll(() => {
    for (const { server } of servers) server.close();
  });

  async function send(base: string, r: (typeof requests)[number]) {
    const response = await fetch(`${base}${r.path}`, {
      method: r.method ?? 'POST',
      ...(r.body === undefined
        ? {}
        : { body: r.body, headers: { 'content-type': r.type ?? 'application/json' } }),
    });
    return { status: response.status, body: await response.json() };
  }

  test('every middleware is wrapped, under its own name', () => {
    expect(validatorDirect()).toBe(true);
    expect(wrapped.map((m) => m.name)).toEqual(library.list.map((m) => m.name));
    expect(wrapped).not.toEqual(direct.list);
  });

  test("answers as the library's own middlewares, the first request and every later one", async () => {
    const [own, ours] = servers as unknown as [{ base: string }, { base: string }];
    for (const round of [1, 2]) {
      for (const r of requests) {
        const expected = await send(own.base, r);
        expect({ round, ...r, ...(await send(ours.base, r)) }).toEqual({ round, ...r, ...expected });
      }
    }
    expect((await send(ours.base, requests[0] as (typeof requests)[number])).body).toEqual({
      operationId: 'postThing',
      params: { id: 7 },
      body: { name: 'a', n: 3 },
    });
  });

  test('once built, a request goes through without the promise hop of each middleware', async () => {
    const [own, ours] = servers as unknown as [{ base: string }, { base: string }];
    const valid = requests[0] as (typeof requests)[number];
    await send(own.base, valid);
    const library = madeInChain;
    await send(ours.base, valid);
    // The library's: a `then` and a `catch` per middleware, and the sequence's `then` on the result.
    expect(library).toBeGreaterThanOrEqual(3 * wrapped.length);
    // Ours: only the multipart middleware's own, an async function whatever the request's content type.
    expect(madeInChain).toBeLessThanOrEqual(1);
  });

  test('a validator whose middlewares it does not know is kept as it is', () => {
    const unknown = middlewares();
    const renamed = [...unknown.list, function someNewMiddleware() {}];
    expect(directValidator(renamed, unknown.instance)).toBe(renamed);
    expect(validatorDirect()).toBe(false);
    expect(directValidator(unknown.list, undefined)).toBe(unknown.list);
    expect(validatorDirect()).toBe(false);
    // Put back for any test after these.
    directValidator(middlewares().list, (OpenApiValidator.middleware as { _oav?: unknown })._oav);
    expect(validatorDirect()).toBe(true);
  });
});
