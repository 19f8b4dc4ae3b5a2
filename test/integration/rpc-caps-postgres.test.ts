/**
 * The JSON-RPC caps are exact across server instances: two instances share one PostgreSQL database, and a
 * burst of concurrent calls from one caller, spread over both, is admitted exactly up to the per-minute and
 * the rolling 24-hour credit caps.
 */
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createApp } from '../../server/app.ts';
import { bootstrap } from '../../server/bootstrap.ts';
import { loadConfig } from '../../server/config.ts';
import { createServices, type Services } from '../../server/services.ts';
import { awayFromMinuteEdge } from '../support/clock.ts';
import { withCoverage } from '../support/coverage.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';
import { type RpcStandIn, startRpcStandIn } from '../support/rpc-upstream.ts';

const ADMIN = 'svc_admin_bootstrap_secret_for_rpc_pg_tests_0123';

const postgres = postgresPerFile();
let solana: RpcStandIn;
const instances: Array<{ services: Services; base: string; close(): Promise<void> }> = [];

async function startInstance(databaseUrl: string, env: Record<string, string>) {
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: databaseUrl,
    ADMIN_API_KEY: ADMIN,
    RPC_UPSTREAM_SOLANA_MAINNET: solana.url,
    ...env,
  });
  const services = await createServices(config, pino({ level: 'silent' }));
  await bootstrap(services, { adminApiKey: ADMIN, bootstrapBalanceUsd: '10' });
  const server = createApp(withCoverage(services.app)).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const instance = {
    services,
    base: `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await services.close();
    },
  };
  instances.push(instance);
  return instance;
}

beforeAll(async () => {
  solana = await startRpcStandIn('solana');
});

afterAll(async () => {
  for (const instance of instances) await instance.close();
  await solana?.close();
});

const burst = (bases: string[], count: number) =>
  Promise.all(
    Array.from({ length: count }, (_, i) =>
      fetch(`${bases[i % bases.length]}/crypto/rpc/solana-mainnet`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ jsonrpc: '2.0', id: i, method: 'getSlot' }),
      }).then(async (r) => ({ status: r.status, body: await r.text() })),
    ),
  );

describe('RPC caps on PostgreSQL shared by two instances', () => {
  test('behavior: the rolling 24-hour credit cap admits exactly what fits', async () => {
    const url = await postgres().createDatabase('rpc_credit_cap');
    // 10 calls of 30 credits fit in 300; the per-minute cap is out of the way.
    const env = { RPC_CREDITS_PER_DAY: '300', RPC_REQUESTS_PER_MINUTE: '1000' };
    const a = await startInstance(url, env);
    const b = await startInstance(url, env);
    const results = await burst([a.base, b.base], 24);
    expect(results.filter((r) => r.status === 200)).toHaveLength(10);
    const refused = results.filter((r) => r.status === 429);
    expect(refused).toHaveLength(14);
    expect(JSON.parse(refused[0]?.body ?? '{}')).toMatchObject({ code: 'RPC_CREDIT_CAP_EXCEEDED' });
  });

  test('behavior: the per-minute request cap admits exactly the limit', async () => {
    const url = await postgres().createDatabase('rpc_minute_cap');
    const env = { RPC_REQUESTS_PER_MINUTE: '7' };
    await awayFromMinuteEdge();
    const a = await startInstance(url, env);
    const b = await startInstance(url, env);
    const results = await burst([a.base, b.base], 16);
    expect(results.filter((r) => r.status === 200)).toHaveLength(7);
    expect(results.filter((r) => r.status === 429)).toHaveLength(9);
  });
});
