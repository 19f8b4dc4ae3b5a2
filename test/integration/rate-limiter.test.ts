/**
 * The rate limiter over a real SQLite file: a model's tokens per minute, requests per day and per minute are
 * admitted together (in one statement, or in memory when the process holds the counts), a refusal is a 429 of
 * the window that refused (in the order tokens, day, minute), is logged, and counts the request in none of the
 * windows. Both ways of counting, the rows (`WORKERS` > 1, PostgreSQL) and the counts one process holds and
 * writes behind (held-counts.ts), answer alike.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { buildCatalog, DEFAULT_CATALOG_PATH } from '../../server/catalog/load.ts';
import { createCatalogService } from '../../server/catalog/service.ts';
import { createRateLimiter, type RateLimiter } from '../../server/domains/limits/rate-limiter.ts';
import type { ApiKeyPrincipal } from '../../server/http/auth.ts';
import { ApiError } from '../../server/http/errors.ts';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { createRateLimits, type RateLimitsRepository } from '../../server/storage/rate-limits.ts';

const MODEL = 'llama-3.3-70b';
const T0 = Date.UTC(2026, 0, 15, 12, 0, 0);
const scratch = mkdtempSync(join(tmpdir(), 'rate-limiter-'));
const shipped = readFileSync(DEFAULT_CATALOG_PATH, 'utf8');
let database: Database;
let rateLimits: RateLimitsRepository;
let limiter: RateLimiter;
let nowMs = T0;
let principal: ApiKeyPrincipal;

afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe.each([
  { held: false, name: 'counted in the rows' },
  { held: true, name: 'held in the process' },
])('rate limits $name', ({ held }) => {
  beforeAll(async () => {
    database = await createDatabase(`sqlite:${join(scratch, `${held}.sqlite`)}`);
    nowMs = T0;
    await migrate(database);
    const llama = (parse(shipped) as { models: Record<string, Record<string, unknown>> }).models[MODEL];
    const limits = { requestsPerMinute: 2, requestsPerDay: 3, tokensPerMinute: 100 };
    const override = stringify({
      models: { [MODEL]: { ...llama, rateLimits: { paid: limits, partner: limits } } },
    });
    const catalog = createCatalogService(
      buildCatalog([
        { path: DEFAULT_CATALOG_PATH, text: shipped },
        { path: 'override.yaml', text: override },
      ]),
    );
    rateLimits = createRateLimits(database, { held });
    limiter = createRateLimiter({ rateLimits, catalog, now: () => nowMs });
    const account = await createAccounts(database).createApiAccount();
    const { key } = await createApiKeys(database).create({ accountId: account.id, keyType: 'INFERENCE' });
    principal = { kind: 'apiKey', accountId: account.id, keyId: key.id, keyType: 'INFERENCE' };
  });

  afterAll(async () => {
    await rateLimits?.close();
    await database?.close();
  });

  const used = async (type: 'TPM' | 'RPD' | 'RPM', keyId = principal.keyId) =>
    (
      await rateLimits.peek({
        bucket: `key:${keyId}:model:${MODEL}:${type}`,
        windowMs: type === 'RPD' ? 86_400_000 : 60_000,
        limit: 1,
        now: nowMs,
      })
    ).used;

  async function refusal(): Promise<ApiError> {
    const error = await Promise.resolve(limiter.admit(principal, 'paid', MODEL)).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ApiError);
    return error as ApiError;
  }

  describe('createRateLimiter().admit', () => {
    test('behavior: an admitted request gets the request and token headers and is counted per day and minute', async () => {
      const { headers } = await limiter.admit(principal, 'paid', MODEL);
      expect(headers).toEqual({
        'x-ratelimit-limit-requests': 2,
        'x-ratelimit-remaining-requests': 1,
        'x-ratelimit-reset-requests': Math.ceil((T0 + 60_000) / 1000),
        'x-ratelimit-type': 'api_key',
        'x-ratelimit-limit-tokens': 100,
        'x-ratelimit-remaining-tokens': 100,
        'x-ratelimit-reset-tokens': 60,
      });
      expect([await used('RPD'), await used('RPM')]).toEqual([1, 1]);
    });

    test('behavior: the minute refuses with 429 RPM, logged, and the day does not count the refused request', async () => {
      await limiter.admit(principal, 'paid', MODEL);
      const error = await refusal();
      expect(error).toMatchObject({ status: 429, code: 'RATE_LIMIT_EXCEEDED' });
      expect(error.message).toContain('RPM');
      expect(error.headers).toMatchObject({ 'Retry-After': '60', 'x-ratelimit-type': 'api_key' });
      expect([await used('RPD'), await used('RPM')]).toEqual([2, 2]);
      expect((await rateLimits.listEvents(principal.accountId))[0]).toMatchObject({
        limitType: 'RPM',
        modelId: MODEL,
        apiKeyId: principal.keyId,
        tier: 'paid',
      });
    });

    test('behavior: a full day refuses with 429 RPD and the minute does not count the refused request', async () => {
      nowMs = T0 + 60_000;
      await limiter.admit(principal, 'paid', MODEL);
      expect(await used('RPD')).toBe(3);
      nowMs = T0 + 120_000;
      expect((await refusal()).message).toContain('RPD');
      expect(await used('RPM')).toBe(0);
      expect((await rateLimits.listEvents(principal.accountId))[0]?.limitType).toBe('RPD');
    });

    test('behavior: tokens used up refuse with 429 TPM before anything else, and nothing is counted', async () => {
      nowMs = T0 + 180_000;
      await limiter.consumeTokens(principal, 'paid', MODEL, 100);
      expect((await refusal()).message).toContain('TPM');
      expect([await used('RPD'), await used('RPM'), await used('TPM')]).toEqual([3, 0, 100]);
      expect((await rateLimits.listEvents(principal.accountId))[0]?.limitType).toBe('TPM');
    });

    test("behavior: tokenCount counts the tokens in the caller's transaction (held: whatever becomes of it), or nothing when there is nothing to count", async () => {
      nowMs = T0 + 240_000;
      const count = limiter.tokenCount(principal, 'paid', MODEL, 30);
      expect(count).toBeTypeOf('function');
      await expect(
        database.transaction(async (trx) => {
          await count?.(trx);
          throw new Error('rolled back');
        }),
      ).rejects.toThrow('rolled back');
      // In the rows, the tokens go with the transaction; held, they were used: the work was done.
      const rolledBack = held ? 30 : 0;
      expect(await used('TPM')).toBe(rolledBack);
      await database.transaction(async (trx) => count?.(trx));
      expect(await used('TPM')).toBe(rolledBack + 30);
      // Counted in the window the request finished in, even when the statement runs in a later one.
      const late = limiter.tokenCount(principal, 'paid', MODEL, 5);
      nowMs = T0 + 300_000;
      await late?.();
      expect(await used('TPM')).toBe(0);
      nowMs = T0 + 240_000;
      expect(await used('TPM')).toBe(rolledBack + 35);
      // Nothing to count: no tokens, a figure that is not a whole number, a model without a token limit.
      expect(limiter.tokenCount(principal, 'paid', MODEL, 0)).toBeUndefined();
      expect(limiter.tokenCount(principal, 'paid', MODEL, 2.5)).toBeUndefined();
      expect(limiter.tokenCount(principal, 'paid', MODEL, Number.NaN)).toBeUndefined();
      expect(limiter.tokenCount(principal, 'paid', 'no-such-model', 30)).toBeUndefined();
    });

    test('behavior: a request without a catalogue model is counted in the management window', async () => {
      const { headers } = await limiter.admit(principal, 'paid', undefined);
      expect(headers).toMatchObject({
        'x-ratelimit-limit-requests': 600,
        'x-ratelimit-remaining-requests': 599,
      });
    });

    test("behavior: an API key's admission may wait for the next commit group while others write; a wallet's is counted at once", async () => {
      const asked: (boolean | undefined)[] = [];
      const spying = createRateLimiter({
        rateLimits: {
          ...rateLimits,
          // Decided at once (held counts) or by the statement: asked once either way.
          admitNow(input) {
            const decided = rateLimits.admitNow(input);
            if (decided) asked.push(input.joinShared);
            return decided;
          },
          admit(input) {
            asked.push(input.joinShared);
            return rateLimits.admit(input);
          },
        },
        catalog: createCatalogService(buildCatalog([{ path: DEFAULT_CATALOG_PATH, text: shipped }])),
        now: () => nowMs,
      });
      nowMs += 86_400_000;
      await spying.admit(principal, 'paid', MODEL);
      const wallet = await createAccounts(database).findOrCreateWalletAccount(
        '0x1111111111111111111111111111111111111111',
      );
      await spying.admit(
        {
          kind: 'wallet',
          accountId: wallet.account.id,
          walletAddress: '0x1111111111111111111111111111111111111111',
        },
        'paid',
        MODEL,
      );
      expect(asked).toEqual([true, false]);
    });

    test('behavior: held, an admission whose windows are in memory is decided at once (headers, not a promise), a refusal still rejects; in the rows, always a promise', async () => {
      nowMs = T0 + 10 * 86_400_000;
      const isPromise = (value: unknown) => typeof (value as { then?: unknown })?.then === 'function';
      // A key of its own: the rows of `principal`'s key are checked below.
      const { key } = await createApiKeys(database).create({
        accountId: principal.accountId,
        keyType: 'INFERENCE',
      });
      const caller: ApiKeyPrincipal = { ...principal, keyId: key.id };
      // The window's first admission reads its counts (held) or writes its rows: a promise either way.
      const first = limiter.admit(caller, 'paid', MODEL);
      expect(isPromise(first)).toBe(true);
      const admitted = await first;
      const second = limiter.admit(caller, 'paid', MODEL);
      expect(isPromise(second)).toBe(!held);
      expect((await second).headers).toEqual({
        ...admitted.headers,
        'x-ratelimit-remaining-requests': 0,
      });
      // The minute is full: refused, as a rejected promise (the refusal is logged first), counted nowhere.
      const third = limiter.admit(caller, 'paid', MODEL);
      expect(isPromise(third)).toBe(true);
      await expect(third).rejects.toMatchObject({ status: 429, code: 'RATE_LIMIT_EXCEEDED' });
      expect([await used('RPD', key.id), await used('RPM', key.id)]).toEqual([2, 2]);
      // The management window likewise.
      await limiter.admit(caller, 'paid', undefined);
      const managed = limiter.admit(caller, 'paid', undefined);
      expect(isPromise(managed)).toBe(!held);
      expect((await managed).headers['x-ratelimit-remaining-requests']).toBe(598);
    });

    test("behavior: the buckets of each caller and model, remembered after the first admission, are the same at every admission and token count, a key's apart from a wallet's with the same id", async () => {
      const asked: string[][] = [];
      const spying = createRateLimiter({
        rateLimits: {
          ...rateLimits,
          admitNow(input) {
            const decided = rateLimits.admitNow(input);
            if (decided) asked.push(input.windows.map((w) => w.bucket));
            return decided;
          },
          admit(input) {
            asked.push(input.windows.map((w) => w.bucket));
            return rateLimits.admit(input);
          },
          hitAlong(input) {
            asked.push([input.bucket]);
            return rateLimits.hitAlong(input);
          },
        },
        catalog: createCatalogService(buildCatalog([{ path: DEFAULT_CATALOG_PATH, text: shipped }])),
        now: () => nowMs,
      });
      nowMs += 2 * 86_400_000;
      // A key of its own: the rows of `principal`'s key are checked below.
      const { key } = await createApiKeys(database).create({
        accountId: principal.accountId,
        keyType: 'INFERENCE',
      });
      const caller: ApiKeyPrincipal = { ...principal, keyId: key.id };
      // A wallet whose account id is the key's id: its buckets are still a wallet's.
      const wallet = {
        kind: 'wallet' as const,
        accountId: caller.keyId,
        walletAddress: '0x2222222222222222222222222222222222222222',
      };
      await spying.admit(caller, 'paid', MODEL);
      await spying.admit(caller, 'paid', MODEL);
      spying.tokenCount(caller, 'paid', MODEL, 10);
      await spying.admit(caller, 'paid', undefined);
      await spying.admit(wallet, 'paid', MODEL);
      await spying.admit(caller, 'paid', undefined);
      const base = `key:${caller.keyId}:model:${MODEL}`;
      expect(asked).toEqual([
        [`${base}:TPM`, `${base}:RPD`, `${base}:RPM`],
        [`${base}:TPM`, `${base}:RPD`, `${base}:RPM`],
        [`${base}:TPM`],
        [`key:${caller.keyId}:manage:RPM`],
        [
          `wallet:${caller.keyId}:model:${MODEL}:TPM`,
          `wallet:${caller.keyId}:model:${MODEL}:RPD`,
          `wallet:${caller.keyId}:model:${MODEL}:RPM`,
        ],
        [`key:${caller.keyId}:manage:RPM`],
      ]);
    });
  });

  test('behavior: the rows hold every count once written (at once in the rows; held, after a flush)', async () => {
    await rateLimits.flush();
    const rows = await database.db
      .selectFrom('rate_limit_counters')
      .select(['bucket', 'window_start_ms', 'used'])
      .where('bucket', 'like', `key:${principal.keyId}:model:%`)
      .where('used', '>', 0)
      .orderBy('window_start_ms')
      .orderBy('bucket')
      .execute();
    const window = (type: string, startMs: number, used: number) => ({
      bucket: `key:${principal.keyId}:model:${MODEL}:${type}`,
      start: startMs,
      used,
    });
    const minute = (n: number) => T0 + n * 60_000;
    expect(
      rows.map((row) => ({ bucket: row.bucket, start: Number(row.window_start_ms), used: Number(row.used) })),
    ).toEqual([
      window('RPD', Math.floor(T0 / 86_400_000) * 86_400_000, 3),
      window('RPM', minute(0), 2),
      window('RPM', minute(1), 1),
      window('TPM', minute(3), 100),
      window('TPM', minute(4), held ? 65 : 35),
      // The next day's (the admission test's spy).
      window('RPD', Math.floor(T0 / 86_400_000) * 86_400_000 + 86_400_000, 1),
      window('RPM', minute(4) + 86_400_000, 1),
    ]);
  });
});
