/**
 * The HTTP foundation: the error model, authentication rules, common headers, CORS and compression, on the
 * real app with response validation on. Authentication uses an in-memory key port.
 */
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { ApiKeyPrincipal } from '../../server/http/auth.ts';
import { startTestApp, type TestApp } from '../support/app.ts';
import { ContractValidator, listOperations, loadBundle, type Operation } from '../support/contract.ts';

const doc = loadBundle();
const validator = new ContractValidator(doc);
const operations = new Map(listOperations(doc).map((op) => [op.operationId, op]));
const op = (id: string) => operations.get(id) as Operation;

const keys: Record<string, ApiKeyPrincipal> = {
  'inference-secret': { kind: 'apiKey', accountId: 'acct-1', keyId: 'key-1', keyType: 'INFERENCE' },
  'admin-secret': { kind: 'apiKey', accountId: 'acct-1', keyId: 'key-2', keyType: 'ADMIN' },
};
const inference = { authorization: 'Bearer inference-secret' };
const admin = { authorization: 'Bearer admin-secret' };
const json = { 'content-type': 'application/json' };
const chat = { model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'hi' }] };

let app: TestApp;
let ready = true;

beforeAll(async () => {
  app = await startTestApp({
    auth: { authenticateApiKey: async (secret) => keys[secret] },
    readiness: async () => {
      if (!ready) throw new Error('database unreachable');
    },
    handlers: {
      listImageStyles: async () => ({
        status: 200,
        body: { object: 'list', data: Array.from({ length: 400 }, (_, i) => `Style number ${i}`) },
      }),
      listModelTraits: async () => ({
        status: 200,
        // Deliberately outside the contract: response validation must refuse it.
        body: { object: 'list', type: 'text', data: { default: 42 } } as never,
      }),
      createChatCompletion: async () => ({
        stream: async (res) => {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.end(`data: ${'x'.repeat(2000)}\n\ndata: [DONE]\n\n`);
        },
      }),
    },
  });
});

afterAll(async () => {
  await app?.close();
});

async function call(path: string, init: RequestInit = {}) {
  const response = await fetch(`${app.url}${path}`, init);
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  return { status: response.status, headers: response.headers, body: body as Record<string, unknown>, text };
}

describe('common headers', () => {
  test('behavior: every response carries a unique CF-RAY and the spec revision', async () => {
    const a = await call('/models');
    const b = await call('/nope');
    for (const r of [a, b]) {
      expect(r.headers.get('cf-ray')).toMatch(/^[0-9a-f]{16}-[A-Z]{3}$/);
      expect(r.headers.get('x-service-version')).toBe((doc.info as { version: string }).version);
      expect(r.headers.get('date')).toBeTruthy();
    }
    expect(a.headers.get('cf-ray')).not.toBe(b.headers.get('cf-ray'));
  });
});

