/**
 * The benchmark's storage floor (bench/floor.ts) writes what a billed request writes, on the current schema:
 * a chat's reservation and capture (two ledger entries, the counters), an RPC call's around a forward, a
 * streamed chat's around a chat upstream's event stream (billed from the usage it reports), and a forward
 * alone without writes. Kept true here so that a schema change cannot quietly turn the floor into a
 * failing (or emptier) row of `npm run bench`.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import { afterAll, beforeAll, expect, test, vi } from 'vitest';
import { fundedKey } from '../../bench/setup.ts';
import { repoRoot } from '../support/contract.ts';
import { freePort, stopPid } from '../support/process.ts';

const scratch = mkdtempSync(join(tmpdir(), 'bench-floor-'));
const file = join(scratch, 'floor.db');
let pid: number | undefined;
let origin = '';
let upstream: Server;
let forwarded = 0;
const sent: Array<{ model: string; stream: boolean; max_completion_tokens: number }> = [];

beforeAll(async () => {
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      if (req.url === '/v1/chat/completions') {
        sent.push(JSON.parse(Buffer.concat(chunks).toString('utf8')));
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        // Two reads' worth: the floor must carry an event split across them.
        const delta = (content: string) =>
          `data: ${JSON.stringify({ id: 'up', model: 'up', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
        const usage = `data: ${JSON.stringify({ id: 'up', model: 'up', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 12, completion_tokens: 2, total_tokens: 14 } })}\n\n`;
        const first = delta('Hello') + delta(' floor');
        res.write(first.slice(0, first.length - 20));
        setTimeout(() => res.end(`${first.slice(first.length - 20)}${usage}data: [DONE]\n\n`), 20);
        return;
      }
      forwarded += 1;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"jsonrpc":"2.0","id":1,"result":"0x2a"}');
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const key = await fundedKey(`sqlite:${file}`);
  const port = await freePort();
  const child = spawn(process.execPath, ['--import', 'tsx', join(repoRoot, 'bench/floor.ts')], {
    cwd: repoRoot,
    env: {
      ...process.env,
      PORT: String(port),
      FLOOR_DB: file,
      FLOOR_KEY: key,
      FLOOR_UPSTREAM: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
      FLOOR_CHAT_UPSTREAM: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
    },
    stdio: 'ignore',
  });
  pid = child.pid;
  origin = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      if ((await fetch(`${origin}/`)).ok) break;
    } catch {}
    if (Date.now() > deadline) throw new Error('bench/floor.ts did not start');
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}, 60_000);

afterAll(async () => {
  if (pid !== undefined) await stopPid(pid);
  await new Promise((resolve) => upstream?.close(resolve));
  rmSync(scratch, { recursive: true, force: true });
});

const post = (path: string, body: unknown) =>
  fetch(`${origin}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });

test("the floor writes a chat's and an RPC call's rows, and forwards without writing", async () => {
  const db = new SqliteDatabase(file, { readonly: true });
  db.defaultSafeIntegers(true);
  const before = db.prepare('select usd_balance_nano from accounts').get() as { usd_balance_nano: bigint };
  try {
    const chats = await Promise.all(
      [1, 2, 3].map(() => post('/chat', { model: 'llama-3.3-70b', messages: [], max_tokens: 16 })),
    );
    for (const answer of chats) {
      expect(answer.status).toBe(200);
      expect(((await answer.json()) as { object: string }).object).toBe('chat.completion');
    }
    const rpc = await post('/rpc', { jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] });
    expect(await rpc.json()).toEqual({ jsonrpc: '2.0', id: 1, result: '0x2a' });
    const bare = await post('/proxy', { jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] });
    expect(bare.status).toBe(200);
    expect(forwarded).toBe(2);

    // The answers do not wait for their captures (as the server's): the rows are there once they commit.
    await vi.waitFor(
      () =>
        expect(db.prepare('select status, count(*) as n from reservations group by status').all()).toEqual([
          { status: 'captured', n: 4n },
        ]),
      { timeout: 5_000, interval: 20 },
    );
    const entries = db
      .prepare(`select sku, count(*) as n, sum(amount_nano) as total from ledger_entries
                  where type = 'CHARGE' group by sku order by sku`)
      .all();
    expect(entries).toEqual([
      { sku: 'input_tokens', n: 3n, total: -3n * 20n * 700n },
      { sku: 'output_tokens', n: 3n, total: -3n * 16n * 2_800n },
      { sku: 'rpc_credits', n: 1n, total: -20n * 700n },
    ]);
    // Each entry records the balance it left, one after the other in `seq` order (the captures of a commit
    // group are written together, as the server's).
    const chain = db
      .prepare('select amount_nano, balance_after_nano from ledger_entries order by seq')
      .all() as Array<{
      amount_nano: bigint;
      balance_after_nano: bigint;
    }>;
    for (let i = 1; i < chain.length; i++)
      expect(chain[i]?.balance_after_nano).toBe(
        (chain[i - 1]?.balance_after_nano ?? 0n) + (chain[i]?.amount_nano ?? 0n),
      );
    // The key's spend of the day, as the server's capture adds it: its charges' sum (they are negative).
    const charged = db
      .prepare(`select sum(amount_nano) from ledger_entries where type = 'CHARGE'`)
      .pluck()
      .get();
    expect(db.prepare('select sum(net_nano) from api_key_spend_days').pluck().get()).toBe(charged);
    // Its rows' ids are time-ordered (UUIDv7), as the server's storage makes them: each insert at the end of
    // its id index (random ones cost the floor about 40% of its chats a second, bench/HISTORY.md).
    const uuidV7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
    const entryIds = db
      .prepare('select id from ledger_entries where type = ? order by seq')
      .pluck()
      .all('CHARGE');
    const reservationIds = db.prepare('select id from reservations').pluck().all();
    expect(entryIds).toHaveLength(7);
    expect(reservationIds).toHaveLength(4);
    for (const id of [...entryIds, ...reservationIds]) expect(id).toMatch(uuidV7);
    expect([...(entryIds as string[])].sort()).toEqual(entryIds);
    const after = db.prepare('select usd_balance_nano, usd_reserved_nano from accounts').get();
    expect(after).toEqual({
      usd_balance_nano: before.usd_balance_nano - 3n * (20n * 700n + 16n * 2_800n) - 20n * 700n,
      usd_reserved_nano: 0n,
    });
    // The counts are held in memory and written behind (every 50 ms), as one server process does.
    const counters = () =>
      (
        db.prepare('select bucket, used from rate_limit_counters order by bucket').all() as Array<{
          bucket: string;
          used: bigint;
        }>
      ).map((c) => [c.bucket.replace(/^key:[^:]+/, 'key').replace(/^rpc:[^:]+/, 'rpc'), c.used]);
    await vi.waitFor(
      () =>
        expect(counters()).toEqual([
          ['key:model:llama-3.3-70b:RPD', 3n],
          ['key:model:llama-3.3-70b:RPM', 3n],
          ['key:model:llama-3.3-70b:TPM', 3n * 36n],
          ['rpc:RPM', 1n],
        ]),
      { timeout: 5_000, interval: 20 },
    );
  } finally {
    db.close();
  }
});

test('the floor streams a chat through its upstream and bills the usage the upstream reported', async () => {
  const db = new SqliteDatabase(file, { readonly: true });
  db.defaultSafeIntegers(true);
  const balance = () =>
    db.prepare('select usd_balance_nano, usd_reserved_nano from accounts').get() as {
      usd_balance_nano: bigint;
      usd_reserved_nano: bigint;
    };
  const tokensOf = (sku: string) =>
    (
      db
        .prepare(`select coalesce(sum(cast(units as integer)), 0) as n from ledger_entries where sku = ?`)
        .get(sku) as { n: bigint }
    ).n;
  const before = balance();
  const inputBefore = tokensOf('input_tokens');
  try {
    const answer = await post('/upstream', {
      model: 'bench-upstream',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 16,
      stream: true,
    });
    expect(answer.status).toBe(200);
    expect(answer.headers.get('content-type')).toBe('text/event-stream');
    const text = await answer.text();
    const frames = text.split('\n\n').filter(Boolean);
    expect(frames.at(-1)).toBe('data: [DONE]');
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f.slice('data: '.length)));
    expect(chunks.map((c) => c.choices[0]?.delta?.content ?? null)).toEqual(['Hello', ' floor', null]);
    // Re-emitted with the request's id and model, not the upstream's.
    for (const chunk of chunks) {
      expect(chunk.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
      expect(chunk.model).toBe('bench-upstream');
    }
    expect(sent.at(-1)).toMatchObject({ model: 'bench-upstream', stream: true, max_completion_tokens: 16 });

    // The capture commits in the answer's turn without the answer waiting for it (the hold is in memory, as
    // one server process holds it: the account's reserved sum stays 0).
    let after = balance();
    for (let i = 0; i < 50 && after.usd_balance_nano === before.usd_balance_nano; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      after = balance();
    }
    expect(after).toEqual({
      usd_balance_nano: before.usd_balance_nano - (12n * 700n + 2n * 2_800n),
      usd_reserved_nano: 0n,
    });
    expect(tokensOf('input_tokens') - inputBefore).toBe(12n);
  } finally {
    db.close();
  }
});
