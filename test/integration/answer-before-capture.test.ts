/**
 * An answer and its capture (Charges.captureDetached): a request is answered without waiting for its capture
 * to commit, served alone or with others in flight (since the forty-fourth round; before, answers waited while
 * others were in flight), and what comes after it for the same account (a balance read, the next request)
 * waits for that capture in this process. A capture that fails after its answer is undone: the reservation released, the JSON-RPC credits
 * given back, nothing charged. The upstream is a loopback JSON-RPC node that answers only when told, so that a
 * test can take the account's lock (PostgreSQL) or expire the reservation between the upstream's answer and
 * the capture.
 */
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parseUsdToNano } from '../../server/money.ts';
import { captureAmounts } from '../../server/storage/ledger.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { holdAccountLock } from '../support/postgres.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

/** A JSON-RPC node whose every request waits until the test answers it. */
type HeldNode = {
  url: string;
  /** The next request to arrive (or the oldest unanswered one); answer it with `answer()`. */
  next(): Promise<{ answer(): void }>;
  close(): Promise<void>;
};

async function startHeldNode(): Promise<HeldNode> {
  const arrived: Array<{ id: unknown; res: ServerResponse }> = [];
  const waiting: Array<() => void> = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const call = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id?: unknown };
      arrived.push({ id: call.id ?? null, res });
      waiting.shift()?.();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    async next() {
      if (arrived.length === 0) await new Promise<void>((resolve) => waiting.push(resolve));
      const { id, res } = arrived.shift() as (typeof arrived)[number];
      return {
        answer: () =>
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', id, result: '0x2a' })),
      };
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** 'settled' when `promise` settles within `ms`, else 'pending'. */
const within = (promise: Promise<unknown>, ms: number) =>
  Promise.race([promise.then(() => 'settled' as const), sleep(ms).then(() => 'pending' as const)]);

const postgres = postgresPerFile();
let node: HeldNode;

beforeAll(async () => {
  node = await startHeldNode();
}, 120_000);

afterAll(async () => {
  await node?.close();
});

const engines = [
  { name: 'SQLite', url: async () => undefined },
  { name: 'PostgreSQL', url: () => postgres().createDatabase('answer_before_capture') },
];

describe.each(engines)('answers and their captures on $name', ({ name, url }) => {
  let server: ChatServer;

  beforeAll(async () => {
    const databaseUrl = await url();
    server = await startChatServer({
      ...(databaseUrl ? { databaseUrl } : {}),
      env: { VIDEO_WORKER_ENABLED: 'false', RPC_UPSTREAM_BASE_MAINNET: node.url },
    });
  }, 60_000);

  afterAll(async () => {
    await server?.close();
  });

  async function account(usd: string) {
    const { accountId, key } = await server.account(usd);
    const admin = await server.services.keys.create({ accountId, keyType: 'ADMIN' });
    return { accountId, key, admin: admin.secret };
  }
  const rpc = (key: string) =>
    server.post(key, '/crypto/rpc/base-mainnet', {
      jsonrpc: '2.0',
      id: 7,
      method: 'eth_blockNumber',
      params: [],
    });
  const chat = (key: string) =>
    server.post(key, '/chat/completions', {
      model: 'llama-3.3-70b',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 8,
    });
  const balance = (admin: string) =>
    fetch(`${server.base}/billing/balance`, { headers: { authorization: `Bearer ${admin}` } }).then(
      async (response) => ({
        status: response.status,
        usd: ((await response.json()) as { balances: { usd: number } }).balances.usd,
      }),
    );
  const charged = async (accountId: string) =>
    (await server.services.ledger.listEntries(accountId)).filter((e) => e.type === 'CHARGE');
  const heldUsd = async (accountId: string) =>
    (await server.services.ledger.getBalance(accountId)).usdReservedNano;
  const creditsTaken = async (accountId: string) => {
    // One SQLite process holds the credits and writes them behind (held-credits.ts): written first.
    await server.services.rpc.credits.flush();
    const { rows } = await sql<{ credits: string | number | bigint | null }>`select sum(credits) as credits
      from rpc_credit_usage where subject = ${accountId}`.execute(server.services.database.db);
    return BigInt(rows[0]?.credits ?? 0);
  };

  test('behavior: a chat answered alone, then its balance read at once: the read waits for the capture and shows the charge', async () => {
    const { key, admin } = await account('1');
    const answer = await chat(key);
    expect(answer.status).toBe(200);
    const cost = ((await answer.json()) as { cost: { usd: number } }).cost.usd;
    expect(cost).toBeGreaterThan(0);
    const read = await balance(admin);
    expect(read.status).toBe(200);
    expect(parseUsdToNano(String(read.usd))).toBe(parseUsdToNano('1') - parseUsdToNano(String(cost)));
  });

  test('behavior: a capture that fails after its answer is undone: the reservation released, the credits given back, nothing charged', async () => {
    const { accountId, key } = await account('1');
    const call = rpc(key);
    const request = await node.next();
    expect(await heldUsd(accountId)).toBeGreaterThan(0n);
    expect(await creditsTaken(accountId)).toBeGreaterThan(0n);
    // The expiry sweep takes the hold back while the node works: the capture can no longer claim it.
    expect(await server.services.ledger.expireReservations(Date.now() + 24 * 3_600_000)).toBeGreaterThan(0);
    request.answer();
    const response = await call;
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ jsonrpc: '2.0', id: 7, result: '0x2a' });
    await server.services.charges.idle();
    expect(await charged(accountId)).toEqual([]);
    expect(await heldUsd(accountId)).toBe(0n);
    expect((await server.services.ledger.getBalance(accountId)).usdNano).toBe(parseUsdToNano('1'));
    expect(await creditsTaken(accountId)).toBe(0n);
  });

  test('captureAmounts: what a capture charges is known before it runs (USD and DIEM parts, clamped at the reservation)', async () => {
    const { accountId } = await account('1');
    await server.services.accounts.setDiemStake(accountId, parseUsdToNano('0.0003'));
    const cases: Array<{ reserve: string; items: string[] }> = [
      { reserve: '0.001', items: ['0.0002', '0.0003'] },
      { reserve: '0.0005', items: ['0.0004', '0.0004'] },
      { reserve: '0.00001', items: ['0.00001'] },
    ];
    for (const { reserve, items } of cases) {
      const { reservation } = await server.services.ledger.reserve({
        accountId,
        apiKeyId: null,
        amountNano: parseUsdToNano(reserve),
        requestId: `amounts-${reserve}`,
        modelId: null,
        ttlMs: 60_000,
      });
      const input = {
        items: items.map((amount, i) => ({ sku: `sku${i}`, amountNano: parseUsdToNano(amount) })),
      };
      const known = captureAmounts(reservation, input);
      const { entries, ...result } = await server.services.ledger.captureWith(reservation, input);
      expect(entries.length).toBeGreaterThan(0);
      expect(known).toEqual(result);
    }
  });

  if (name !== 'PostgreSQL') return;

  test('behavior: a JSON-RPC call served alone is answered while its capture waits for the account; the next read of the account waits for the capture', async () => {
    const { accountId, key, admin } = await account('1');
    const before = await balance(admin);
    const call = rpc(key);
    const request = await node.next();
    // Another transaction holds the account's row: the capture cannot commit until it is released.
    const lock = await holdAccountLock(server.services.database, accountId, async () => {});
    request.answer();
    const response = await call;
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ jsonrpc: '2.0', id: 7, result: '0x2a' });
    const cost = parseUsdToNano(response.headers.get('x-service-rpc-cost-usd') ?? '');
    expect(cost).toBeGreaterThan(0n);
    await lock.waitForWaiter();
    expect(await charged(accountId)).toEqual([]);
    expect(await heldUsd(accountId)).toBeGreaterThan(0n);
    // The balance read comes after the answer, so it must show the charge: it waits for the capture.
    const read = balance(admin);
    expect(await within(read, 300)).toBe('pending');
    await lock.release();
    const after = await read;
    expect(parseUsdToNano(String(after.usd))).toBe(parseUsdToNano(String(before.usd)) - cost);
    expect(await charged(accountId)).toHaveLength(1);
  });

  test('behavior: with another request in flight, the answer does not wait for its capture either', async () => {
    const { key: otherKey } = await account('1');
    const { accountId, key } = await account('1');
    const other = rpc(otherKey);
    const otherRequest = await node.next();
    const call = rpc(key);
    const request = await node.next();
    const lock = await holdAccountLock(server.services.database, accountId, async () => {});
    request.answer();
    const response = await call;
    expect(response.status).toBe(200);
    // Answered while the capture waits for the account's row.
    await lock.waitForWaiter();
    expect(await charged(accountId)).toEqual([]);
    await lock.release();
    await server.services.charges.idle();
    expect(await charged(accountId)).toHaveLength(1);
    otherRequest.answer();
    expect((await other).status).toBe(200);
  });
});
