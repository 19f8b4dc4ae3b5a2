/**
 * Scale-out: three real server processes (`server/main.ts`, as `npm start` runs it) on ONE embedded PostgreSQL,
 * with load spread over them round-robin. Everything that must be exact is exact in total, not per instance:
 * the RPC per-minute cap, a model's requests-per-minute limit, concurrent charges against a small balance,
 * idempotent replays and in-flight duplicates, a Sign-In-With-X nonce, video jobs (each worked once), and an
 * x402 payment sent to two instances (credited once, on a real EVM node). Every test ends with the money
 * invariants (`checkSettledInvariants`) on the shared database.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { parseUsdToNano } from '../../server/money.ts';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { createVideoJobs } from '../../server/storage/video-jobs.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { awayFromMinuteEdge } from '../support/clock.ts';
import { repoRoot } from '../support/contract.ts';
import { checkSettledInvariants } from '../support/invariants.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';
import { type RpcStandIn, startRpcStandIn } from '../support/rpc-upstream.ts';
import { type ServerProcess, startServerProcess, stopServerProcesses } from '../support/server-process.ts';
import { installTestUsdc, mintUsdc, usdcBalance } from '../support/x402/contracts.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

// biome-ignore lint/suspicious/noExplicitAny: response bodies as tests read them; assertions check their shape.
type Json = any;

const ADMIN = 'svc_admin_scale_out_tests_secret_0123456789';
const ORIGIN = 'https://api.example.test';
const RPC_PER_MINUTE = 9;
const MODEL_PER_MINUTE = 6;
/** 30 credits per getSlot at 0.001 USD per credit: 0.03 USD a call. */
const RPC_PRICE_PER_CREDIT = '0.001';
const PAY_TO = privateKeyToAccount(generatePrivateKey()).address;

const scratch = mkdtempSync(join(tmpdir(), 'scale-out-'));
const postgres = postgresPerFile();
let solana: RpcStandIn;
let anvil: StartedAnvil;
let url = '';
let database: Database;
let instances: ServerProcess[] = [];
/** Requests this file sent to the instances (for the README figures). */
let sent = 0;
/** An account that spends through the RPC proxy without meeting its per-minute cap (a staff account). */
let spender = { accountId: '', key: '' };

async function newAccount(usd: string, name: string) {
  const account = await createAccounts(database).createApiAccount({ name });
  if (usd !== '0')
    await createLedger(database).topUp({ accountId: account.id, amountNano: parseUsdToNano(usd) });
  const { secret } = await createApiKeys(database).create({ accountId: account.id, keyType: 'INFERENCE' });
  return { accountId: account.id, key: secret };
}

beforeAll(async () => {
  [solana, anvil] = await Promise.all([startRpcStandIn('solana'), startAnvil({ chainId: 8453 })]);
  await installTestUsdc(anvil.rpc);
  url = await postgres().createDatabase('scale_out');
  database = await createDatabase(url);
  await migrate(database);
  spender = await newAccount('0.30', 'spender');

  // The model limit under test: llama-3.3-70b with a small per-minute limit for paid accounts.
  const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
    models: Record<string, Record<string, unknown>>;
  };
  const llama = defaults.models['llama-3.3-70b'] as Record<string, unknown>;
  const catalogPath = join(scratch, 'catalog.yaml');
  writeFileSync(
    catalogPath,
    stringify({
      models: {
        'llama-3.3-70b': {
          ...llama,
          rateLimits: {
            paid: { requestsPerMinute: MODEL_PER_MINUTE, requestsPerDay: 1000, tokensPerMinute: 1_000_000 },
            partner: { requestsPerMinute: 100, requestsPerDay: 1000, tokensPerMinute: 1_000_000 },
          },
        },
      },
    }),
  );
  const env = {
    DATABASE_URL: url,
    ADMIN_API_KEY: ADMIN,
    PUBLIC_ORIGIN: ORIGIN,
    SERVICE_CONFIG: catalogPath,
    RPC_UPSTREAM_SOLANA_MAINNET: solana.url,
    RPC_REQUESTS_PER_MINUTE: String(RPC_PER_MINUTE),
    RPC_STAFF_ACCOUNTS: spender.accountId,
    RPC_PRICE_PER_CREDIT_USD: RPC_PRICE_PER_CREDIT,
    X402_PAY_TO_BASE: PAY_TO,
    X402_BASE_RPC_URL: anvil.url,
    X402_FACILITATOR_PRIVATE_KEY: ANVIL_PRIVATE_KEYS[0],
    VIDEO_WORKER_ENABLED: 'true',
    VIDEO_WORKER_POLL_MS: '100',
  };
  // The first start bootstraps; the other two start together on the bootstrapped database.
  const first = await startServerProcess(env);
  instances = [first, ...(await Promise.all([startServerProcess(env), startServerProcess(env)]))];
}, 300_000);

afterAll(async () => {
  await stopServerProcesses();
  await database?.close();
  await Promise.all([solana?.close(), anvil?.stop()]);
  rmSync(scratch, { recursive: true, force: true });
}, 120_000);