describe('error model', () => {
  test('behavior: unknown path under the base path -> 404 {error}', async () => {
    const r = await call('/no/such/thing');
    expect(r.status).toBe(404);
    expect(r.body).toMatchObject({
      error: expect.stringContaining('/api/v1/no/such/thing'),
      code: 'NOT_FOUND',
    });
    expect(r.headers.get('x-service-host-name')).toBeTruthy();
  });

  test('behavior: a path outside the base path (a base URL without /api/v1) -> 404 {error} naming the base path', async () => {
    const origin = new URL(app.url).origin;
    for (const [method, path] of [
      ['POST', '/chat/completions'],
      ['GET', '/models'],
      ['GET', '/no/such/thing'],
    ] as const) {
      const r = await fetch(`${origin}${path}`, {
        method,
        headers: { 'content-type': 'application/json' },
        ...(method === 'POST' ? { body: '{}' } : {}),
      });
      expect(r.status, path).toBe(404);
      expect(r.headers.get('content-type')).toMatch(/^application\/json/);
      expect(await r.json()).toEqual({
        error: `Not found: ${method} ${path} (the API is under /api/v1)`,
        code: 'NOT_FOUND',
      });
    }
    // The routes outside it still answer.
    expect((await fetch(`${origin}/healthz`)).status).toBe(200);
  });

  test('behavior: wrong method on a known path -> 405 {error}', async () => {
    const r = await call('/models', { method: 'DELETE', headers: inference });
    expect(r.status).toBe(405);
    expect(typeof r.body.error).toBe('string');
  });

  test('behavior: malformed JSON -> 400 {error}, never 500', async () => {
    const r = await call('/chat/completions', {
      method: 'POST',
      headers: { ...inference, ...json },
      body: '{"model": ',
    });
    expect(r.status).toBe(400);
    expect(r.body).toEqual({ error: 'Invalid JSON request body', code: 'INVALID_JSON' });
  });

  test('behavior: a non-JSON content type on chat -> 415 {error}', async () => {
    const r = await call('/chat/completions', {
      method: 'POST',
      headers: { ...inference, 'content-type': 'text/plain' },
      body: 'hello',
    });
    expect(r.status).toBe(415);
    expect(r.body).toMatchObject({
      error: expect.stringContaining('text/plain'),
      code: 'INVALID_CONTENT_TYPE',
    });
  });

  test('behavior: a validation failure -> 400 {error, details} with the _errors tree per field', async () => {
    const r = await call('/chat/completions', {
      method: 'POST',
      headers: { ...inference, ...json },
      body: JSON.stringify({ ...chat, frequency_penalty: 3, messages: [{ role: 'wizard', content: 'x' }] }),
    });
    expect(r.status).toBe(400);
    const details = r.body.details as Record<string, { _errors: string[] }>;
    expect(details._errors).toEqual([]);
    expect(details.frequency_penalty?._errors).toEqual(['must be <= 2']);
    expect(details.messages).toBeDefined();
    expect(validator.checkResponse(op('createChatCompletion'), 400, r.headers, { json: r.body })).toEqual([]);
  });

  test('behavior: a bad query parameter -> 400 with details on that parameter', async () => {
    const r = await call('/models?type=bogus');
    expect(r.status).toBe(400);
    const type = (r.body.details as Record<string, { _errors: string[] }>).type;
    expect(type?._errors.length).toBeGreaterThan(0);
  });

  test('behavior: an unknown query parameter -> 400', async () => {
    const r = await call('/models?colour=blue');
    expect(r.status).toBe(400);
  });

  test('behavior: an operation whose issue has not landed -> 501 {"error": "Not implemented"}', async () => {
    const r = await call('/embeddings', {
      method: 'POST',
      headers: { ...inference, ...json },
      body: JSON.stringify({ model: 'text-embedding-bge-m3', input: 'hello' }),
    });
    expect(r.status).toBe(501);
    expect(r.body).toEqual({ error: 'Not implemented' });
  });

  test('behavior: a response outside the contract is refused by response validation (500), not sent', async () => {
    const r = await call('/models/traits');
    expect(r.status).toBe(500);
    expect(r.body).toEqual({ error: 'Internal server error', code: 'INTERNAL_ERROR' });
  });
});

describe('authentication', () => {
  test('behavior: no credentials on an inference operation -> 402 x402 discovery with PAYMENT-REQUIRED', async () => {
    const r = await call('/chat/completions', { method: 'POST', headers: json, body: JSON.stringify(chat) });
    expect(r.status).toBe(402);
    expect(r.body).toMatchObject({
      x402Version: 2,
      resource: { url: `${app.config.publicOrigin}/api/v1/chat/completions` },
      accepts: [expect.objectContaining({ scheme: 'exact', network: 'eip155:8453' })],
    });
    expect((r.body.extensions as Record<string, unknown>)['sign-in-with-x']).toMatchObject({
      info: { domain: new URL(app.config.publicOrigin).host, version: '1' },
    });
    const header = JSON.parse(Buffer.from(r.headers.get('payment-required') ?? '', 'base64').toString());
    const { authOptions: _authOptions, ...requirements } = r.body;
    expect(header).toEqual(requirements);
    expect(validator.checkResponse(op('createChatCompletion'), 402, r.headers, { json: r.body })).toEqual([]);
  });

  test('behavior: no credentials and a malformed body still -> 402 (authentication comes first)', async () => {
    const r = await call('/chat/completions', { method: 'POST', headers: json, body: '{oops' });
    expect(r.status).toBe(402);
  });

  test('behavior: an unknown key -> 401 {error}', async () => {
    const r = await call('/chat/completions', {
      method: 'POST',
      headers: { authorization: 'Bearer wrong', ...json },
      body: JSON.stringify(chat),
    });
    expect(r.status).toBe(401);
    expect(r.body).toEqual({ error: 'Authentication failed', code: 'AUTHENTICATION_FAILED' });
  });

  test('behavior: a malformed Authorization header -> 401', async () => {
    const r = await call('/api_keys', { headers: { authorization: 'Basic abc' } });
    expect(r.status).toBe(401);
  });

  test('behavior: an INFERENCE key on an admin-only operation -> 401 Admin API key required', async () => {
    for (const path of ['/api_keys', '/billing/balance', '/api_keys/rate_limits/log']) {
      const r = await call(path, { headers: inference });
      expect(r.status, path).toBe(401);
      expect(r.body, path).toEqual({ error: 'Admin API key required' });
    }
  });

  test('behavior: an ADMIN key passes the admin check', async () => {
    const r = await call('/api_keys', { headers: admin });
    expect(r.status).toBe(501);
  });

  test('behavior: rate_limits takes either key type', async () => {
    const r = await call('/api_keys/rate_limits', { headers: inference });
    expect(r.status).toBe(501);
  });

  test('behavior: no credentials on an admin operation -> 401, not 402', async () => {
    const r = await call('/billing/balance');
    expect(r.status).toBe(401);
    expect(r.body.code).toBe('AUTHENTICATION_REQUIRED');
  });

  test('behavior: public operations need no key', async () => {
    const r = await call('/image/styles');
    expect(r.status).toBe(200);
  });
});

