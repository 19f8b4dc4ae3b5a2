/**
 * The documented 429s, produced for real through the validating typed client (test/support/client-validation.ts):
 * a server whose catalogue allows each caller ONE request a day per model (an override of every shipped model's
 * tier limits), one JSON-RPC call a minute, and the shipped 600 management requests a minute per caller. Each
 * operation is called until the limiter refuses it (a window that rolls over between two calls only costs a
 * retry); the refusal must be the documented 429 with its headers.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import type { ServiceClient } from '../../client/index.ts';
import { DEFAULT_CATALOG_PATH } from '../../server/catalog/load.ts';
import { type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { contractValidation, sendOperation, validatingClient } from '../support/client-validation.ts';
import {
  exampleJsonBody,
  exampleParams,
  listOperations,
  loadBundle,
  type Operation,
} from '../support/contract.ts';
import { type StartedServer, startServer } from '../support/server.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const ORIGIN = 'https://api.example.test';
const MANAGEMENT_PER_MINUTE = 600;
const doc = loadBundle();
const operations = listOperations(doc);
const validation = contractValidation(doc);
const scratch = mkdtempSync(join(tmpdir(), 'client-rate-limits-'));
let anvil: StartedAnvil;
let server: StartedServer;

beforeAll(async () => {
  anvil = await startAnvil();
  const shipped = parse(readFileSync(DEFAULT_CATALOG_PATH, 'utf8')) as {
    models: Record<string, Record<string, unknown>>;
  };
  const oneADay = { requestsPerMinute: 1000, requestsPerDay: 1 };
  const models = Object.fromEntries(
    Object.entries(shipped.models).map(([id, model]) => [
      id,
      { ...model, rateLimits: { paid: oneADay, partner: oneADay } },
    ]),
  );
  const catalog = join(scratch, 'catalog.yaml');
  writeFileSync(catalog, stringify({ models }));
  server = await startServer(
    `sqlite:${join(scratch, 'limits.db')}`,
    {
      PUBLIC_ORIGIN: ORIGIN,
      SERVICE_CONFIG: catalog,
      RPC_UPSTREAM_BASE_MAINNET: anvil.url,
      RPC_REQUESTS_PER_MINUTE: '1',
      X402_PAY_TO_BASE: privateKeyToAccount(generatePrivateKey()).address,
    },
    { proxy: false },
  );
}, 120_000);

afterAll(async () => {
  await server?.close();
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

type Init = { params?: Record<string, Record<string, unknown>>; body?: unknown; parseAs?: 'blob' };

function send(client: ServiceClient, op: Operation, init: Init): Promise<number> {
  return sendOperation(client, op, init).then((sent) => sent.response.status);
}

function exampleInit(op: Operation): Init {
  const params = exampleParams(doc, op);
  const body = exampleJsonBody(doc, op);
  return {
    params,
    ...(body === undefined ? {} : { body }),
    ...(['createSpeech', 'retrieveVideo'].includes(op.operationId) ? { parseAs: 'blob' as const } : {}),
  };
}

/** Calls until a 429 (at most `tries` times, so a window rolling over between calls cannot fail the test). */
async function untilRefused(call: () => Promise<number>, tries = 3): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < tries && statuses.at(-1) !== 429; i++) statuses.push(await call());
  return statuses;
}

const documents429 = (op: Operation) => Boolean(op.responses['429']);
/** Operations whose example request names a model: counted in that model's limits, not the management window. */
const takesModel = (op: Operation) =>
  Boolean((exampleInit(op).body as { model?: unknown } | undefined)?.model) &&
  !['retrieveVideo', 'completeVideo'].includes(op.operationId);

