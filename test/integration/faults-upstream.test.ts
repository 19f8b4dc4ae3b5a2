/**
 * Upstream faults that the domain suites do not already cover, chat and JSON-RPC. Covered elsewhere:
 * chat upstream slow (504) / stalling / truncating a stream / 500 / 429 / 400 / an error inside the stream in
 * `chat-upstream.test.ts`; RPC node answering garbage (502), silent (504), 500 or refused with a fallback node,
 * and no node configured (503) in `rpc.test.ts`. Here: the only backend down (connection refused) and
 * answering garbage with 200, for chat (plain and streamed), and the only RPC node down or cutting its answer
 * off mid-body. Each answers a documented 5xx with the `{error}` body, charges nothing, and leaves the ledger
 * sound (`checkInvariants`).
 */
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';
import { checkInvariants } from '../support/invariants.ts';
import { freePort } from '../support/process.ts';

const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};
const llama = defaults.models['llama-3.3-70b'] as Record<string, unknown>;

/** A loopback upstream that misbehaves by path: `/garbage/…`, `/garbage-sse/…`, `/cut/…`. */
function route(req: IncomingMessage, res: ServerResponse) {
  const [, name] = (req.url ?? '').split('/');
  req.resume();
  switch (name) {
    case 'garbage':
      res.writeHead(200, { 'content-type': 'text/html' }).end('<html><body>maintenance</body></html>');
      return;
    case 'garbage-sse':
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end('data: {not json at all\n\ndata: <html>\n\ndata: [DONE]\n\n');
      return;
    case 'cut':
      // Promises 2000 bytes, sends a fragment of a JSON-RPC answer, then drops the connection.
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '2000' });
      res.write('{"jsonrpc":"2.0","id":1,"result":');
      setTimeout(() => res.socket?.destroy(), 20);
      return;
    default:
      res.writeHead(404).end();
  }
}

let misbehaving: Server;
let origin = '';
let closedPort = 0;
let gateway: ChatServer;

beforeAll(async () => {
  misbehaving = createServer(route).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => misbehaving.once('listening', () => resolve()));
  origin = `http://127.0.0.1:${(misbehaving.address() as AddressInfo).port}`;
  // A port nobody listens on: connections are refused.
  closedPort = await freePort();
  const up = (baseUrl: string) => ({ kind: 'openai-compatible', name: 'only', baseUrl, timeoutMs: 10_000 });
  gateway = await startChatServer({
    env: {
      RPC_UPSTREAM_SOLANA_MAINNET: `http://127.0.0.1:${closedPort}`,
      RPC_UPSTREAM_SOLANA_DEVNET: `${origin}/cut`,
      RPC_PRICE_PER_CREDIT_USD: '0.001',
    },
    catalogYaml: stringify({
      models: {
        'down-model': { ...llama, provider: up(`http://127.0.0.1:${closedPort}/v1`) },
        'garbage-model': { ...llama, provider: up(`${origin}/garbage/v1`) },
        'garbage-sse-model': { ...llama, provider: up(`${origin}/garbage-sse/v1`) },
      },
    }),
  });
}, 60_000);

afterAll(async () => {
  await gateway?.close();
  await new Promise<void>((resolve) => misbehaving?.close(() => resolve()));
});

async function chat(key: string, model: string, stream: boolean) {
  const response = await fetch(`${gateway.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, stream, messages: [{ role: 'user', content: 'Hello' }] }),
    signal: AbortSignal.timeout(30_000),
  });
  return {
    status: response.status,
    type: response.headers.get('content-type') ?? '',
    text: await response.text(),
  };
}

async function rpc(key: string, network: string) {
  const response = await fetch(`${gateway.base}/crypto/rpc/${network}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'getSlot' }),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: response.status, json: (await response.json()) as { error?: unknown; code?: string } };
}

/** Nothing charged or held for the account, and the whole ledger sound. */
async function expectUntouched(accountId: string, usd: bigint) {
  const balance = await gateway.services.ledger.getBalance(accountId);
  expect(balance.usdNano).toBe(usd);
  expect(balance.usdReservedNano).toBe(0n);
  expect((await checkInvariants(gateway.services.database)).violations).toEqual([]);
}

describe('upstream faults not covered by the domain suites', () => {
  test('behavior: the only chat backend down -> 500 {error}, plain and streamed; nothing charged', async () => {
    const { key, accountId } = await gateway.account('1');
    for (const stream of [false, true]) {
      const r = await chat(key, 'down-model', stream);
      expect(r.status).toBe(500);
      expect(JSON.parse(r.text)).toMatchObject({ error: 'Inference processing failed' });
    }
    await expectUntouched(accountId, 1_000_000_000n);
  });

  test('behavior: a chat backend answering 200 with garbage -> 500 {error}, plain and streamed; nothing charged', async () => {
    const { key, accountId } = await gateway.account('1');
    const plain = await chat(key, 'garbage-model', false);
    expect(plain.status).toBe(500);
    expect(JSON.parse(plain.text)).toMatchObject({ error: 'Inference processing failed' });
    const sse = await chat(key, 'garbage-sse-model', false);
    expect(sse.status).toBe(500);
    expect(JSON.parse(sse.text)).toMatchObject({ error: 'Inference processing failed' });
    const streamed = await chat(key, 'garbage-sse-model', true);
    // The garbage arrives before anything was sent to the client, so even a stream is answered with the 500.
    expect(streamed.status).toBe(500);
    expect(JSON.parse(streamed.text)).toMatchObject({ error: 'Inference processing failed' });
    await expectUntouched(accountId, 1_000_000_000n);
  });

  test('behavior: the only RPC node down or cutting its answer off mid-body -> 502 {error}; nothing charged', async () => {
    const { key, accountId } = await gateway.account('1');
    const down = await rpc(key, 'solana-mainnet');
    expect(down.status).toBe(502);
    expect(down.json).toMatchObject({ code: 'UPSTREAM_UNAVAILABLE' });
    const cut = await rpc(key, 'solana-devnet');
    expect(cut.status).toBe(502);
    expect(typeof cut.json.error).toBe('string');
    await expectUntouched(accountId, 1_000_000_000n);
  });
});