describe('operations surface', () => {
  test('behavior: /healthz is up and /readyz follows the database', async () => {
    expect((await fetch(`${app.origin}/healthz`)).status).toBe(200);
    expect((await fetch(`${app.origin}/readyz`)).status).toBe(200);
    ready = false;
    try {
      const r = await fetch(`${app.origin}/readyz`);
      expect(r.status).toBe(503);
    } finally {
      ready = true;
    }
  });

  test('behavior: /metrics counts requests by operation and status', async () => {
    await call('/image/styles');
    const text = await (await fetch(`${app.origin}/metrics`)).text();
    expect(text).toMatch(/http_requests_total\{operation="listImageStyles",status="200"\} \d+/);
    expect(text).toContain('http_request_duration_seconds_bucket{operation="listImageStyles"');
  });

  test('behavior: /openapi.yaml serves the bundle and /docs renders it from local assets', async () => {
    const spec = await (await fetch(`${app.origin}/openapi.yaml`)).text();
    expect(spec).toContain('openapi: 3.1.0');
    const page = await (await fetch(`${app.origin}/docs`)).text();
    expect(page).toContain('/docs/assets/swagger-ui-bundle.js');
    expect(page).not.toMatch(/https?:\/\//);
    const asset = await fetch(`${app.origin}/docs/assets/swagger-ui-bundle.js`);
    expect(asset.status).toBe(200);
    expect((await asset.arrayBuffer()).byteLength).toBeGreaterThan(100_000);
  });

  test('behavior: the routes outside the contract answer with its headers, and an API request never enters them', async () => {
    const entered: string[] = [];
    const outside = await startTestApp({
      auth: { authenticateApiKey: async (secret) => keys[secret] },
      handlers: { listImageStyles: async () => ({ status: 200, body: { object: 'list', data: ['x'] } }) },
      mountRoutes: (router) => {
        router.use((req, _res, next) => {
          entered.push(req.path);
          next();
        });
        router.get('/media/thing', (_req, res) => {
          res.json({ thing: true });
        });
      },
    });
    try {
      const media = await fetch(`${outside.origin}/media/thing`, {
        headers: { origin: 'https://app.example' },
      });
      expect(media.status).toBe(200);
      expect(await media.json()).toEqual({ thing: true });
      expect(media.headers.get('cf-ray')).toBeTruthy();
      expect((await fetch(`${outside.origin}/healthz`)).status).toBe(200);
      expect((await fetch(`${outside.origin}/nowhere`)).status).toBe(404);
      expect((await fetch(`${outside.url}/image/styles`, { headers: inference })).status).toBe(200);
      // The base path's prefix in capitals is still under it (as Express mounts), though no operation's path.
      expect((await fetch(`${outside.origin}/API/V1/image/styles`, { headers: inference })).status).toBe(404);
      expect((await fetch(`${outside.url}/nowhere`, { headers: inference })).status).toBe(404);
      // The operations surface comes first: /healthz is answered before these routes.
      expect(entered).toEqual(['/media/thing', '/nowhere']);
    } finally {
      await outside.close();
    }
  });
});

describe('CORS and compression', () => {
  test('behavior: a preflight is answered and the x402 headers are allowed and exposed', async () => {
    const r = await fetch(`${app.url}/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://localhost:5173', 'access-control-request-method': 'POST' },
    });
    expect(r.status).toBe(204);
    expect(r.headers.get('access-control-allow-headers')).toContain('SIGN-IN-WITH-X');
    expect(r.headers.get('access-control-expose-headers')).toContain('PAYMENT-REQUIRED');
    expect(r.headers.get('access-control-expose-headers')).toContain('X-Balance-Remaining');
  });

  test('behavior: JSON is gzip- or br-compressed when asked', async () => {
    for (const encoding of ['gzip', 'br']) {
      const r = await fetch(`${app.url}/image/styles`, { headers: { 'accept-encoding': encoding } });
      expect(r.headers.get('content-encoding')).toBe(encoding);
      expect(((await r.json()) as { data: string[] }).data).toHaveLength(400);
    }
  });

  test('behavior: the bytes on the wire really are gzip', async () => {
    const { request } = await import('node:http');
    const raw = await new Promise<Buffer>((resolve, reject) => {
      request(`${app.url}/image/styles`, { headers: { 'accept-encoding': 'gzip' } }, (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () => resolve(Buffer.concat(parts)));
      })
        .on('error', reject)
        .end();
    });
    expect(JSON.parse(gunzipSync(raw).toString()).data).toHaveLength(400);
  });

  test('behavior: without response validation a shared frozen body (the model list) is the same JSON bytes each time, compressed only when asked', async () => {
    // Without response validation (production), a frozen body's JSON is reused across requests.
    // Kept as its UTF-8 bytes (app.ts): a name beyond ASCII checks the encoding and the length.
    const data = Array.from({ length: 200 }, (_, i) =>
      Object.freeze({ id: `model-${i}`, ...(i === 7 ? { name: 'Modèle — sept 😀' } : {}) }),
    );
    const list = Object.freeze({
      object: 'list',
      type: 'text',
      data: Object.freeze(data),
    }) as unknown as never;
    let calls = 0;
    const production = await startTestApp({
      env: { VALIDATE_RESPONSES: 'false' },
      handlers: {
        listModels: async () => {
          calls += 1;
          return { status: 200, body: list };
        },
      },
    });
    try {
      const { request } = await import('node:http');
      const get = (headers: Record<string, string>) =>
        new Promise<{ headers: Record<string, unknown>; body: Buffer }>((resolve, reject) => {
          request(`${production.url}/models`, { headers }, (res) => {
            const parts: Buffer[] = [];
            res.on('data', (c: Buffer) => parts.push(c));
            res.on('end', () => resolve({ headers: res.headers, body: Buffer.concat(parts) }));
          })
            .on('error', reject)
            .end();
        });
      const plain = await get({});
      const again = await get({});
      expect(plain.headers['content-type']).toBe('application/json; charset=utf-8');
      expect(plain.headers['content-encoding']).toBeUndefined();
      expect(JSON.parse(plain.body.toString())).toEqual({ object: 'list', type: 'text', data });
      expect(plain.headers['content-length']).toBe(String(plain.body.length));
      expect(again.body.equals(plain.body)).toBe(true);
      expect(again.headers['content-length']).toBe(String(plain.body.length));
      const zipped = await get({ 'accept-encoding': 'gzip' });
      expect(zipped.headers['content-encoding']).toBe('gzip');
      expect(gunzipSync(zipped.body).equals(plain.body)).toBe(true);
      expect(calls).toBe(3);
    } finally {
      await production.close();
    }
  });

  test('behavior: without response validation a JSON answer is written directly, with the headers res.json gives', async () => {
    // Over compression's 1 kB threshold, with characters of two and three bytes.
    const data = Array.from({ length: 60 }, (_, i) => ({ id: `modèle-ünïcode-✓-${i}` }));
    const body = { object: 'list', type: 'text', data } as unknown as never;
    const production = await startTestApp({
      env: { VALIDATE_RESPONSES: 'false' },
      handlers: { listModels: async () => ({ status: 200, body }) },
    });
    try {
      const { request } = await import('node:http');
      const call = (method: string, headers: Record<string, string> = {}) =>
        new Promise<{ status?: number; headers: Record<string, unknown>; body: Buffer }>(
          (resolve, reject) => {
            request(`${production.url}/models`, { method, headers }, (res) => {
              const parts: Buffer[] = [];
              res.on('data', (c: Buffer) => parts.push(c));
              res.on('end', () =>
                resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts) }),
              );
            })
              .on('error', reject)
              .end();
          },
        );
      const plain = await call('GET');
      expect(plain.status).toBe(200);
      expect(plain.headers['content-type']).toBe('application/json; charset=utf-8');
      expect(plain.headers['content-length']).toBe(String(Buffer.byteLength(JSON.stringify(body))));
      expect(plain.body.toString()).toBe(JSON.stringify(body));
      expect(plain.headers['cf-ray']).toEqual(expect.any(String));
      const zipped = await call('GET', { 'accept-encoding': 'gzip' });
      expect(zipped.headers['content-encoding']).toBe('gzip');
      expect(gunzipSync(zipped.body).equals(plain.body)).toBe(true);
    } finally {
      await production.close();
    }
  });

  test('behavior: an event stream is never compressed', async () => {
    const r = await fetch(`${app.url}/chat/completions`, {
      method: 'POST',
      headers: { ...inference, ...json, 'accept-encoding': 'gzip, br' },
      body: JSON.stringify({ ...chat, stream: true }),
    });
    expect(r.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(r.headers.get('content-encoding')).toBeNull();
    expect(await r.text()).toContain('data: [DONE]');
  });
});
