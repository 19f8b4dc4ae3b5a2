/**
 * Faults of the database and of the server process itself, on real processes: a server (`server/main.ts`) on
 * an embedded PostgreSQL that is shut down and started again under load, and a server killed with SIGKILL
 * under load and started again. Requests fail cleanly (a documented 5xx with the `{error}` body, never a hang),
 * the service recovers without a restart, and nothing is half-written: every balance equals its ledger and
 * every reservation ends captured, released or expired by the sweep (`checkInvariants`).
 * Upstream faults (chat and RPC nodes down, slow, truncating, answering garbage) are in `faults-upstream.test.ts`.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse } from 'yaml';
import { parseUsdToNano } from '../../server/money.ts';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { repoRoot } from '../support/contract.ts';
import { checkInvariants, checkSettledInvariants } from '../support/invariants.ts';
import { type StartedPostgres, startPostgres } from '../support/postgres.ts';
import { isAlive } from '../support/process.ts';
import { type RpcStandIn, startRpcStandIn } from '../support/rpc-upstream.ts';
import { type ServerProcess, startServerProcess, stopServerProcesses } from '../support/server-process.ts';

const ADMIN = 'svc_admin_fault_tests_secret_0123456789abcd';
/** No request may take longer than this; one that does counts as a hang. */
const HANG_MS = 20_000;

/** One PostgreSQL server per test: the outage test takes its own down. */
const servers: StartedPostgres[] = [];
let solana: RpcStandIn;
const opened: Database[] = [];

beforeAll(async () => {
  solana = await startRpcStandIn('solana');
}, 120_000);
afterAll(async () => {
  await stopServerProcesses();
  for (const database of opened) await database.close();
  for (const postgres of servers) await postgres.stop();
  await solana?.close();
}, 120_000);

async function setUp(name: string) {
  const postgres = await startPostgres();
  servers.push(postgres);
  const url = await postgres.createDatabase(name);
  const database = await createDatabase(url);
  opened.push(database);
  await migrate(database);
  const account = await createAccounts(database).createApiAccount({ name });
  await createLedger(database).topUp({ accountId: account.id, amountNano: parseUsdToNano('50') });
  const { secret } = await createApiKeys(database).create({ accountId: account.id, keyType: 'INFERENCE' });
  const env = {
    DATABASE_URL: url,
    ADMIN_API_KEY: ADMIN,
    RPC_UPSTREAM_SOLANA_MAINNET: solana.url,
    RPC_REQUESTS_PER_MINUTE: '100000',
    RPC_PRICE_PER_CREDIT_USD: '0.0001',
    RESERVATION_TTL_MS: '1000',
    LOCAL_CHAT_TOKEN_DELAY_MS: '2',
  };
  return { postgres, url, database, key: secret, accountId: account.id, env };
}

/** The statuses the contract documents for each operation of the load. */
const spec = parse(readFileSync(join(repoRoot, 'generated/openapi.yaml'), 'utf8')) as {
  paths: Record<string, Record<string, { responses: Record<string, unknown> }>>;
};
const documented = (path: string, method: string) => Object.keys(spec.paths[path]?.[method]?.responses ?? {});
const OPERATIONS: Record<string, { path: string; method: string }> = {
  rpc: { path: '/crypto/rpc/{network}', method: 'post' },
  chat: { path: '/chat/completions', method: 'post' },
  balance: { path: '/billing/balance', method: 'get' },
};

type Outcome = { op: string; status: number; body: string } | { op: string; error: string };

/** One request of the mixed load: a charged RPC call, a chat completion, or a balance read. */
async function one(server: ServerProcess, key: string, i: number): Promise<Outcome> {
  const kind = i % 3;
  const op = ['rpc', 'chat', 'balance'][kind] ?? 'rpc';
  const init: RequestInit =
    kind === 0
      ? {
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: JSON.stringify({ jsonrpc: '2.0', id: i, method: 'getSlot' }),
        }
      : kind === 1
        ? {
            method: 'POST',
            headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
            body: JSON.stringify({
              model: 'llama-3.3-70b',
              max_tokens: 16,
              messages: [{ role: 'user', content: `Count to ${i % 9}` }],
            }),
          }
        : { headers: { authorization: `Bearer ${ADMIN}` } };
  const path = ['/crypto/rpc/solana-mainnet', '/chat/completions', '/billing/balance'][kind];
  try {
    const response = await fetch(`${server.base}${path}`, { ...init, signal: AbortSignal.timeout(HANG_MS) });
    return { op, status: response.status, body: await response.text() };
  } catch (error) {
    return { op, error: error instanceof Error ? `${error.name}: ${error.message}` : String(error) };
  }
}

/** `clients` loops of requests until `stop()`; returns every outcome, in order per client. */
function load(server: ServerProcess, key: string, clients: number) {
  let running = true;
  const outcomes: Outcome[] = [];
  let n = 0;
  const loops = Array.from({ length: clients }, async () => {
    while (running) {
      outcomes.push(await one(server, key, n++));
      await new Promise((r) => setTimeout(r, 20));
    }
  });
  return {
    outcomes,
    async stop() {
      running = false;
      await Promise.all(loops);
      return outcomes;
    },
  };
}

const isError = (o: Outcome) => 'status' in o && o.status >= 500;
const isOk = (o: Outcome) => 'status' in o && o.status === 200;

async function waitUntil(
  condition: () => Promise<boolean> | boolean,
  timeoutMs: number,
  what: string,
  context: () => unknown = () => '',
) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(context())}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const heldCount = async (database: Database, modelId?: string) => {
  let query = database.db.selectFrom('reservations').select('id').where('status', '=', 'held');
  if (modelId) query = query.where('model_id', '=', modelId);
  return (await query.execute()).length;
};

