/**
 * The server foundation end to end, through HTTP, on both engines: bootstrap, API keys, rate limits, billing
 * and the catalogue. Response validation is on, so every body here was also checked against the contract.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { bootstrap } from '../../server/bootstrap.ts';
import { createCharges } from '../../server/domains/billing/charges.ts';
import { createRateLimiter } from '../../server/domains/limits/rate-limiter.ts';
import type { Services } from '../../server/services.ts';
import { ContractValidator, loadBundle } from '../support/contract.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';
import { type StartedServer, startServer, TEST_ADMIN_KEY } from '../support/server.ts';

const validator = new ContractValidator(loadBundle());

const ADMIN = TEST_ADMIN_KEY;
const postgres = postgresPerFile();
const scratch = mkdtempSync(join(tmpdir(), 'api-test-'));

afterAll(() => {
  rmSync(scratch, { recursive: true, force: true });
});

type Engine = 'sqlite' | 'postgres';

async function databaseUrl(engine: Engine, name: string): Promise<string> {
  if (engine === 'sqlite') return `sqlite:${join(scratch, `${name}.db`)}`;
  return postgres().createDatabase(name);
}

describe.each<[Engine]>([['sqlite'], ['postgres']])('API on %s', (engine) => {
  let server: StartedServer;
  let services: Services;
  /** `direct` bypasses the Prism proxy (when on): it answers credential-less requests itself with 401. */
  const call = async (path: string, init: RequestInit & { key?: string; direct?: boolean } = {}) => {
    const headers = new Headers(init.headers);
    if (init.key) headers.set('authorization', `Bearer ${init.key}`);
    if (init.body) headers.set('content-type', 'application/json');
    const response = await fetch(`${init.direct ? server.directBase : server.base}${path}`, {
      ...init,
      headers,
    });
    const text = await response.text();
    const isJson = (response.headers.get('content-type') ?? '').includes('json');
    return {
      status: response.status,
      headers: response.headers,
      text,
      body: (isJson ? JSON.parse(text) : undefined) as Record<string, unknown> & { data?: unknown },
    };
  };

  beforeAll(async () => {
    server = await startServer(await databaseUrl(engine, `api_${engine}`));
    services = server.services;
  });

  afterAll(async () => {
    await server?.close();
  });

  describe('bootstrap', () => {
    test('behavior: ADMIN_API_KEY works and the bootstrap balance is credited once, across restarts', async () => {
      const first = await call('/billing/balance', { key: ADMIN });
      expect(first.status).toBe(200);
      expect(first.body).toMatchObject({ balances: { usd: 10 }, canConsume: true });
      // A second start on the same database credits nothing more.
      const again = await bootstrap(services, { adminApiKey: ADMIN, bootstrapBalanceUsd: '10' });
      expect(again).toMatchObject({ action: 'configured-key', credited: false });
      expect((await call('/billing/balance', { key: ADMIN })).body).toMatchObject({ balances: { usd: 10 } });
    });

    test('behavior: with an empty database and no ADMIN_API_KEY a key is generated once', async () => {
      const url = await databaseUrl(engine, `fresh_${engine}`);
      const fresh = await startServer(url, { ADMIN_API_KEY: '' });
      try {
        const second = await bootstrap(fresh.services, { adminApiKey: undefined, bootstrapBalanceUsd: '10' });
        expect(second).toEqual({ action: 'none' });
        const [account] = await fresh.services.accounts.list({ limit: 10 });
        expect(account).toBeDefined();
        const balance = await fresh.services.ledger.getBalance(account?.id ?? '');
        expect(balance.usdNano).toBe(10_000_000_000n);
      } finally {
        await fresh.close();
      }
    });
  });

  describe('API keys', () => {
    let inference: { id: string; apiKey: string };

    test('behavior: create returns the secret once; list and get never show it', async () => {
      const created = await call('/api_keys', {
        method: 'POST',
        key: ADMIN,
        body: JSON.stringify({
          apiKeyType: 'INFERENCE',
          description: 'Tests',
          consumptionLimit: { usd: 2.5 },
        }),
      });
      expect(created.status).toBe(200);
      const data = created.body.data as { id: string; apiKey: string; consumptionLimit: { usd: number } };
      expect(data.apiKey).toMatch(/^svc_inference_[0-9A-Za-z]{44}$/);
      expect(data.consumptionLimit.usd).toBe(2.5);
      inference = data;
      const list = await call('/api_keys', { key: ADMIN });
      expect(list.text).not.toContain(data.apiKey);
      const got = await call(`/api_keys/${data.id}`, { key: ADMIN });
      expect(got.body.data).toMatchObject({
        id: data.id,
        last6Chars: data.apiKey.slice(-6),
        apiKeyType: 'INFERENCE',
      });
      expect(got.text).not.toContain(data.apiKey);
      expect(got.body.data).toHaveProperty('currentPeriodUsage');
    });

    test('behavior: the new INFERENCE key authenticates but is refused on admin operations', async () => {
      expect((await call('/api_keys/rate_limits', { key: inference.apiKey })).status).toBe(200);
      const admin = await call('/api_keys', { key: inference.apiKey });
      expect(admin.status).toBe(401);
      expect(admin.body).toEqual({ error: 'Admin API key required' });
    });

    test('behavior: rate_limits reports the calling key: tier, balances, per-model limits', async () => {
      const r = await call('/api_keys/rate_limits', { key: inference.apiKey });
      const data = r.body.data as {
        apiTier: { id: string };
        balances: { USD: number };
        rateLimits: unknown[];
      };
      expect(data.apiTier.id).toBe('paid');
      expect(data.balances.USD).toBe(10);
      expect(data.rateLimits.length).toBeGreaterThan(0);
      expect(r.headers.get('x-ratelimit-limit-requests')).toBeTruthy();
    });

    test('behavior: update changes the description and removes a limit with null', async () => {
      const r = await call('/api_keys', {
        method: 'PATCH',
        key: ADMIN,
        body: JSON.stringify({ id: inference.id, description: 'Renamed', consumptionLimit: { usd: null } }),
      });
      expect(r.status).toBe(200);
      expect(r.body.data).toMatchObject({ description: 'Renamed', consumptionLimits: { usd: null } });
    });

    test('behavior: expiresAt in the past is a 400; unknown ids are 404', async () => {
      const past = await call('/api_keys', {
        method: 'POST',
        key: ADMIN,
        body: JSON.stringify({ apiKeyType: 'INFERENCE', description: 'Old', expiresAt: '2020-01-01' }),
      });
      expect(past.status).toBe(400);
      const unknown = '6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b';
      expect((await call(`/api_keys/${unknown}`, { key: ADMIN })).status).toBe(404);
      expect((await call(`/api_keys?id=${unknown}`, { method: 'DELETE', key: ADMIN })).status).toBe(404);
    });

    test('behavior: another account cannot see or delete the key', async () => {
      const other = await services.accounts.createApiAccount({ name: 'Other' });
      const { secret } = await services.keys.create({
        accountId: other.id,
        keyType: 'ADMIN',
        description: 'Other admin',
      });
      expect((await call(`/api_keys/${inference.id}`, { key: secret })).status).toBe(404);
      expect((await call(`/api_keys?id=${inference.id}`, { method: 'DELETE', key: secret })).status).toBe(
        404,
      );
    });

    test('behavior: a deleted key stops authenticating at once', async () => {
      const r = await call(`/api_keys?id=${inference.id}`, { method: 'DELETE', key: ADMIN });
      expect(r.body).toEqual({ success: true });
      expect((await call('/api_keys/rate_limits', { key: inference.apiKey })).status).toBe(401);
    });
  });

  describe('rate limits', () => {
    test('behavior: over the limit is 429 {error} with Retry-After, and the refusal is in rate_limits/log', async () => {
      const [key] = await services.keys.list(
        await services.keys.authenticate(ADMIN).then((r) => (r.ok ? r.key.accountId : '')),
      );
      expect(key).toBeDefined();
      // A clock fixed inside one minute: the loop below cannot straddle a window boundary.
      const fixed = Math.floor(Date.now() / 60_000) * 60_000 + 60_000 + 1_000;
      const limiter = createRateLimiter({
        rateLimits: services.rateLimits,
        catalog: services.catalog,
        now: () => fixed,
      });
      const principal = {
        kind: 'apiKey' as const,
        accountId: key?.accountId ?? '',
        keyId: key?.id ?? '',
        keyType: 'ADMIN' as const,
      };
      const limit = services.catalog.getModel('llama-3.3-70b')?.rateLimits.paid?.requestsPerMinute ?? 0;
      expect(limit).toBeGreaterThan(0);
      const admitted = [];
      for (let i = 0; i < limit; i++) admitted.push(await limiter.admit(principal, 'paid', 'llama-3.3-70b'));
      expect(admitted.at(-1)?.headers['x-ratelimit-remaining-requests']).toBe(0);
      const refused = await Promise.resolve(limiter.admit(principal, 'paid', 'llama-3.3-70b')).catch(
        (e: unknown) => e,
      );
      expect(refused).toMatchObject({ status: 429, code: 'RATE_LIMIT_EXCEEDED' });
      expect((refused as { headers: Record<string, string> }).headers['Retry-After']).toMatch(/^\d+$/);
      const log = await call('/api_keys/rate_limits/log', { key: ADMIN });
      expect(log.body.data).toEqual(
        expect.arrayContaining([expect.objectContaining({ modelId: 'llama-3.3-70b', rateLimitType: 'RPM' })]),
      );
    });

    test('behavior: tokens used count against tokens per minute; a full window refuses with TPM', async () => {
      const account = await services.accounts.createApiAccount({ name: 'Tokens' });
      const { key } = await services.keys.create({
        accountId: account.id,
        keyType: 'INFERENCE',
        description: 'T',
      });
      // A clock fixed inside one minute: the loop below cannot straddle a window boundary.
      const fixed = Math.floor(Date.now() / 60_000) * 60_000 + 60_000 + 1_000;
      const limiter = createRateLimiter({
        rateLimits: services.rateLimits,
        catalog: services.catalog,
        now: () => fixed,
      });
      const principal = {
        kind: 'apiKey' as const,
        accountId: account.id,
        keyId: key.id,
        keyType: 'INFERENCE' as const,
      };
      const tpm = services.catalog.getModel('llama-3.3-70b')?.rateLimits.paid?.tokensPerMinute ?? 0;
      const before = await limiter.admit(principal, 'paid', 'llama-3.3-70b');
      expect(before.headers['x-ratelimit-remaining-tokens']).toBe(tpm);
      await limiter.consumeTokens(principal, 'paid', 'llama-3.3-70b', tpm - 10);
      const after = await limiter.admit(principal, 'paid', 'llama-3.3-70b');
      expect(after.headers['x-ratelimit-remaining-tokens']).toBe(10);
      await limiter.consumeTokens(principal, 'paid', 'llama-3.3-70b', 10);
      const refused = await Promise.resolve(limiter.admit(principal, 'paid', 'llama-3.3-70b')).catch(
        (e: unknown) => e,
      );
      expect(refused).toMatchObject({ status: 429, code: 'RATE_LIMIT_EXCEEDED' });
      const events = await services.rateLimits.listEvents(account.id);
      expect(events[0]).toMatchObject({ limitType: 'TPM', modelId: 'llama-3.3-70b', apiKeyId: key.id });
    });

    test('behavior: authenticated responses carry the x-ratelimit-* headers', async () => {
      const r = await call('/billing/balance', { key: ADMIN });
      expect(Number(r.headers.get('x-ratelimit-remaining-requests'))).toBeGreaterThanOrEqual(0);
      expect(r.headers.get('x-ratelimit-type')).toBe('api_key');
    });
  });

  describe('billing', () => {
    let accountId = '';
    beforeAll(async () => {
      const auth = await services.keys.authenticate(ADMIN);
      accountId = auth.ok ? auth.key.accountId : '';
      // 25 charges of 0.01 USD each, on two models.
      for (let i = 0; i < 25; i++) {
        const { reservation } = await services.ledger.reserve({
          accountId,
          amountNano: 20_000_000n,
          requestId: `req-${engine}-${i}`,
          modelId: i % 2 ? 'llama-3.3-70b' : 'z-image-turbo',
          ttlMs: 60_000,
        });
        await services.ledger.capture(reservation.id, {
          items: [
            {
              sku: i % 2 ? 'output_tokens' : 'image',
              amountNano: 10_000_000n,
              units: 100,
              details: { promptTokens: 12 },
            },
          ],
        });
      }
    });

    test('behavior: the balance reflects the charges exactly', async () => {
      const r = await call('/billing/balance', { key: ADMIN });
      expect(r.body).toMatchObject({ balances: { usd: 9.75 } });
    });

    test('behavior: usage history pages with a cursor that is sent alone', async () => {
      const first = await call('/billing/usage-history?pageSize=10', { key: ADMIN });
      expect(first.status).toBe(200);
      const page1 = first.body as unknown as { data: { amount: number }[]; nextCursor: string };
      expect(page1.data).toHaveLength(10);
      expect(page1.data[0]?.amount).toBe(-0.01);
      expect(first.headers.get('x-pagination-total')).toBe('25');
      expect(first.headers.get('x-pagination-total-pages')).toBe('3');
      const seen = [...page1.data];
      let cursor: string | null = page1.nextCursor;
      let pages = 1;
      while (cursor) {
        const next = await call(`/billing/usage-history?cursor=${cursor}`, { key: ADMIN });
        expect(next.headers.get('x-pagination-page')).toBe(String(++pages));
        const body = next.body as unknown as { data: { amount: number }[]; nextCursor: string | null };
        seen.push(...body.data);
        cursor = body.nextCursor;
      }
      expect(seen).toHaveLength(25);
      expect(
        (await call(`/billing/usage-history?cursor=${page1.nextCursor}&pageSize=10`, { key: ADMIN })).status,
      ).toBe(400);
      expect((await call('/billing/usage-history?cursor=bm90LWEtY3Vyc29y', { key: ADMIN })).status).toBe(400);
    });

    test('behavior: usage history as CSV when asked, with a download name', async () => {
      const r = await call('/billing/usage-history?pageSize=10', {
        key: ADMIN,
        headers: { accept: 'text/csv' },
      });
      expect(r.status).toBe(200);
      expect(r.headers.get('content-type')).toMatch(/^text\/csv/);
      expect(r.headers.get('content-disposition')).toMatch(
        /attachment; filename="billing-usage-history-\d{8}T\d{6}Z\.csv"/,
      );
      const lines = r.text.trim().split('\r\n');
      expect(lines[0]).toBe(
        'timestamp,sku,units,pricePerUnitUsd,amount,currency,notes,requestId,promptTokens,completionTokens,inferenceExecutionTime',
      );
      expect(lines).toHaveLength(11);
      expect(r.headers.get('x-next-cursor')).toBeTruthy();
    });

    test('behavior: analytics by day, model and key add up to the ledger', async () => {
      const r = await call('/billing/usage-analytics?lookback=7d', { key: ADMIN });
      expect(r.status).toBe(200);
      const body = r.body as unknown as {
        byDate: { USD: number }[];
        byModel: { modelName: string; totalUsd: number; modelType: string | null }[];
        byKey: { totalUsd: number }[];
      };
      expect(body.byDate).toHaveLength(7);
      expect(body.byDate.reduce((s, d) => s + d.USD, 0)).toBeCloseTo(0.25, 9);
      expect(body.byModel.find((m) => m.modelName === 'llama-3.3-70b')).toMatchObject({
        totalUsd: 0.12,
        modelType: 'text',
      });
      expect(body.byModel.find((m) => m.modelName === 'z-image-turbo')).toMatchObject({
        totalUsd: 0.13,
        modelType: 'image',
      });
    });

    test('behavior: analytics refuses more than 90 days and half a date range', async () => {
      expect((await call('/billing/usage-analytics?lookback=91d', { key: ADMIN })).status).toBe(400);
      expect((await call('/billing/usage-analytics?startDate=2026-11-01', { key: ADMIN })).status).toBe(400);
      expect(
        (await call('/billing/usage-analytics?startDate=2026-01-01&endDate=2026-11-01', { key: ADMIN }))
          .status,
      ).toBe(400);
    });
  });

  describe('reservations', () => {
    test('behavior: a key over its spend limit, or an account without balance, is refused with 402', async () => {
      const account = await services.accounts.createApiAccount({ name: 'Limited' });
      await services.ledger.topUp({
        accountId: account.id,
        amountNano: 1_000_000_000n,
        network: 'test',
        txHash: account.id,
      });
      const { key } = await services.keys.create({
        accountId: account.id,
        keyType: 'INFERENCE',
        description: 'Capped',
        limitUsdNano: 50_000_000n,
      });
      const charges = createCharges({ ledger: services.ledger, reservationTtlMs: 60_000 });
      const principal = {
        kind: 'apiKey' as const,
        accountId: account.id,
        keyId: key.id,
        keyType: 'INFERENCE' as const,
      };
      const first = await charges.reserve(principal, { amountNano: 40_000_000n, requestId: 'r1' });
      const capped = await charges
        .reserve(principal, { amountNano: 20_000_000n, requestId: 'r2' })
        .catch((e: unknown) => e);
      expect(capped).toMatchObject({ status: 402, code: 'API_KEY_USD_SPEND_LIMIT_EXCEEDED' });
      expect((capped as Error).message).toContain(
        'this API key has reached its configured USD spending limit',
      );
      await charges.release(first);

      const broke = await charges
        .reserve(principal, { amountNano: 2_000_000_000n, requestId: 'r3' })
        .catch((e: unknown) => e);
      expect(broke).toMatchObject({ status: 402, code: 'INSUFFICIENT_BALANCE' });
      const schema = validator.schema('PaymentRequiredError');
      expect(validator.validate(schema, (broke as { toBody(): unknown }).toBody())).toEqual([]);
      expect(validator.validate(schema, (capped as { toBody(): unknown }).toBody())).toEqual([]);
    });
  });

  describe('operations surface', () => {
    test('behavior: /readyz reaches the database and /metrics reports ledger totals and requests in flight', async () => {
      const origin = server.origin;
      expect((await fetch(`${origin}/readyz`)).status).toBe(200);
      const metrics = await (await fetch(`${origin}/metrics`)).text();
      // The scrape itself is in flight while it is rendered.
      expect(Number(/^http_requests_in_flight (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThanOrEqual(1);
      expect(metrics).toMatch(/ledger_usd\{kind="balance"\} \d/);
      // The money this process's entries moved: a counter, by type and currency.
      expect(metrics).toContain('# TYPE ledger_entries_usd_total counter');
      expect(metrics).toMatch(/^ledger_entries_usd_total\{type="TOP_UP",currency="USD"\} [1-9]/m);
    });
  });

  describe('inference headers', () => {
    test('behavior: an inference request reports the balance before it and deprecation notices', async () => {
      const r = await call('/chat/completions', {
        method: 'POST',
        key: ADMIN,
        body: JSON.stringify({ model: 'deepseek-r1-671b', messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(r.headers.get('x-service-balance-usd')).toMatch(/^\d+\.\d{8}$/);
      expect(r.headers.get('x-service-balance-diem')).toBe('0.00000000');
      expect(r.headers.get('x-service-model-deprecation-warning')).toContain('deprecated');
      expect(r.headers.get('x-service-model-deprecation-date')).toMatch(/^\d{4}-\d{2}-\d{2}$/);
      const current = await call('/chat/completions', {
        method: 'POST',
        key: ADMIN,
        body: JSON.stringify({ model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(current.headers.get('x-service-model-deprecation-warning')).toBeNull();
    });
  });

  describe('catalogue', () => {
    test('behavior: models by type, traits, compatibility mapping and styles need no key', async () => {
      const text = await call('/models');
      expect(text.body).toMatchObject({ object: 'list', type: 'text' });
      expect((text.body.data as { id: string }[]).map((m) => m.id)).toContain('llama-3.3-70b');
      const images = await call('/models?type=image');
      expect((images.body.data as { type: string }[]).every((m) => m.type === 'image')).toBe(true);
      expect((await call('/models/traits')).body.data).toMatchObject({ default: 'llama-3.3-70b' });
      expect((await call('/models/compatibility_mapping?type=embedding')).body.data).toMatchObject({
        'text-embedding-ada-002': 'text-embedding-bge-m3',
      });
      expect((await call('/image/styles')).body.data).toContain('Anime');
    });

    test('behavior: characters need a key, page with x-pagination headers, and resolve by slug', async () => {
      expect((await call('/characters', { direct: true })).status).toBe(402);
      const list = await call('/characters?limit=2', { key: ADMIN });
      expect(list.body.data).toHaveLength(2);
      expect(Number(list.headers.get('x-pagination-total'))).toBeGreaterThanOrEqual(2);
      const one = await call('/characters/the-archivist', { key: ADMIN });
      expect(one.body).toMatchObject({ object: 'character', data: { slug: 'the-archivist' } });
      expect(one.text).not.toContain('systemPrompt');
      expect((await call('/characters/no-such-character', { key: ADMIN })).status).toBe(404);
    });
  });
});
