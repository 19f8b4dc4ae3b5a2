/**
 * What the benchmark and the profiler prepare before a server starts: the catalogue override (the chat model
 * with its rate limits and concurrency cap out of the way, and a model served by the local upstream) and a
 * funded account with an INFERENCE key, written through the storage API.
 */
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
  const database = await createDatabase(databaseUrl);
  try {
    await migrate(database);
    const account = await createAccounts(database).createApiAccount({});
    await createLedger(database).topUp({ accountId: account.id, amountNano: parseUsdToNano('100000000') });
    const limits = limitUsdNano === undefined ? {} : { limitUsdNano, limitPeriod: 'EPOCH' as const };
    return (await createApiKeys(database).create({ accountId: account.id, keyType: 'INFERENCE', ...limits }))
      .secret;
  } finally {
    await database.close();
  }
}
