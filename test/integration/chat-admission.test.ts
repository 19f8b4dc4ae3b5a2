/**
 * A chat's admission: its count against its model's rate limits, one statement before the handler (on
 * PostgreSQL a prepared statement). What the client sees: the `x-ratelimit-*` headers of the window after the
 * request, a 429 before the balance is looked at (nothing held, nothing counted past the limit), exactly the
 * limit admitted under concurrency, and a request that reserves nothing (a 402, an idempotent replay) counted
 * once. On SQLite and PostgreSQL.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { awayFromMinuteEdge } from '../support/clock.ts';
import { repoRoot } from '../support/contract.ts';
import { checkSettledInvariants } from '../support/invariants.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

const PER_MINUTE = 4;
const MODEL = 'llama-3.3-70b';

const postgres = postgresPerFile();

/** The default catalogue's model with a small per-minute limit for paid accounts. */
function catalogYaml(): string {
  const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
    models: Record<string, Record<string, unknown>>;
  };
  return stringify({
    models: {
      [MODEL]: {
        ...defaults.models[MODEL],
        rateLimits: {
          paid: { requestsPerMinute: PER_MINUTE, requestsPerDay: 1000, tokensPerMinute: 1_000_000 },
          partner: { requestsPerMinute: 100, requestsPerDay: 1000, tokensPerMinute: 1_000_000 },
        },
      },
    },
  });
}

const engines = [
  { name: 'SQLite', url: async () => undefined },
  { name: 'PostgreSQL', url: () => postgres().createDatabase('chat_admission') },
];

