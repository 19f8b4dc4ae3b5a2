/**
 * `x-service-balance-usd` and `x-service-balance-diem`: the balance before the request, on every inference
 * answer. A request that reserves reports what its reservation found under the account's lock (no statement of
 * its own reads it); one that reserves nothing reads it when its handler is done. On SQLite and PostgreSQL.
 */

import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { formatUsdFixed, parseUsdToNano } from '../../server/money.ts';
import { type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

let anvil: StartedAnvil;
const postgres = postgresPerFile();

beforeAll(async () => {
  anvil = await startAnvil();
}, 120_000);

afterAll(async () => {
  await anvil?.stop();
});

const engines = [
  { name: 'SQLite', url: async () => undefined },
  { name: 'PostgreSQL', url: () => postgres().createDatabase('balance_headers') },
];

describe.each(engines)('balance headers on $name', ({ url }) => {
  let server: ChatServer;

  beforeAll(async () => {
    const databaseUrl = await url();
    server = await startChatServer({
      ...(databaseUrl ? { databaseUrl } : {}),
      env: { VIDEO_WORKER_ENABLED: 'false', RPC_UPSTREAM_BASE_MAINNET: anvil.url },
    });
  }, 60_000);

  afterAll(async () => {
    await server?.close();
  });

  async function fundedKey(usd: string, diemStake = 0n) {
    const { accountId, key } = await server.account(usd);
    if (diemStake > 0n) await server.services.accounts.setDiemStake(accountId, diemStake);
    return { accountId, secret: key };
  }

  const chat = (secret: string) =>
    server.post(secret, '/chat/completions', {
      model: 'llama-3.3-70b',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 8,
    });
  const rpc = (secret: string, method = 'eth_blockNumber') =>
    server.post(secret, '/crypto/rpc/base-mainnet', { jsonrpc: '2.0', id: 1, method, params: [] });

  /**
   * The headers a request reports when the account's balance is `balance` before it: read under the API, once
   * the captures that answers already written did not wait for are done (the API's own requests wait for them).
   */
  async function expected(accountId: string) {
    await server.services.charges.idle();
    const balance = await server.services.ledger.getBalance(accountId);
    return {
      usd: formatUsdFixed(balance.usdNano, 8),
      diem: formatUsdFixed(balance.diemAllowanceNano - balance.diemUsedTodayNano, 8),
    };
  }
  const reported = (response: Response) => ({
    usd: response.headers.get('x-service-balance-usd'),
    diem: response.headers.get('x-service-balance-diem'),
  });

  test('each request reports the balance before it: a chat, then a JSON-RPC call', async () => {
    const { accountId, secret } = await fundedKey('5');
    const start = await expected(accountId);
    const first = await chat(secret);
    expect(first.status).toBe(200);
    expect(reported(first)).toEqual(start);
    expect(start.usd).toBe('5.00000000');

    const between = await expected(accountId);
    expect(between.usd).not.toBe(start.usd); // the chat was charged
    const second = await rpc(secret);
    expect(second.status).toBe(200);
    expect(reported(second)).toEqual(between);
    expect((await expected(accountId)).usd).not.toBe(between.usd);
  });

  test('with a DIEM stake: what is left of the day’s allowance, then the USD untouched', async () => {
    const { accountId, secret } = await fundedKey('5', parseUsdToNano('3'));
    const first = await chat(secret);
    expect(first.status).toBe(200);
    expect(reported(first)).toEqual({ usd: '5.00000000', diem: '3.00000000' });
    const after = await expected(accountId);
    expect(after.usd).toBe('5.00000000'); // drawn from DIEM first
    expect(after.diem).not.toBe('3.00000000');
    const second = await chat(secret);
    expect(reported(second)).toEqual(after);
  });

  test('a request that reserves nothing reports the balance too: refused before its reservation, or by it', async () => {
    const { accountId, secret } = await fundedKey('0');
    const now = await expected(accountId);
    const refused = await rpc(secret, 'eth_sendTransaction');
    expect(refused.status).toBe(400);
    expect(reported(refused)).toEqual(now);
    const broke = await chat(secret);
    expect(broke.status).toBe(402);
    expect(reported(broke)).toEqual(now);
    expect(await expected(accountId)).toEqual(now);
  });

  test('concurrent requests with one key: each reports a balance the account had, none another’s', async () => {
    const { accountId, secret } = await fundedKey('5');
    const start = await server.services.ledger.getBalance(accountId);
    const answers = await Promise.all(Array.from({ length: 8 }, () => chat(secret)));
    expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200));
    // Each reports the balance before it: the start less some of the others' charges, never its own.
    // A request's charge is one entry per item (the prompt's and the completion's tokens).
    const charges = new Map<string, bigint>();
    await server.services.charges.idle();
    for (const entry of await server.services.ledger.listEntries(accountId)) {
      if (entry.type !== 'CHARGE' || !entry.requestId) continue;
      charges.set(entry.requestId, (charges.get(entry.requestId) ?? 0n) - entry.amountNano);
    }
    expect(charges.size).toBe(8);
    for (const answer of answers) {
      const ray = answer.headers.get('cf-ray') ?? '';
      expect(charges.has(ray)).toBe(true);
      const others = [...charges].filter(([requestId]) => requestId !== ray).map(([, charge]) => charge);
      const balances = new Set<bigint>([start.usdNano]);
      for (const charge of others) for (const b of [...balances]) balances.add(b - charge);
      const usd = parseUsdToNano(answer.headers.get('x-service-balance-usd') ?? '');
      expect(balances.has(usd), `${usd} is not a balance the account had before ${ray}`).toBe(true);
    }
  });

  test('authentication answers every request its own principal object, however the key lookup is cached', async () => {
    const { secret } = await fundedKey('1');
    const { auth } = server.services.app;
    const [a, b] = [await auth.authenticateApiKey(secret), await auth.authenticateApiKey(secret)];
    expect(a).toBeDefined();
    expect(a).toEqual(b);
    expect(a).not.toBe(b);
  });
});
