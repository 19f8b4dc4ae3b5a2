/**
 * The JSON-RPC proxy end to end on SQLite: a real EVM node (anvil) behind the proxy, called with viem and
 * plain fetch; a loopback Solana stand-in; broken upstreams (500, refused, garbage, silent). Response
 * validation is on, so every JSON error body here was also checked against the contract.
 */

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  createPublicClient,
  HttpRequestError,
  http,
  InvalidParamsRpcError,
  parseEther,
  type Transport,
} from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { base } from 'viem/chains';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { awayFromMinuteEdge } from '../support/clock.ts';
import { freePort } from '../support/process.ts';
import { type RpcStandIn, startRpcStandIn } from '../support/rpc-upstream.ts';
import { type StartedServer, startServer } from '../support/server.ts';

const ADMIN = 'svc_admin_bootstrap_secret_for_rpc_tests_0123456789';
/** 7e-7 USD per credit. */
const PRICE_NANO = 700n;
const scratch = mkdtempSync(join(tmpdir(), 'rpc-test-'));

type Server = StartedServer & { accountId: string };

/** The real server on a SQLite file, with the RPC configuration of the test. */
async function startRpcServer(name: string, env: Record<string, string>): Promise<Server> {
  const started = await startServer(`sqlite:${join(scratch, `${name}.db`)}`, {
    ADMIN_API_KEY: ADMIN,
    ...env,
  });
  if (started.boot.action === 'none') throw new Error('bootstrap did nothing');
  return { ...started, accountId: started.boot.accountId };
}

let anvil: StartedAnvil;
let solana: RpcStandIn;
let garbage: RpcStandIn;
let silent: RpcStandIn;
let failing: RpcStandIn;
let server: Server;

beforeAll(async () => {
  [anvil, solana, garbage, silent, failing] = await Promise.all([
    startAnvil(),
    startRpcStandIn('solana'),
    startRpcStandIn('garbage'),
    startRpcStandIn('hang'),
    startRpcStandIn('error500'),
  ]);
  const refused = `http://127.0.0.1:${await freePort()}`;
  const serviceConfig = join(scratch, 'service.yaml');
  // Networks configured through the SERVICE_CONFIG file: a priced Robinhood Chain and a short timeout.
  writeFileSync(
    serviceConfig,
    [
      'rpc:',
      '  networks:',
      '    robinhood-mainnet:',
      '      baseCredits: 25',
      `      upstreams: ['${anvil.url}']`,
      '    polygon-amoy:',
      '      timeoutMs: 300',
      `      upstreams: ['${silent.url}']`,
      '',
    ].join('\n'),
  );
  server = await startRpcServer('main', {
    SERVICE_CONFIG: serviceConfig,
    RPC_UPSTREAM_BASE_MAINNET: anvil.url,
    // Failover: a node answering 500, then a refused port, then the real node.
    RPC_UPSTREAM_ETHEREUM_SEPOLIA: `${failing.url}, ${refused}, ${anvil.url}`,
    RPC_UPSTREAM_SOLANA_MAINNET: solana.url,
    RPC_UPSTREAM_SOLANA_DEVNET: garbage.url,
  });
});

afterAll(async () => {
  await server?.close();
  await Promise.all([anvil?.stop(), solana?.close(), garbage?.close(), silent?.close(), failing?.close()]);
  rmSync(scratch, { recursive: true, force: true });
});

const rpcUrl = (network: string) => `${server.base}/crypto/rpc/${network}`;