describe.each(engines)('chat admission on $name', ({ url }) => {
  let server: ChatServer;

  beforeAll(async () => {
    const databaseUrl = await url();
    server = await startChatServer({
      ...(databaseUrl ? { databaseUrl } : {}),
      env: { VIDEO_WORKER_ENABLED: 'false' },
      catalogYaml: catalogYaml(),
    });
  }, 60_000);

  afterAll(async () => {
    await server?.close();
  });

  const body = (stream = false) => ({
    model: MODEL,
    messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 8,
    ...(stream ? { stream: true } : {}),
  });

  /** A new paid account and its key, with the key's id (its windows are named after it). */
  async function caller(usd: string) {
    const { accountId, key } = await server.account(usd);
    const [listed] = await server.services.keys.list(accountId);
    return { accountId, key, keyId: listed?.id ?? '' };
  }

  /**
   * The key's counts in the model's windows, in their rows: after the captures the answers did not wait for,
   * and the counts one SQLite process holds written behind (held-counts.ts).
   */
  async function windows(keyId: string) {
    await server.services.charges.idle();
    await server.services.rateLimits.flush();
    const rows = await server.services.database.db
      .selectFrom('rate_limit_counters')
      .select(['bucket', 'used'])
      .where('bucket', 'like', `key:${keyId}:model:${MODEL}:%`)
      .execute();
    return Object.fromEntries(rows.map((row) => [row.bucket.split(':').at(-1), Number(row.used)]));
  }

  async function reservations(accountId: string) {
    return server.services.database.db
      .selectFrom('reservations')
      .select(['status'])
      .where('account_id', '=', accountId)
      .execute();
  }

  test('behavior: each answer, JSON or stream, reports the window after it; each is counted once', async () => {
    await awayFromMinuteEdge();
    const { key, keyId } = await caller('5');
    const first = await server.post(key, '/chat/completions', body());
    expect(first.status).toBe(200);
    expect(first.headers.get('x-ratelimit-limit-requests')).toBe(String(PER_MINUTE));
    expect(first.headers.get('x-ratelimit-remaining-requests')).toBe(String(PER_MINUTE - 1));
    expect(first.headers.get('x-ratelimit-remaining-tokens')).toBe('1000000');
    expect(first.headers.get('x-ratelimit-type')).toBe('api_key');
    await first.json();
    const second = await server.post(key, '/chat/completions', body(true));
    expect(second.status).toBe(200);
    expect(second.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(second.headers.get('x-ratelimit-remaining-requests')).toBe(String(PER_MINUTE - 2));
    // The first chat's tokens were counted by its capture, before the second was admitted.
    expect(Number(second.headers.get('x-ratelimit-remaining-tokens'))).toBeLessThan(1_000_000);
    expect(await second.text()).toContain('data: [DONE]');
    const counted = await windows(keyId);
    expect(counted.RPM).toBe(2);
    expect(counted.RPD).toBe(2);
  });

  test('behavior: over the limit is a 429 before anything is held; nothing counted past the limit', async () => {
    await awayFromMinuteEdge();
    const { accountId, key, keyId } = await caller('5');
    for (let i = 0; i < PER_MINUTE; i++) {
      const answer = await server.post(key, '/chat/completions', body());
      expect(answer.status).toBe(200);
      await answer.json();
    }
    await server.services.charges.idle();
    const balance = await server.services.ledger.getBalance(accountId);
    const refused = await server.post(key, '/chat/completions', body());
    expect(refused.status).toBe(429);
    expect(await refused.json()).toMatchObject({ code: 'RATE_LIMIT_EXCEEDED' });
    expect(refused.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(await windows(keyId)).toMatchObject({ RPM: PER_MINUTE, RPD: PER_MINUTE });
    // Refused before its reservation: no row, nothing held, nothing charged.
    expect(await reservations(accountId)).toHaveLength(PER_MINUTE);
    expect(await server.services.ledger.getBalance(accountId)).toEqual(balance);
    const events = await server.services.rateLimits.listEvents(accountId);
    expect(events).toEqual([expect.objectContaining({ limitType: 'RPM', modelId: MODEL })]);
  });

  test('behavior: a 402 is counted once; over the limit the 429 comes before the 402', async () => {
    await awayFromMinuteEdge();
    const { accountId, key, keyId } = await caller('0');
    for (let i = 0; i < PER_MINUTE; i++) {
      const answer = await server.post(key, '/chat/completions', body());
      expect(answer.status).toBe(402);
      expect(answer.headers.get('x-ratelimit-remaining-requests')).toBe(String(PER_MINUTE - 1 - i));
      expect((await windows(keyId)).RPM).toBe(i + 1);
    }
    const refused = await server.post(key, '/chat/completions', body());
    expect(refused.status).toBe(429);
    expect(await windows(keyId)).toMatchObject({ RPM: PER_MINUTE });
    expect(await reservations(accountId)).toEqual([]);
  });

  test('behavior: an idempotent replay reserves nothing and is counted as a request', async () => {
    await awayFromMinuteEdge();
    const { key, keyId } = await caller('5');
    const send = () =>
      fetch(`${server.base}/chat/completions`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${key}`,
          'content-type': 'application/json',
          'idempotency-key': 'admission-replay',
        },
        body: JSON.stringify(body()),
      });
    const first = await send();
    expect(first.status).toBe(200);
    const answer = await first.json();
    const replay = await send();
    expect(replay.status).toBe(200);
    expect(await replay.json()).toEqual(answer);
    expect(replay.headers.get('x-ratelimit-remaining-requests')).toBe(String(PER_MINUTE - 2));
    expect((await windows(keyId)).RPM).toBe(2);
  });

  test('behavior: 10 parallel chats against a limit of 4: exactly 4 answered, 6 refused, nothing held', async () => {
    await awayFromMinuteEdge();
    const { accountId, key, keyId } = await caller('5');
    const answers = await Promise.all(
      Array.from({ length: 10 }, async () => {
        const answer = await server.post(key, '/chat/completions', body());
        return { status: answer.status, json: (await answer.json()) as { code?: string } };
      }),
    );
    expect(answers.filter((a) => a.status === 200)).toHaveLength(PER_MINUTE);
    const refused = answers.filter((a) => a.status === 429);
    expect(refused).toHaveLength(10 - PER_MINUTE);
    for (const r of refused) expect(r.json).toMatchObject({ code: 'RATE_LIMIT_EXCEEDED' });
    expect(await windows(keyId)).toMatchObject({ RPM: PER_MINUTE, RPD: PER_MINUTE });
    expect((await reservations(accountId)).map((r) => r.status)).toEqual(Array(PER_MINUTE).fill('captured'));
    const report = await checkSettledInvariants(server.services.database);
    expect(report.violations).toEqual([]);
  });
});