/** Request `i` goes to instance `i mod 3`. */
const base = (i: number) => instances[i % instances.length]?.base ?? '';

async function post(i: number, path: string, body: unknown, headers: Record<string, string>) {
  sent++;
  const response = await fetch(`${base(i)}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  let json: Json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, json };
}

const rpc = (i: number, key: string, id: number, headers: Record<string, string> = {}) =>
  post(
    i,
    '/crypto/rpc/solana-mainnet',
    { jsonrpc: '2.0', id, method: 'getSlot' },
    { authorization: `Bearer ${key}`, ...headers },
  );

async function expectSound() {
  const report = await checkSettledInvariants(database);
  expect(report.violations).toEqual([]);
  return report;
}

describe('three server processes on one PostgreSQL', () => {
  test('behavior: the RPC per-minute cap holds in total: 27 calls over 3 instances -> exactly 9 admitted', async () => {
    const caller = await newAccount('5', 'rpc-cap');
    await awayFromMinuteEdge();
    const results = await Promise.all(Array.from({ length: 27 }, (_, i) => rpc(i, caller.key, i)));
    expect(results.filter((r) => r.status === 200)).toHaveLength(RPC_PER_MINUTE);
    const refused = results.filter((r) => r.status === 429);
    expect(refused).toHaveLength(27 - RPC_PER_MINUTE);
    for (const r of refused) expect(typeof r.json?.error).toBe('string');
    await expectSound();
  });

  test('behavior: a model rate limit holds in total: 18 chats over 3 instances -> exactly 6 admitted', async () => {
    const caller = await newAccount('5', 'model-rpm');
    await awayFromMinuteEdge();
    const results = await Promise.all(
      Array.from({ length: 18 }, (_, i) =>
        post(
          i,
          '/chat/completions',
          { model: 'llama-3.3-70b', max_tokens: 8, messages: [{ role: 'user', content: `Say hi ${i}` }] },
          { authorization: `Bearer ${caller.key}` },
        ),
      ),
    );
    expect(results.filter((r) => r.status === 200)).toHaveLength(MODEL_PER_MINUTE);
    const refused = results.filter((r) => r.status === 429);
    expect(refused).toHaveLength(18 - MODEL_PER_MINUTE);
    for (const r of refused) expect(r.json).toMatchObject({ code: 'RATE_LIMIT_EXCEEDED' });
    await expectSound();
  });

  test('behavior: 30 concurrent charges against 0.30 USD over 3 instances: exactly 10 at 0.03 succeed, never an overspend', async () => {
    const results = await Promise.all(Array.from({ length: 30 }, (_, i) => rpc(i, spender.key, i)));
    expect(results.filter((r) => r.status === 200)).toHaveLength(10);
    const refused = results.filter((r) => r.status === 402);
    expect(refused).toHaveLength(20);
    for (const r of refused) expect(r.json).toMatchObject({ code: 'INSUFFICIENT_BALANCE' });
    // Sound once the captures the last answers did not wait for are in (expectSound waits for them).
    await expectSound();
    const balance = await createLedger(database).getBalance(spender.accountId);
    expect(balance.usdNano).toBe(0n);
    expect(balance.usdReservedNano).toBe(0n);
  });

  test('behavior: an idempotent replay and an in-flight duplicate are recognised from another instance', async () => {
    const caller = await newAccount('5', 'idempotency');
    const before = solana.requests.length;
    const first = await rpc(0, caller.key, 1, { 'idempotency-key': 'scale-replay-1' });
    expect(first.status).toBe(200);
    const replays = await Promise.all(
      [1, 2].map((i) => rpc(i, caller.key, 1, { 'idempotency-key': 'scale-replay-1' })),
    );
    for (const replay of replays) {
      expect(replay.status).toBe(200);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(replay.text).toBe(first.text);
    }
    expect(solana.requests.length).toBe(before + 1);

    const release = solana.hold();
    let running: ReturnType<typeof rpc> | undefined;
    try {
      running = rpc(0, caller.key, 2, { 'idempotency-key': 'scale-inflight-1' });
      while (solana.requests.length === before + 1) await new Promise((r) => setTimeout(r, 10));
      const duplicates = await Promise.all(
        [1, 2].map((i) => rpc(i, caller.key, 2, { 'idempotency-key': 'scale-inflight-1' })),
      );
      for (const duplicate of duplicates) {
        expect(duplicate.status).toBe(409);
        expect(duplicate.json).toMatchObject({ code: 'IDEMPOTENCY_KEY_IN_FLIGHT' });
      }
    } finally {
      release();
    }
    expect((await running)?.status).toBe(200);
    const after = await rpc(2, caller.key, 2, { 'idempotency-key': 'scale-inflight-1' });
    expect(after.headers.get('idempotent-replayed')).toBe('true');
    // Two calls reached the node and two were charged, whatever the number of copies sent.
    expect(solana.requests.length).toBe(before + 2);
    await expectSound();
    const charges = (await createLedger(database).listEntries(caller.accountId)).filter(
      (e) => e.type === 'CHARGE',
    );
    expect(charges).toHaveLength(2);
  });

  test('behavior: one Sign-In-With-X message sent 9 times over 3 instances is accepted exactly once', async () => {
    const wallet = privateKeyToAccount(generatePrivateKey());
    const header = await evmSignIn(wallet, { origin: ORIGIN });
    const results = await Promise.all(
      Array.from({ length: 9 }, async (_, i) => {
        sent++;
        const r = await fetch(`${base(i)}/x402/balance/${wallet.address}`, {
          headers: { 'SIGN-IN-WITH-X': header },
        });
        return { status: r.status, json: (await r.json()) as Json };
      }),
    );
    expect(results.filter((r) => r.status === 200)).toHaveLength(1);
    expect(results.filter((r) => r.json?.code === 'X402_SIGN_IN_NONCE_REUSED')).toHaveLength(8);
  });

  test('behavior: 6 video jobs queued over 3 instances, each instance running its worker: every job is worked once', {
    timeout: 180_000,
  }, async () => {
    const caller = await newAccount('20', 'video');
    const queued: Array<{ queue_id: string; model: string }> = [];
    for (let i = 0; i < 6; i++) {
      const r = await post(
        i,
        '/video/queue',
        {
          model: 'wan-2-7-text-to-video',
          prompt: `harbour ${i}`,
          duration: '5s',
          resolution: '480p',
          audio: false,
        },
        { authorization: `Bearer ${caller.key}` },
      );
      expect(r.status).toBe(200);
      queued.push(r.json);
    }
    const jobs = createVideoJobs(database);
    const deadline = Date.now() + 150_000;
    for (const job of queued) {
      for (;;) {
        const stored = await jobs.get(job.queue_id);
        if (stored?.status === 'completed' || stored?.status === 'failed') break;
        if (Date.now() > deadline) throw new Error(`job ${job.queue_id} never finished: ${stored?.status}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    for (const job of queued)
      expect(await jobs.get(job.queue_id)).toMatchObject({ status: 'completed', attempts: 1 });
    // Any instance serves any job's video.
    const fetched = await post(4, '/video/retrieve', queued[0], { authorization: `Bearer ${caller.key}` });
    expect(fetched.headers.get('content-type')).toBe('video/mp4');
    // One charge per job.
    const charged = new Set(
      (await createLedger(database).listEntries(caller.accountId))
        .filter((e) => e.type === 'CHARGE')
        .map((e) => e.requestId),
    );
    expect(charged.size).toBe(6);
    await expectSound();
  });

  test('behavior: one x402 payment sent to all three instances at once is settled and credited once', async () => {
    const payer = privateKeyToAccount(generatePrivateKey());
    await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], payer.address, 20_000_000n);
    const offer = await post(0, '/x402/top-up', { amountUsd: 6 }, {});
    expect(offer.status).toBe(402);
    const header = await evmPaymentHeader(offer.json, payer);
    // The same signed payment to all three instances at once.
    const results = await Promise.all(
      [0, 1, 2].map((i) => post(i, '/x402/top-up', { amountUsd: 6 }, { 'PAYMENT-SIGNATURE': header })),
    );
    expect(results.map((r) => r.status).sort(), JSON.stringify(results.map((r) => r.json))).toEqual([
      200, 409, 409,
    ]);
    for (const refused of results.filter((r) => r.status === 409)) {
      expect(['PAYMENT_IN_PROGRESS', 'PAYMENT_ALREADY_SETTLED']).toContain(refused.json?.code);
    }
    // A later replay is refused too.
    const replay = await post(0, '/x402/top-up', { amountUsd: 6 }, { 'PAYMENT-SIGNATURE': header });
    expect(replay.status).toBe(409);
    const wallet = await createAccounts(database).findWalletAccount(payer.address);
    const entries = wallet ? await createLedger(database).listEntries(wallet.id) : [];
    expect(entries.map((e) => [e.type, e.amountNano])).toEqual([['TOP_UP', 6_000_000_000n]]);
    expect(await usdcBalance(anvil.url, payer.address)).toBe(14_000_000n);
    expect(await usdcBalance(anvil.url, PAY_TO)).toBe(6_000_000n);
    await expectSound();
  });

  test('behavior: nothing lost: every balance equals its ledger, no reservation held, all three instances still up', async () => {
    const report = await expectSound();
    expect(report.reservations.held).toBe(0);
    expect(report.reservations.captured).toBeGreaterThan(0);
    for (const instance of instances) {
      const r = await fetch(`${instance.origin}/healthz`);
      expect(r.status).toBe(200);
    }
    console.info(
      `scale-out figures: ${instances.length} instances, ${sent} requests, ${report.accounts} accounts, ` +
        `${report.entries} ledger entries, reservations ${JSON.stringify(report.reservations)}, 0 violations`,
    );
  });
});
