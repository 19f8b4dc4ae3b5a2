/**
 * The OpenAI-compatible upstream image adapter against real HTTP: a second instance of this server on its
 * embedded engine, and loopback upstreams that answer well, fail with 500, refuse with 429 or a content-policy
 * 400, never answer, send data that is not an image, or send the wrong number of images. Also: failover to
 * the next backend, the size sent upstream and the end-user attribution, and that failures charge nothing.
 */
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import type { ImageGenerateResponse } from '../../generated/api.d.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';

const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};
const turbo = defaults.models['z-image-turbo'] as Record<string, unknown>;
const unlimited = { paid: { requestsPerMinute: 10_000 }, partner: { requestsPerMinute: 10_000 } };

/** Image models like z-image-turbo routed to the given backends. */
function catalog(models: Record<string, unknown>): string {
  return stringify({
    models: Object.fromEntries(
      Object.entries(models).map(([id, provider]) => [id, { ...turbo, provider, rateLimits: unlimited }]),
    ),
  });
}

// ---------------------------------------------------------------------------------------------------------
// Loopback upstreams

let fake: Server;
let fakeBase = '';
const held: ServerResponse[] = [];
const received: { path: string; body: Record<string, unknown> }[] = [];

async function png(width: number, height: number): Promise<string> {
  const image = await sharp({ create: { width, height, channels: 3, background: { r: 30, g: 90, b: 160 } } })
    .png()
    .toBuffer();
  return image.toString('base64');
}

function route(req: IncomingMessage, res: ServerResponse) {
  const name = (req.url ?? '').split('/')[1] ?? '';
  let raw = '';
  req.on('data', (chunk: Buffer) => {
    raw += chunk.toString('utf8');
  });
  req.on('end', () => {
    const body = JSON.parse(raw || '{}') as Record<string, unknown>;
    received.push({ path: req.url ?? '', body });
    const json = (status: number, value: unknown, headers: Record<string, string> = {}): void => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(value));
    };
    const [w, h] = String(body.size ?? '1024x1024')
      .split('x')
      .map(Number) as [number, number];
    switch (name) {
      case 'slow':
        held.push(res);
        return;
      case 'fail500':
        return json(500, { error: 'boom' });
      case 'busy429':
        return json(429, { error: 'slow down' }, { 'retry-after': '7' });
      case 'policy':
        return json(400, { error: { message: 'rejected', code: 'content_policy_violation' } });
      case 'garbage':
        return json(200, {
          created: 1,
          data: [{ b64_json: Buffer.from('not an image').toString('base64') }],
        });
      case 'short':
        return json(200, { created: 1, data: [] });
      default:
        void png(w, h).then((b64) =>
          json(200, {
            created: 1,
            data: Array.from({ length: Number(body.n ?? 1) }, () => ({ b64_json: b64 })),
          }),
        );
    }
  });
}

const upstream = (name: string, extra: Record<string, unknown> = {}) => ({
  kind: 'openai-compatible',
  name,
  baseUrl: `${fakeBase}/${name}`,
  ...extra,
});

// ---------------------------------------------------------------------------------------------------------

let second: ChatServer;
let server: ChatServer;
let secondAccount = '';

beforeAll(async () => {
  fake = createServer(route).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => fake.once('listening', () => resolve()));
  fakeBase = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;

  second = await startChatServer({ catalogYaml: catalog({ 'z-image-turbo': { kind: 'local' } }) });
  const upstreamAccount = await second.account('10');
  secondAccount = upstreamAccount.accountId;
  server = await startChatServer({
    env: { IMAGE_UPSTREAM_KEY: upstreamAccount.key },
    catalogYaml: catalog({
      'via-second': {
        kind: 'openai-compatible',
        name: 'second-instance',
        baseUrl: second.base,
        apiKeyEnv: 'IMAGE_UPSTREAM_KEY',
        upstreamModel: 'z-image-turbo',
      },
      'via-ok': upstream('ok'),
      'via-fail500': upstream('fail500'),
      'via-busy429': upstream('busy429'),
      'via-policy': upstream('policy'),
      'via-slow': upstream('slow', { timeoutMs: 300 }),
      'via-garbage': upstream('garbage'),
      'via-short': upstream('short'),
      'via-failover': [upstream('fail500'), upstream('ok')],
    }),
  });
});