// Hundreds of real requests per test: generous bounds for a loaded machine (nothing here is timed).
describe('429 through the validating typed client', { timeout: 240_000 }, () => {
  test('behavior: every operation priced per model is refused once its model allows no more requests today', async () => {
    const { key } = await newKey();
    const client = validatingClient({ baseUrl: server.directBase, apiKey: key }, validation);
    const refused: string[] = [];
    for (const op of operations.filter((o) => documents429(o) && takesModel(o))) {
      const statuses = await untilRefused(() => send(client, op, exampleInit(op)));
      if (statuses.at(-1) === 429) refused.push(op.operationId);
    }
    const form = () => {
      const f = new FormData();
      f.append('model', 'openai/whisper-large-v3');
      f.append('file', new Blob([new Uint8Array(64)], { type: 'audio/wav' }), 'a.wav');
      return f;
    };
    const transcription = await untilRefused(async () => {
      const sent = await client.POST('/audio/transcriptions', {
        body: form() as never,
        bodySerializer: (body: unknown) => body as FormData,
      });
      return sent.response.status;
    });
    if (transcription.at(-1) === 429) refused.push('createTranscription');
    const expected = [
      ...operations.filter((o) => documents429(o) && takesModel(o)).map((o) => o.operationId),
      'createTranscription',
    ];
    expect(refused).toEqual(expected);
    expect(refused.length).toBeGreaterThanOrEqual(8);
  });

  test('behavior: a JSON-RPC call over the per-minute cap is refused', async () => {
    const { key } = await newKey();
    const client = validatingClient({ baseUrl: server.directBase, apiKey: key }, validation);
    const rpc = operations.find((o) => o.operationId === 'callCryptoRpc') as Operation;
    const statuses = await untilRefused(() => send(client, rpc, exampleInit(rpc)));
    expect(statuses.at(-1)).toBe(429);
  });

  test('behavior: every key-management, billing and listing operation is refused past 600 requests a minute', async () => {
    const management = operations.filter(
      (o) =>
        documents429(o) &&
        !takesModel(o) &&
        o.operationId !== 'callCryptoRpc' &&
        o.operationId !== 'createTranscription' &&
        o.security.some((r) => 'BearerAuth' in r),
    );
    const { key } = await newKey('ADMIN');
    const client = validatingClient({ baseUrl: server.directBase, apiKey: key }, validation);
    const refused: string[] = [];
    for (const op of management) {
      const statuses = await untilRefused(async () => {
        await fill(key);
        return send(client, op, exampleInit(op));
      });
      if (statuses.at(-1) === 429) refused.push(op.operationId);
    }
    expect(refused).toEqual(management.map((o) => o.operationId));
    expect(refused.length).toBeGreaterThan(15);
  });

  test('behavior: a wallet reading its balance and transactions is refused past 600 requests a minute', async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    const wallet = validatingClient(
      { baseUrl: server.directBase, signInWithX: () => evmSignIn(account, { origin: ORIGIN }) },
      validation,
    );
    const path = { walletAddress: account.address };
    const refused: string[] = [];
    for (const op of ['/x402/balance/{walletAddress}', '/x402/transactions/{walletAddress}'] as const) {
      const statuses = await untilRefused(async () => {
        // The wallet's management window fills with cheap signed reads.
        for (let i = 0; i < MANAGEMENT_PER_MINUTE; i++) {
          const response = await fetch(`${server.directBase}/x402/balance/${account.address}`, {
            headers: { 'SIGN-IN-WITH-X': await evmSignIn(account, { origin: ORIGIN }) },
          });
          await response.arrayBuffer();
          if (response.status === 429) break;
        }
        return (await wallet.GET(op, { params: { path } })).response.status;
      });
      if (statuses.at(-1) === 429) refused.push(op);
    }
    expect(refused).toHaveLength(2);
  });
});

async function newKey(type: 'INFERENCE' | 'ADMIN' = 'INFERENCE') {
  if (!('accountId' in server.boot)) throw new Error('bootstrap made no account');
  const created = await server.services.keys.create({ accountId: server.boot.accountId, keyType: type });
  return { key: created.secret };
}

/** Spends the caller's management window with cheap reads (plain fetch: these are fillers, not coverage). */
async function fill(key: string): Promise<void> {
  for (let i = 0; i < MANAGEMENT_PER_MINUTE; i++) {
    const response = await fetch(`${server.directBase}/api_keys/rate_limits`, {
      headers: { authorization: `Bearer ${key}` },
    });
    await response.arrayBuffer();
    if (response.status === 429) return;
  }
}
