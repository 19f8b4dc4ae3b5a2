/**
 * What the benchmark and the profiler prepare before a server starts: the catalogue override (the chat model
 * with its rate limits and concurrency cap out of the way, and a model served by the local upstream) and a
 * funded account with an INFERENCE key, written through the storage API.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { parseUsdToNano } from '../server/money.ts';
import {
  createAccounts,
  createApiKeys,
  createDatabase,
  createLedger,
  migrate,
} from '../server/storage/index.ts';
import { repoRoot } from '../test/support/contract.ts';
import type { Target } from './measure.ts';

/** The catalogue override: the chat model with limits out of the way, and one model behind the upstream. */
export function catalogOverride(upstreamOrigin: string): string {
  const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
    models: Record<string, Record<string, unknown>>;
  };
  const llama = defaults.models['llama-3.3-70b'] ?? {};
  const unlimited = {
    paid: {
      requestsPerMinute: 1_000_000_000,
      requestsPerDay: 1_000_000_000,
      tokensPerMinute: 1_000_000_000_000,
    },
    partner: {
      requestsPerMinute: 1_000_000_000,
      requestsPerDay: 1_000_000_000,
      tokensPerMinute: 1_000_000_000_000,
    },
  };
  return stringify({
    models: {
      'llama-3.3-70b': { ...llama, rateLimits: unlimited, maxConcurrency: 100_000 },
      'bench-upstream': {
        ...llama,
        rateLimits: unlimited,
        maxConcurrency: 100_000,
        provider: {
          kind: 'openai-compatible',
          name: 'bench',
          baseUrl: `${upstreamOrigin}/v1`,
          upstreamModel: 'bench-upstream',
        },
      },
    },
  });
}

/**
 * A funded account with an INFERENCE key, written through the storage API before the server starts; with
 * `limitUsdNano`, the key has that spend limit per UTC day (EPOCH).
 */
export async function fundedKey(databaseUrl: string, limitUsdNano?: bigint): Promise<string> {
  return (await fundedKeys(databaseUrl, 1, limitUsdNano))[0] as string;
}

/** `count` funded accounts, each with an INFERENCE key of its own (as fundedKey makes one). */
export async function fundedKeys(
  databaseUrl: string,
  count: number,
  limitUsdNano?: bigint,
): Promise<string[]> {
  const database = await createDatabase(databaseUrl);
  try {
    await migrate(database);
    const limits = limitUsdNano === undefined ? {} : { limitUsdNano, limitPeriod: 'EPOCH' as const };
    const keys: string[] = [];
    for (let i = 0; i < count; i++) {
      const account = await createAccounts(database).createApiAccount({});
      await createLedger(database).topUp({ accountId: account.id, amountNano: parseUsdToNano('100000000') });
      keys.push(
        (await createApiKeys(database).create({ accountId: account.id, keyType: 'INFERENCE', ...limits }))
          .secret,
      );
    }
    return keys;
  } finally {
    await database.close();
  }
}

/**
 * The server's environment in the harness and its tools: production settings on `databaseUrl` with the
 * catalogue at `catalogPath`, the local engine without token delay, the JSON-RPC caps out of the way; `extra`
 * adds to or overrides it.
 */
export function serverEnv(databaseUrl: string, catalogPath: string, extra: Record<string, string> = {}) {
  return {
    NODE_ENV: 'production',
    LOG_LEVEL: 'warn',
    DATABASE_URL: databaseUrl,
    ADMIN_API_KEY: `svc_admin_${randomBytes(24).toString('hex')}`,
    SERVICE_CONFIG: catalogPath,
    LOCAL_CHAT_TOKEN_DELAY_MS: '0',
    VIDEO_WORKER_ENABLED: 'false',
    RPC_REQUESTS_PER_MINUTE: '1000000000',
    RPC_STAFF_REQUESTS_PER_MINUTE: '1000000000',
    RPC_CREDITS_PER_DAY: '1000000000000',
    ...extra,
  };
}

/** A chat completion request's body: one user message, `maxTokens` at most, streamed or not. */
export const chatBody = (
  model: string,
  stream: boolean,
  maxTokens: number,
  prompt = 'Say hello to the benchmark.',
) =>
  JSON.stringify({
    model,
    messages: [{ role: 'user', content: prompt }],
    max_tokens: maxTokens,
    ...(stream ? { stream: true } : {}),
  });

/** The JSON-RPC call every RPC target is measured with. */
export const RPC_BODY = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] });

/** JSON request headers, with the key as a bearer token when given. */
export const json = (key?: string) => ({
  'content-type': 'application/json',
  ...(key ? { authorization: `Bearer ${key}` } : {}),
});

/** The positive whole number in the environment variable `name`, or `fallback` when unset or not one. */
export function envInt(name: string, fallback: number): number {
  const value = Number.parseInt(process.env[name] ?? '', 10);
  return Number.isSafeInteger(value) && value > 0 ? value : fallback;
}

/**
 * The environment variables given as a JSON object in the environment variable `name` (`AB_B_ENV`,
 * `BENCH_ENV`), their values as strings; none when it is unset. Throws when it is not a JSON object.
 */
export function envObject(name: string): Record<string, string> {
  const text = process.env[name];
  if (!text) return {};
  const parsed: unknown = JSON.parse(text);
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed))
    throw new Error(`${name} must be a JSON object of variables`);
  return Object.fromEntries(Object.entries(parsed).map(([k, v]) => [k, String(v)]));
}

/** A non-streamed chat on the local engine, on the server at `origin` with `key`. */
export const localChatTarget = (origin: string, key: string): Target => ({
  url: `${origin}/api/v1/chat/completions`,
  method: 'POST',
  headers: json(key),
  body: chatBody('llama-3.3-70b', false, 16),
});

/**
 * The same chat with a key per connection (`Target.perConnection`): each connection charges an account of its
 * own, where with one key every request waits for the one account's lock.
 */
export const keyPerConnectionChatTarget = (origin: string, keys: readonly string[]): Target => ({
  ...localChatTarget(origin, ''),
  headers: json(),
  perConnection: { header: 'authorization', values: keys.map((key) => `Bearer ${key}`) },
});

/** A streamed chat through the chat upstream adapter (the catalogue override's model), on the server at `origin`. */
export const adapterTarget = (origin: string, key: string): Target => ({
  url: `${origin}/api/v1/chat/completions`,
  method: 'POST',
  headers: json(key),
  body: chatBody('bench-upstream', true, 16),
});

/** The same streamed chat sent to the upstream at `origin` itself (bench/upstream.ts). */
export const upstreamTarget = (origin: string): Target => ({
  url: `${origin}/v1/chat/completions`,
  method: 'POST',
  headers: json(),
  body: chatBody('bench-upstream', true, 16),
});

/** The JSON-RPC call through the proxy of the server at `origin`. */
export const rpcTarget = (origin: string, key: string): Target => ({
  url: `${origin}/api/v1/crypto/rpc/base-mainnet`,
  method: 'POST',
  headers: json(key),
  body: RPC_BODY,
});

/** The same JSON-RPC call sent to the node at `url` itself. */
export const nodeTarget = (url: string): Target => ({ url, method: 'POST', headers: json(), body: RPC_BODY });