afterAll(async () => {
  for (const res of held) res.destroy();
  fake?.closeAllConnections();
  await new Promise<void>((resolve) => (fake ? fake.close(() => resolve()) : resolve()));
  await server?.close();
  await second?.close();
});

async function post(key: string, body: Record<string, unknown>) {
  return fetch(`${server.base}/image/generate`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'a lighthouse at dawn', width: 256, height: 256, ...body }),
  });
}

async function charges(target: ChatServer, account: string) {
  return (await target.services.ledger.listEntries(account, { limit: 100 })).filter(
    (e) => e.type === 'CHARGE',
  );
}

describe('a second instance of this server as the upstream', () => {
  test('behavior: the image comes from the second instance, finished here in the asked format', async () => {
    const { key, accountId } = await server.account('5');
    const response = await post(key, {
      model: 'via-second',
      format: 'jpeg',
      variants: 2,
      embed_exif_metadata: true,
    });
    const json = (await response.json()) as ImageGenerateResponse;
    expect(response.status, JSON.stringify(json)).toBe(200);
    expect(response.headers.get('x-service-model-router')).toBe('second-instance');
    expect(json.images).toHaveLength(2);
    for (const b64 of json.images) {
      const meta = await sharp(Buffer.from(b64, 'base64')).metadata();
      expect(meta).toMatchObject({ format: 'jpeg', width: 256, height: 256 });
      expect(meta.exif).toBeDefined();
    }
    // Both instances billed their own caller.
    expect((await charges(server, accountId)).map((l) => l.amountNano)).toEqual([
      -2n * parseUsdToNano('0.01'),
    ]);
    expect((await charges(second, secondAccount)).map((l) => l.amountNano)).toContainEqual(
      -2n * parseUsdToNano('0.01'),
    );
  });
});

describe('loopback upstreams', () => {
  test('behavior: the nearest OpenAI size, n, b64_json and the end user are sent; the result is resized', async () => {
    const { key, accountId } = await server.account('5');
    received.length = 0;
    const response = await post(key, {
      model: 'via-ok',
      width: 320,
      height: 192,
      anon_user_id: 'user-7',
      format: 'png',
    });
    const json = (await response.json()) as ImageGenerateResponse;
    expect(response.status).toBe(200);
    expect(received[0]?.body).toMatchObject({
      model: 'via-ok',
      n: 1,
      size: '1792x1024',
      response_format: 'b64_json',
      user: `${accountId}||user-7`,
    });
    const meta = await sharp(Buffer.from(json.images[0] as string, 'base64')).metadata();
    expect(meta).toMatchObject({ format: 'png', width: 320, height: 192 });
  });

  test('behavior: upstream failures map to statuses and charge nothing', async () => {
    const cases: [string, number, string | undefined][] = [
      ['via-fail500', 500, 'INFERENCE_FAILED'],
      ['via-busy429', 503, 'MODEL_AT_CAPACITY'],
      ['via-policy', 422, 'CONTENT_POLICY_VIOLATION'],
      ['via-slow', 503, 'REQUEST_TIMEOUT'],
      ['via-garbage', 500, 'INFERENCE_FAILED'],
      ['via-short', 500, 'INFERENCE_FAILED'],
    ];
    for (const [model, status, code] of cases) {
      const { key, accountId } = await server.account('5');
      const response = await post(key, { model });
      const body = (await response.json()) as { error: string; code?: string };
      expect(response.status, model).toBe(status);
      expect(body.code, model).toBe(code);
      if (model === 'via-busy429') expect(response.headers.get('retry-after')).toBe('7');
      expect(await charges(server, accountId), model).toEqual([]);
      const balance = await server.services.ledger.getBalance(accountId);
      expect(balance.usdNano, model).toBe(parseUsdToNano('5'));
    }
  });

  test('behavior: a failing backend fails over to the next one', async () => {
    const { key } = await server.account('5');
    const response = await post(key, { model: 'via-failover' });
    expect(response.status).toBe(200);
    expect(response.headers.get('x-service-model-router')).toBe('ok');
  });
});