describe('faults: the database and the process', () => {
  test('behavior: PostgreSQL shut down and started again under load: clean 5xx, no hang, recovery without a restart, nothing half-written', {
    timeout: 240_000,
  }, async () => {
    const { postgres, database, key, env } = await setUp('outage');
    const server = await startServerProcess(env);
    const traffic = load(server, key, 4);
    await waitUntil(() => traffic.outcomes.filter(isOk).length >= 12, 60_000, 'traffic before the outage');

    await postgres.shutdown();
    const outageStart = traffic.outcomes.length;
    await waitUntil(
      () => traffic.outcomes.slice(outageStart).filter(isError).length >= 12,
      60_000,
      'failures',
      () =>
        traffic.outcomes
          .slice(outageStart)
          .map((o) => ('status' in o ? `${o.op} ${o.status} ${o.body.slice(0, 80)}` : o)),
    );
    const ready = await fetch(`${server.origin}/readyz`);
    expect(ready.status).toBe(503);
    expect(await ready.json()).toMatchObject({ status: 'unavailable' });

    await postgres.startAgain();
    const restartAt = traffic.outcomes.length;
    // Recovery: every kind of request succeeds again, on the same server process.
    await waitUntil(
      () => {
        const after = traffic.outcomes.slice(restartAt).filter(isOk);
        return ['rpc', 'chat', 'balance'].every((op) => after.filter((o) => o.op === op).length >= 3);
      },
      60_000,
      'recovery',
    );
    const outcomes = await traffic.stop();
    expect(isAlive(server.pid)).toBe(true);
    expect((await fetch(`${server.origin}/readyz`)).status).toBe(200);

    // Never a hang or a dropped connection; every failure is a 500/503 with the interface's error body.
    expect(outcomes.filter((o) => 'error' in o)).toEqual([]);
    const failures = outcomes.filter(isError) as Array<{ op: string; status: number; body: string }>;
    expect(failures.length).toBeGreaterThanOrEqual(12);
    for (const failure of failures) {
      expect([500, 503]).toContain(failure.status);
      const op = OPERATIONS[failure.op] ?? { path: '', method: '' };
      expect(documented(op.path, op.method)).toContain(String(failure.status));
      expect(typeof (JSON.parse(failure.body) as { error?: unknown }).error).toBe('string');
    }
    // Anything else is a success (nothing was refused for a wrong reason).
    expect(outcomes.filter((o) => !isOk(o) && !isError(o))).toEqual([]);

    // Reservations caught by the outage between reserve and capture are released by the sweep.
    await new Promise((r) => setTimeout(r, 1_100));
    await createLedger(database).expireReservations();
    const report = await checkInvariants(database);
    expect(report.violations).toEqual([]);
    expect(report.reservations.held).toBe(0);
    console.info(
      `database outage figures: ${outcomes.length} requests, ${failures.length} failed cleanly (5xx), ` +
        `${outcomes.filter(isOk).length} succeeded, reservations ${JSON.stringify(report.reservations)}, 0 violations`,
    );
  });

  test('behavior: a server killed with SIGKILL under load and started again: every reservation ends captured, released or expired; balances equal their ledgers', {
    timeout: 240_000,
  }, async () => {
    const { database, key, env } = await setUp('sigkill');
    const first = await startServerProcess(env);
    const traffic = load(first, key, 4);
    await waitUntil(() => traffic.outcomes.filter(isOk).length >= 9, 60_000, 'traffic before the kill');
    // Hold the node's answers, so that RPC calls sit between reserve and capture when the process dies.
    const release = solana.hold();
    try {
      // RPC calls waiting for the held node: their reservations cannot settle before the kill.
      await waitUntil(
        async () => (await heldCount(database, 'solana-mainnet')) >= 2,
        60_000,
        'reservations in flight',
      );
      process.kill(first.pid, 'SIGKILL');
      expect(await first.exited).toBeNull();
    } finally {
      release();
    }
    const beforeRestart = await traffic.stop();
    const orphaned = await heldCount(database);
    expect(orphaned).toBeGreaterThanOrEqual(2);
    // The invariants hold even with the orphans (they are held, not half-written).
    expect((await checkInvariants(database, { allowHeld: true })).violations).toEqual([]);

    // The restarted server's start-up sweep expires what the dead one left held (their TTL has passed).
    await new Promise((r) => setTimeout(r, 1_100));
    const second = await startServerProcess(env);
    await waitUntil(async () => (await heldCount(database)) === 0, 30_000, 'the sweep');
    await second.waitForLog((lines) =>
      lines.some((l) => l.msg === 'expired reservations released' && Number(l.released) === orphaned),
    );
    const after = load(second, key, 2);
    await waitUntil(() => after.outcomes.filter(isOk).length >= 6, 60_000, 'traffic after the restart');
    const outcomes = await after.stop();
    expect(outcomes.filter((o) => !isOk(o))).toEqual([]);

    const report = await checkSettledInvariants(database);
    expect(report.violations).toEqual([]);
    expect(report.reservations.held).toBe(0);
    expect(report.reservations.expired).toBe(orphaned);
    console.info(
      `SIGKILL figures: ${beforeRestart.length + outcomes.length} requests, ${orphaned} reservations orphaned by the kill, ` +
        `all expired by the sweep; reservations ${JSON.stringify(report.reservations)}, 0 violations`,
    );
  });
});