async function post(network: string, body: unknown, headers: Record<string, string> = {}) {
  const response = await fetch(rpcUrl(network), {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, json: JSON.parse(text) as unknown };
}

/** The account's balance once the captures the answers did not wait for are in. */
const balance = async () => {
  await server.services.charges.idle();
  return (await server.services.ledger.getBalance(server.accountId)).usdNano;
};

/** viem over the proxy; `seen` collects the proxy's response headers. */
function viemClient(network: string, options: { batch?: boolean } = {}) {
  const seen: Headers[] = [];
  const transport: Transport = http(rpcUrl(network), {
    batch: options.batch ?? false,
    retryCount: 0,
    fetchOptions: { headers: { Authorization: `Bearer ${ADMIN}` } },
    onFetchResponse: (response) => {
      seen.push(response.headers);
    },
  });
  return { client: createPublicClient({ chain: base, transport }), seen };
}

const call = (method: string, params: unknown[] = [], id: number | string = 1) => ({
  jsonrpc: '2.0',
  id,
  method,
  params,
});

describe('GET /crypto/rpc/networks', () => {
  test('behavior: lists exactly the networks with an upstream, sorted, with the prices in force', async () => {
    const response = await fetch(`${server.base}/crypto/rpc/networks`);
    expect(response.status).toBe(200);
    const body = (await response.json()) as {
      networks: string[];
      details: Array<{ network: string; baseCredits: number; family: string; chainId: string | null }>;
    };
    expect(body.networks).toEqual([
      'base-mainnet',
      'ethereum-sepolia',
      'polygon-amoy',
      'robinhood-mainnet',
      'solana-devnet',
      'solana-mainnet',
    ]);
    expect(body.details.find((d) => d.network === 'robinhood-mainnet')?.baseCredits).toBe(25);
    expect(body.details.find((d) => d.network === 'solana-mainnet')).toMatchObject({
      family: 'solana',
      baseCredits: 30,
      chainId: '5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp',
    });
    expect(body.details.find((d) => d.network === 'base-mainnet')).toMatchObject({
      family: 'evm',
      chainId: '8453',
      baseCredits: 20,
    });
  });
});

describe('POST /crypto/rpc/{network} with viem against anvil', () => {
  test('behavior: block number, balance and eth_call come back as the node answers them', async () => {
    const { client, seen } = viemClient('base-mainnet');
    const direct = BigInt(await anvil.rpc<string>('eth_blockNumber'));
    expect(await client.getBlockNumber({ cacheTime: 0 })).toBe(direct);
    const funded = privateKeyToAccount(ANVIL_PRIVATE_KEYS[1]).address;
    expect(await client.getBalance({ address: funded })).toBe(
      BigInt(await anvil.rpc<string>('eth_getBalance', [funded, 'latest'])),
    );
    // The identity precompile echoes its input: a real eth_call executed by the node.
    const { data } = await client.call({
      to: '0x0000000000000000000000000000000000000004',
      data: '0xdeadbeef',
    });
    expect(data).toBe('0xdeadbeef');
    expect(seen.map((h) => h.get('x-service-rpc-credits'))).toEqual(['20', '20', '20']);
  });

  test('behavior: a viem batch is one HTTP request, billed per item', async () => {
    const { client, seen } = viemClient('base-mainnet', { batch: true });
    const before = await balance();
    const [block, chainId, gasPrice] = await Promise.all([
      client.getBlockNumber({ cacheTime: 0 }),
      client.getChainId(),
      client.getGasPrice(),
    ]);
    expect(typeof block).toBe('bigint');
    expect(chainId).toBe(8453);
    expect(gasPrice).toBeGreaterThan(0n);
    expect(seen).toHaveLength(1);
    expect(seen[0]?.get('x-service-rpc-credits')).toBe('60');
    expect(before - (await balance())).toBe(60n * PRICE_NANO);
  });

  test('behavior: a JSON-RPC error item reaches viem as its RPC error and is billed 5 credits', async () => {
    const { client, seen } = viemClient('base-mainnet');
    const before = await balance();
    const creditsBefore = await server.services.rpc.credits.used(server.accountId);
    await expect(
      client.request({ method: 'eth_getBalance', params: ['0x1234', 'latest'] } as never),
    ).rejects.toBeInstanceOf(InvalidParamsRpcError);
    expect(seen[0]?.get('x-service-rpc-credits')).toBe('5');
    expect(seen[0]?.get('x-service-rpc-cost-usd')).toBe('0.00000350');
    expect(before - (await balance())).toBe(5n * PRICE_NANO);
    // Its worst case (20) was taken from the credit cap, and the 15 it did not spend given back.
    expect((await server.services.rpc.credits.used(server.accountId)) - creditsBefore).toBe(5);
  });

  test('behavior: a transaction signed in the client goes through eth_sendRawTransaction and is mined', async () => {
    const { client } = viemClient('base-mainnet');
    // ANVIL_PRIVATE_KEYS[2] does not derive a funded dev account (reported); [3] and [0] do.
    const sender = privateKeyToAccount(ANVIL_PRIVATE_KEYS[3]);
    const recipient = privateKeyToAccount(ANVIL_PRIVATE_KEYS[0]).address;
    const recipientBefore = await client.getBalance({ address: recipient });
    const nonce = await client.getTransactionCount({ address: sender.address });
    const fees = await client.estimateFeesPerGas();
    const serializedTransaction = await sender.signTransaction({
      chainId: 8453,
      type: 'eip1559',
      to: recipient,
      value: parseEther('1.5'),
      nonce,
      gas: 21_000n,
      maxFeePerGas: fees.maxFeePerGas,
      maxPriorityFeePerGas: fees.maxPriorityFeePerGas,
    });
    const hash = await client.sendRawTransaction({ serializedTransaction });
    // anvil answers eth_sendRawTransaction before its automine has written the block: poll as a client does.
    const receipt = await client.waitForTransactionReceipt({ hash, pollingInterval: 20 });
    expect(receipt.status).toBe('success');
    expect(await client.getBalance({ address: recipient })).toBe(recipientBefore + parseEther('1.5'));
  });

  test('behavior: refused methods are viem HTTP errors (400) that name the method and why', async () => {
    const { client } = viemClient('base-mainnet');
    const before = await balance();
    const refusal = async (method: string) => {
      const error = await client.request({ method, params: [] } as never).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(HttpRequestError);
      expect((error as HttpRequestError).status).toBe(400);
      return (error as HttpRequestError).details;
    };
    expect(await refusal('eth_accounts')).toMatch(
      /eth_accounts \(key and mining methods .*eth_sendRawTransaction/,
    );
    expect(await refusal('eth_subscribe')).toMatch(/eth_subscribe \(WebSocket-only/);
    expect(await refusal('eth_newFilter')).toMatch(/eth_newFilter \(stateful filters .*eth_getLogs/);
    expect(await refusal('admin_peers')).toMatch(/admin_peers \(not supported/);
    // A Solana method is not an EVM method.
    expect(await refusal('getBalance')).toMatch(/getBalance/);
    expect(await balance()).toBe(before);
  });
});

describe('POST /crypto/rpc/{network}: batches, prices and headers', () => {
  test('behavior: one refused method rejects the whole batch, naming every offending method', async () => {
    const before = await balance();
    const answer = await post('base-mainnet', [
      call('eth_blockNumber', [], 1),
      call('eth_sign', ['0x00', '0x00'], 2),
      call('eth_getFilterChanges', ['0x1'], 3),
    ]);
    expect(answer.status).toBe(400);
    const { error, code } = answer.json as { error: string; code: string };
    expect(code).toBe('UNSUPPORTED_METHOD');
    expect(error).toContain('eth_sign (');
    expect(error).toContain('eth_getFilterChanges (');
    expect(error).not.toContain('eth_blockNumber');
    expect(await balance()).toBe(before);
  });

  test('behavior: the answer is the bytes the node sent, as JSON, with the headers Express would give it', async () => {
    const request = { jsonrpc: '2.0', id: 7, method: 'eth_chainId', params: [] };
    const direct = await fetch(anvil.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(request),
    });
    const expected = await direct.text();
    const answer = await post('base-mainnet', request);
    expect(answer.status).toBe(200);
    expect(answer.text).toBe(expected);
    expect(answer.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(answer.headers.get('content-length')).toBe(String(Buffer.byteLength(expected)));
  });

  test.each([
    ['eth_blockNumber', 'base-mainnet', 20, '0.00001400'],
    ['txpool_status', 'base-mainnet', 40, '0.00002800'],
    ['txpool_content', 'base-mainnet', 80, '0.00005600'],
    ['eth_blockNumber', 'robinhood-mainnet', 25, '0.00001750'],
  ])('behavior: %s on %s costs %i credits (%s USD)', async (method, network, credits, cost) => {
    const before = await balance();
    const sentAt = Date.now();
    const answer = await post(network, call(method));
    expect(answer.status).toBe(200);
    expect(answer.json).toMatchObject({ jsonrpc: '2.0', id: 1 });
    // Time-ordered: its first 12 hex digits are the millisecond it was made (random-hex.ts timeOrderedHex).
    const madeAt = Number.parseInt(answer.headers.get('x-request-id')?.slice(0, 12) ?? '', 16);
    expect(madeAt).toBeGreaterThanOrEqual(sentAt);
    expect(madeAt).toBeLessThanOrEqual(Date.now());
    expect(answer.json).toHaveProperty('result');
    expect(answer.headers.get('content-type')).toMatch(/^application\/json/);
    expect(answer.headers.get('x-service-rpc-credits')).toBe(String(credits));
    expect(answer.headers.get('x-service-rpc-cost-usd')).toBe(cost);
    expect(answer.headers.get('x-request-id')).toMatch(/^[0-9a-f]{32}$/);
    expect(before - (await balance())).toBe(BigInt(credits) * PRICE_NANO);
    const entries = await server.services.ledger.listEntries(server.accountId, { limit: 1 });
    expect(entries[0]).toMatchObject({ type: 'CHARGE', requestId: answer.headers.get('x-request-id') });
  });

  test('behavior: a batch of one success and one error item costs 25 credits, items paired by id', async () => {
    const before = await balance();
    const answer = await post('base-mainnet', [
      call('eth_getBalance', ['0xnot-an-address', 'latest'], 'bad'),
      call('eth_blockNumber', [], 'good'),
    ]);
    expect(answer.status).toBe(200);
    const items = answer.json as Array<{ id: string; result?: string; error?: { code: number } }>;
    expect(items.find((i) => i.id === 'good')?.result).toMatch(/^0x/);
    expect(items.find((i) => i.id === 'bad')?.error?.code).toEqual(expect.any(Number));
    expect(answer.headers.get('x-service-rpc-credits')).toBe('25');
    expect(answer.headers.get('x-service-rpc-cost-usd')).toBe('0.00001750');
    expect(before - (await balance())).toBe(25n * PRICE_NANO);
  });

  test('behavior: Solana methods are priced with base 30, getSupply at 4x, and forwarded byte for byte', async () => {
    const single = await post(
      'solana-mainnet',
      call('getBalance', ['9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM']),
    );
    expect(single.status).toBe(200);
    expect(single.headers.get('content-type')).toMatch(/^application\/json/);
    expect(single.text).toBe(
      JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        result: { context: { slot: 312_345_678, apiVersion: '2.2.0' }, value: 1_500_000_000 },
      }),
    );
    expect(single.headers.get('x-service-rpc-credits')).toBe('30');
    expect(single.headers.get('x-service-rpc-cost-usd')).toBe('0.00002100');
    const large = await post('solana-mainnet', call('getSupply'));
    expect(large.headers.get('x-service-rpc-credits')).toBe('120');
    const wrongFamily = await post('solana-mainnet', call('eth_blockNumber'));
    expect(wrongFamily.status).toBe(400);
    const websocket = await post('solana-mainnet', call('accountSubscribe', ['x']));
    expect(websocket.status).toBe(400);
    expect((websocket.json as { error: string }).error).toContain('WebSocket-only');
  });
});

describe('POST /crypto/rpc/{network}: upstream failures', () => {
  test('behavior: a node answering 500 and a refused one are skipped for the next upstream', async () => {
    const seenBefore = failing.requests.length;
    const answer = await post('ethereum-sepolia', call('eth_blockNumber'));
    expect(answer.status).toBe(200);
    expect((answer.json as { result: string }).result).toMatch(/^0x/);
    expect(answer.headers.get('x-service-rpc-credits')).toBe('20');
    expect(failing.requests.length).toBe(seenBefore + 1);
  });

  test('behavior: garbage -> 502, silence -> 504, no upstream -> 503; none of them is charged', async () => {
    const before = await balance();
    const bad = await post('solana-devnet', call('getSlot'));
    expect(bad.status).toBe(502);
    expect(bad.json).toMatchObject({ code: 'UPSTREAM_INVALID_RESPONSE' });
    const slow = await post('polygon-amoy', call('eth_blockNumber'));
    expect(slow.status).toBe(504);
    expect(slow.json).toMatchObject({ code: 'UPSTREAM_TIMEOUT' });
    const none = await post('arbitrum-mainnet', call('eth_blockNumber'));
    expect(none.status).toBe(503);
    expect((none.json as { error: string }).error).toContain('arbitrum-mainnet');
    const unknown = await post('dogecoin-mainnet', call('eth_blockNumber'));
    expect(unknown.status).toBe(400);
    expect(await balance()).toBe(before);
    const balanceRow = await server.services.ledger.getBalance(server.accountId);
    expect(balanceRow.usdReservedNano).toBe(0n);
  });
});

describe('POST /crypto/rpc/{network}: idempotency', () => {
  const body = call('getBalance', ['9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM'], 42);

  test('behavior: the same key and body replays the stored answer without calling the node or charging', async () => {
    const before = await balance();
    const calls = solana.requests.length;
    const first = await post('solana-mainnet', body, { 'idempotency-key': 'replay-1' });
    expect(first.status).toBe(200);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    const again = await post('solana-mainnet', body, { 'idempotency-key': 'replay-1' });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers.get('x-request-id')).toBe(first.headers.get('x-request-id'));
    expect(solana.requests.length).toBe(calls + 1);
    expect(before - (await balance())).toBe(30n * PRICE_NANO);
  });

  test('behavior: the same key with another body (or network) is 400', async () => {
    await post('solana-mainnet', body, { 'idempotency-key': 'conflict-1' });
    const other = await post('solana-mainnet', { ...body, id: 43 }, { 'idempotency-key': 'conflict-1' });
    expect(other.status).toBe(400);
    expect(other.json).toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
    const otherNetwork = await post('solana-devnet', body, { 'idempotency-key': 'conflict-1' });
    expect(otherNetwork.status).toBe(400);
  });

  test('behavior: a duplicate that arrives while the first is in flight gets 409', async () => {
    const calls = solana.requests.length;
    const release = solana.hold();
    const first = post('solana-mainnet', body, { 'idempotency-key': 'inflight-1' });
    try {
      while (solana.requests.length === calls) await new Promise((r) => setTimeout(r, 10));
      const duplicate = await post('solana-mainnet', body, { 'idempotency-key': 'inflight-1' });
      expect(duplicate.status).toBe(409);
      expect(duplicate.json).toMatchObject({ code: 'IDEMPOTENCY_KEY_IN_FLIGHT' });
    } finally {
      release();
    }
    expect((await first).status).toBe(200);
    const replay = await post('solana-mainnet', body, { 'idempotency-key': 'inflight-1' });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
  });

  test('behavior: a failed call frees its key, so a retry runs', async () => {
    const failed = await post('solana-devnet', call('getSlot'), { 'idempotency-key': 'retry-1' });
    expect(failed.status).toBe(502);
    const retried = await post('solana-devnet', call('getSlot'), { 'idempotency-key': 'retry-1' });
    expect(retried.status).toBe(502);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();
  });

  test('behavior: a malformed key is 400', async () => {
    const answer = await post('solana-mainnet', body, { 'idempotency-key': 'has spaces' });
    expect(answer.status).toBe(400);
  });
});

// The minute's counts held by the server process (one process on SQLite, the default) or in the rows (as
// several workers count): either way a call refused after its count is not counted.
describe.each([
  { counts: 'held by the process', name: 'caps', env: {} as Record<string, string> },
  { counts: 'in the rows', name: 'caps-rows', env: { SQLITE_RATE_LIMIT_FLUSH_MS: '0' } },
])('POST /crypto/rpc/{network}: caps, counts $counts', ({ name, env }) => {
  let capped: Server;
  const key = async (accountId: string) => {
    await capped.services.ledger.topUp({ accountId, amountNano: 1_000_000_000n });
    return (await capped.services.keys.create({ accountId, keyType: 'INFERENCE' })).secret;
  };
  const postAs = async (secret: string, body: unknown) =>
    fetch(`${capped.base}/crypto/rpc/base-mainnet`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });

  afterAll(async () => {
    await capped?.close();
  });

  test('behavior: per-minute cap per caller (standard and staff tiers) and rolling 24-hour credit cap -> 429', async () => {
    // Created first so its id can be put on the staff list.
    const probe = await startRpcServer(name, { RPC_UPSTREAM_BASE_MAINNET: anvil.url, ...env });
    const standard = (await probe.services.accounts.createApiAccount()).id;
    const staffAccount = (await probe.services.accounts.createApiAccount()).id;
    const heavy = (await probe.services.accounts.createApiAccount()).id;
    await probe.close();
    capped = await startRpcServer(name, {
      ...env,
      RPC_UPSTREAM_BASE_MAINNET: anvil.url,
      RPC_REQUESTS_PER_MINUTE: '3',
      RPC_STAFF_REQUESTS_PER_MINUTE: '5',
      RPC_STAFF_ACCOUNTS: staffAccount,
      RPC_CREDITS_PER_DAY: '100',
    });
    await awayFromMinuteEdge();

    const standardKey = await key(standard);
    for (let i = 0; i < 3; i++) expect((await postAs(standardKey, call('eth_blockNumber'))).status).toBe(200);
    const refused = await postAs(standardKey, call('eth_blockNumber'));
    expect(refused.status).toBe(429);
    expect(refused.headers.get('x-ratelimit-limit')).toBe('3');
    expect(refused.headers.get('x-ratelimit-remaining')).toBe('0');
    expect(Number(refused.headers.get('x-ratelimit-reset'))).toBeGreaterThan(Date.now() / 1000);
    expect(await refused.json()).toMatchObject({
      code: 'RPC_RATE_LIMIT_EXCEEDED',
      customMessage: expect.stringContaining('3 requests per minute on the standard tier'),
    });

    const staffKey = await key(staffAccount);
    for (let i = 0; i < 4; i++) expect((await postAs(staffKey, call('eth_blockNumber'))).status).toBe(200);

    const heavyKey = await key(heavy);
    const batch = [call('eth_blockNumber', [], 1), call('eth_chainId', [], 2), call('eth_gasPrice', [], 3)];
    expect((await postAs(heavyKey, batch)).status).toBe(200);
    const over = await postAs(heavyKey, batch);
    expect(over.status).toBe(429);
    expect(over.headers.get('x-ratelimit-limit')).toBeNull();
    expect(await over.json()).toMatchObject({
      code: 'RPC_CREDIT_CAP_EXCEEDED',
      customMessage: expect.stringContaining('100 credits per rolling 24 hours'),
    });
    // What still fits under the cap is served.
    expect((await postAs(heavyKey, call('eth_blockNumber'))).status).toBe(200);
    expect(await capped.services.rpc.credits.used(heavy)).toBe(80);
    // The refused batch was not counted in the minute either (it is counted in the reservation's
    // transaction): a third call fits both caps, and only the fourth meets the per-minute cap.
    expect((await postAs(heavyKey, call('eth_blockNumber'))).status).toBe(200);
    expect(await capped.services.rpc.credits.used(heavy)).toBe(100);
    const fourth = await postAs(heavyKey, call('eth_blockNumber'));
    expect(fourth.status).toBe(429);
    expect(await fourth.json()).toMatchObject({ code: 'RPC_RATE_LIMIT_EXCEEDED' });
  });

  test('behavior: calls refused for the balance (402) are not counted in the minute nor in the credits', async () => {
    const poor = (await capped.services.accounts.createApiAccount()).id;
    const poorKey = (await capped.services.keys.create({ accountId: poor, keyType: 'INFERENCE' })).secret;
    await awayFromMinuteEdge();
    for (let i = 0; i < 4; i++) {
      const refused = await postAs(poorKey, call('eth_blockNumber'));
      expect(refused.status).toBe(402);
    }
    expect(await capped.services.rpc.credits.used(poor)).toBe(0);
    await capped.services.ledger.topUp({ accountId: poor, amountNano: 1_000_000_000n });
    // The minute's three calls are all still there.
    for (let i = 0; i < 3; i++) expect((await postAs(poorKey, call('eth_blockNumber'))).status).toBe(200);
    const over = await postAs(poorKey, call('eth_blockNumber'));
    expect(over.status).toBe(429);
    expect(over.headers.get('x-ratelimit-remaining')).toBe('0');
    // The three served calls' credits (what each cost, the rest of its worst case given back).
    expect(await capped.services.rpc.credits.used(poor)).toBe(60);
    await capped.services.rateLimits.flush();
    const [row] = await capped.services.database.db
      .selectFrom('rate_limit_counters')
      .select('used')
      .where('bucket', '=', `rpc:${poor}:RPM`)
      .execute();
    expect(Number(row?.used)).toBe(3);
  });
});
