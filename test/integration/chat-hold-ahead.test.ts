/**
 * With CHAT_CALL_BEFORE_HOLD, a chat served by upstreams alone makes its reservation at the upstream call:
 * before it, or, when the hold is as good as certain (Charges.holdsAhead), while the call is on its way.
 * Nothing is handed on or charged before the hold is made; a hold refused after its call left cancels the call
 * and is refused as the hold made first is; a hold that covers only a lower bound makes the call again with
 * that bound. On both engines, against a loopback upstream that records every call it gets and whether its
 * caller hung up before the answer. Without the setting (the default) no call leaves before its hold. And the
 * judgement itself, on a real ledger.
 */
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { readSseEvents } from '../../client/sse.ts';
import { AHEAD_MARGIN, AHEAD_TTL_MS, createCharges } from '../../server/domains/billing/charges.ts';
import type { ApiKeyPrincipal } from '../../server/http/auth.ts';
import { createAccounts } from '../../server/storage/accounts.ts';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase, type Database } from '../../server/storage/database.ts';
import { heldReservationsOf } from '../../server/storage/held-reservations.ts';
import { createLedger } from '../../server/storage/ledger.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';
import { checkInvariants } from '../support/invariants.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';

const USD = 1_000_000_000n;

// ---------------------------------------------------------------------------------------------------------
// The loopback upstream: `quick` answers at once, `slow` after SLOW_MS (time for a cancel to arrive first).

const SLOW_MS = 400;
type Call = { name: string; maxTokens: unknown; hungUp: boolean; answered: boolean };
const calls: Call[] = [];
const timers = new Set<NodeJS.Timeout>();

const frame = (payload: unknown) => `data: ${JSON.stringify(payload)}\n\n`;
const ANSWER = [
  frame({
    id: 'x',
    object: 'chat.completion.chunk',
    created: 1,
    model: 'm',
    choices: [{ index: 0, delta: { content: 'Hello there' }, finish_reason: null }],
  }),
  frame({
    id: 'x',
    object: 'chat.completion.chunk',
    created: 1,
    model: 'm',
    choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
  }),
  frame({
    id: 'x',
    object: 'chat.completion.chunk',
    created: 1,
    model: 'm',
    choices: [],
    usage: { prompt_tokens: 30, completion_tokens: 4, total_tokens: 34 },
  }),
  'data: [DONE]\n\n',
].join('');

function route(req: IncomingMessage, res: ServerResponse) {
  const [, name = ''] = (req.url ?? '').split('/');
  let text = '';
  req.setEncoding('utf8');
  req.on('data', (part: string) => {
    text += part;
  });
  req.on('end', () => {
    const call: Call = {
      name,
      maxTokens: (JSON.parse(text) as { max_completion_tokens?: unknown }).max_completion_tokens,
      hungUp: false,
      answered: false,
    };
    calls.push(call);
    res.on('close', () => {
      if (!res.writableFinished) call.hungUp = true;
    });
    const answer = () => {
      if (res.destroyed) return;
      call.answered = true;
      res.writeHead(200, { 'content-type': 'text/event-stream' }).end(ANSWER);
    };
    if (name !== 'slow') return answer();
    const timer = setTimeout(() => {
      timers.delete(timer);
      answer();
    }, SLOW_MS);
    timers.add(timer);
  });
}

const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};
const llama = defaults.models['llama-3.3-70b'] as Record<string, unknown>;

function catalog(base: string): string {
  const up = (name: string) => ({ kind: 'openai-compatible', name, baseUrl: `${base}/${name}/v1` });
  return stringify({
    models: {
      'quick-model': { ...llama, provider: up('quick'), maxConcurrency: 32 },
      'slow-model': { ...llama, provider: up('slow'), maxConcurrency: 32 },
    },
  });
}

let upstream: Server;
let upstreamBase = '';
const postgres = postgresPerFile();

beforeAll(async () => {
  upstream = createServer(route).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => upstream.once('listening', () => resolve()));
  upstreamBase = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
}, 120_000);

afterAll(async () => {
  for (const timer of timers) clearTimeout(timer);
  upstream?.closeAllConnections();
  await new Promise<void>((resolve) => (upstream ? upstream.close(() => resolve()) : resolve()));
});

const USER = [{ role: 'user' as const, content: 'Tell me about rivers and mountains.' }];

function chat(server: ChatServer, key: string, body: Record<string, unknown>) {
  return fetch(`${server.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ messages: USER, max_tokens: 64, ...body }),
  });
}

/** The text an answer carries, streamed or not. */
async function answerOf(response: Response, streamed: boolean): Promise<string> {
  if (!streamed)
    return ((await response.json()) as { choices: { message: { content: string } }[] }).choices[0]?.message
      .content as string;
  let text = '';
  for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>)) {
    if (event.data === '[DONE]') break;
    const delta = (JSON.parse(event.data) as { choices?: { delta?: { content?: string } }[] }).choices?.[0]
      ?.delta?.content;
    text += delta ?? '';
  }
  return text;
}

async function until(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !ok(); i++) await new Promise((resolve) => setTimeout(resolve, 25));
}

/** Holds all but `leftNano` of what the account can hold, with a hold the judgement did not make. */
async function drain(server: ChatServer, accountId: string, leftNano: bigint, requestId: string) {
  const balance = await server.services.ledger.getBalance(accountId);
  return server.services.ledger.reserve({
    accountId,
    amountNano: balance.usdAvailableNano - leftNano,
    requestId,
    ttlMs: 60_000,
  });
}

/**
 * `drain`, made right before the next hold of the server's ledger: after the judgement, as a writer elsewhere
 * committing between a judgement and its hold would (the only way the judgement can be wrong on SQLite).
 */
function drainAtNextHold(server: ChatServer, accountId: string, leftNano: bigint, requestId: string) {
  const ledger = server.services.ledger;
  const reserve = ledger.reserve;
  let drained!: (reserved: Awaited<ReturnType<typeof drain>>) => void;
  const made = new Promise<Awaited<ReturnType<typeof drain>>>((resolve) => {
    drained = resolve;
  });
  ledger.reserve = async (input) => {
    ledger.reserve = reserve;
    drained(await drain(server, accountId, leftNano, requestId));
    return reserve(input);
  };
  return made;
}

/** A streamed and a non-streamed request of the slow model, each refused with a 402, and no upstream called. */
async function refusedCallingNobody(server: ChatServer, key: string): Promise<void> {
  calls.length = 0;
  for (const stream of [true, false]) {
    const refused = await chat(server, key, { model: 'slow-model', stream });
    expect(refused.status).toBe(402);
    await refused.text();
  }
  expect(calls).toEqual([]);
}

const engines: Array<[string, () => Promise<string | undefined>]> = [
  ['SQLite', async () => undefined],
  [
    'PostgreSQL',
    async () => postgres().createDatabase(`ahead_${Date.now()}_${Math.random().toString(36).slice(2, 8)}`),
  ],
];

describe.each(engines)('a chat through upstreams on %s', (engine, databaseUrl) => {
  let server: ChatServer;

  beforeAll(async () => {
    const url = await databaseUrl();
    server = await startChatServer({
      catalogYaml: catalog(upstreamBase),
      env: { UPSTREAM_TIMEOUT_MS: '5000', CHAT_CALL_BEFORE_HOLD: 'true' },
      ...(url ? { databaseUrl: url } : {}),
    });
  }, 60_000);

  afterAll(async () => {
    await server?.close();
  });

  beforeEach(() => {
    calls.length = 0;
  });

  const principalOf = (accountId: string, keyId: string): ApiKeyPrincipal => ({
    kind: 'apiKey',
    accountId,
    keyId,
    keyType: 'INFERENCE',
  });

  /** What the account was charged (its CHARGE entries), once the captures the answers did not wait for are in. */
  async function charged(accountId: string): Promise<bigint[]> {
    await server.services.charges.idle();
    const entries = await server.services.ledger.listEntries(accountId, { limit: 1000 });
    return entries.filter((e) => e.type === 'CHARGE').map((e) => e.amountNano);
  }

  /**
   * One answered request of the account, so that its latest reservation tells the judgement what it has left;
   * then what the account was charged.
   */
  async function prime(key: string, accountId: string): Promise<bigint[]> {
    const primed = await chat(server, key, { model: 'quick-model' });
    expect(primed.status).toBe(200);
    await primed.text();
    return charged(accountId);
  }

  /** The account's held reservations: in their rows, and (SQLite, one process) in memory. */
  async function heldReservations(accountId: string) {
    const { database } = server.services;
    const rows = await database.db
      .selectFrom('reservations')
      .select(['request_id', 'usd_nano'])
      .where('account_id', '=', accountId)
      .where('status', '=', 'held')
      .execute();
    const inMemory = heldReservationsOf(database)
      .list()
      .filter((held) => held.accountId === accountId)
      .map((held) => ({ request_id: held.requestId, usd_nano: held.usdNano }));
    return [...rows, ...inMemory];
  }

  test('behavior: the second request of an account holds while its call is on its way, and is billed as the first', async () => {
    const { accountId, key, keyId } = await server.account('20');
    const principal = principalOf(accountId, keyId);
    expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(false);
    for (const stream of [false, true]) {
      const first = await chat(server, key, { model: 'quick-model', stream });
      expect(first.status).toBe(200);
      const firstText = await answerOf(first, stream);
      expect(firstText).toBe('Hello there');
      // The first reservation told the judgement what the account has left.
      expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(true);
      const second = await chat(server, key, { model: 'quick-model', stream });
      expect(second.status).toBe(200);
      expect(await answerOf(second, stream)).toBe(firstText);
    }
    const amounts = await charged(accountId);
    // Four answers of the same usage: the same two charges (input, output) each time.
    expect(amounts).toHaveLength(8);
    expect(new Set(amounts.map(String)).size).toBe(2);
    expect(await heldReservations(accountId)).toEqual([]);
    expect(calls.filter((c) => c.hungUp)).toEqual([]);
    expect((await checkInvariants(server.services.database)).violations).toEqual([]);
  });

  test('behavior: a hold refused after its call left cancels the call and answers the 402 a hold made first answers; nothing is charged or held', async () => {
    const { accountId, key, keyId } = await server.account('20');
    const principal = principalOf(accountId, keyId);
    for (const stream of [true, false]) {
      const before = await prime(key, accountId);
      // Nearly everything held elsewhere between the judgement, which says yes, and the hold.
      expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(true);
      const draining = drainAtNextHold(server, accountId, 1n, `drain-${stream}`);
      calls.length = 0;

      const ahead = await chat(server, key, { model: 'slow-model', stream });
      expect(ahead.status).toBe(402);
      const aheadBody = await ahead.json();
      // The call had left, and was hung up on before its answer; counted as cancelled, not as failed.
      await until(() => calls.length === 1 && calls[0]?.hungUp === true);
      expect(calls).toMatchObject([{ name: 'slow', hungUp: true, answered: false }]);
      const metrics = await server.services.app.metrics.render();
      expect(metrics).toContain('upstream="chat:slow:cancelled"');
      expect(metrics).not.toContain('upstream="chat:slow:failed"');

      // The refusal made the judgement forget the account: the next request holds first, and calls nobody.
      expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(false);
      const first = await chat(server, key, { model: 'slow-model', stream });
      expect(first.status).toBe(402);
      expect(await first.json()).toEqual(aheadBody);
      expect(calls).toHaveLength(1);

      const drained = await draining;
      expect(await charged(accountId)).toEqual(before);
      expect(await heldReservations(accountId)).toEqual([
        { request_id: `drain-${stream}`, usd_nano: drained.reservation.usdNano },
      ]);
      await server.services.ledger.release(drained.reservation.id);
    }
    expect((await checkInvariants(server.services.database)).violations).toEqual([]);
  });

  test('behavior: on SQLite the judgement sees a hold it did not make and another process’s commit: the next hold is made first, and a refused one calls nobody', async () => {
    const { accountId, key, keyId } = await server.account('20');
    const principal = principalOf(accountId, keyId);
    const before = await prime(key, accountId);
    expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(true);
    // A hold made by this process without the judgement (in the server only through Charges; here directly).
    const drained = await drain(server, accountId, 1n, 'drain-seen');
    // PostgreSQL, whose instances each see only their own holds, cannot tell: there it still says yes.
    expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(engine === 'PostgreSQL');
    if (engine === 'PostgreSQL') {
      await server.services.ledger.release(drained.reservation.id);
      return;
    }
    await refusedCallingNobody(server, key);
    await server.services.ledger.release(drained.reservation.id);
    await prime(key, accountId);
    expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(true);
    // Another key of the account: the judgement vouches only for the key of the hold it saw.
    const { key: other } = await server.services.keys.create({ accountId, keyType: 'INFERENCE' });
    expect(server.services.charges.holdsAhead(principalOf(accountId, other.id), USD / 1000n)).toBe(false);
    // Another process writes to the file (the operator CLI, another worker): a top-up, which only adds.
    const elsewhere = await createDatabase(server.services.config.databaseUrl);
    try {
      await createLedger(elsewhere).topUp({ accountId, amountNano: 1n });
    } finally {
      await elsewhere.close();
    }
    expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(false);
    calls.length = 0;
    const held = await chat(server, key, { model: 'quick-model' });
    expect(held.status).toBe(200);
    await held.text();
    // Made first, then the call: the new hold's stamp holds again.
    expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(true);
    expect((await charged(accountId)).length).toBe(before.length * 3);
    expect((await checkInvariants(server.services.database)).violations).toEqual([]);
  });

  test('behavior: an upstream that answers before its hold is refused hands nothing on', async () => {
    const { accountId, key } = await server.account('20');
    for (const stream of [true, false]) {
      const before = await prime(key, accountId);
      const draining = drainAtNextHold(server, accountId, 1n, `drain-quick-${stream}`);
      // The quick upstream answers at once (on PostgreSQL, often before the hold's round trip is back).
      const response = await chat(server, key, { model: 'quick-model', stream });
      const drained = await draining;
      expect(response.status).toBe(402);
      expect(response.headers.get('content-type')).toContain('application/json');
      expect(await response.json()).toMatchObject({ error: expect.stringContaining('Insufficient') });
      expect(await charged(accountId)).toEqual(before);
      await server.services.ledger.release(drained.reservation.id);
    }
    expect((await checkInvariants(server.services.database)).violations).toEqual([]);
  });

  test('behavior: a client that leaves while its call is ahead of its hold stops the call; nothing stays held, and it is billed as a request that held first', async () => {
    const { accountId, key } = await server.account('20');
    for (const stream of [true, false]) {
      const before = await prime(key, accountId);
      calls.length = 0;
      const leaving = new AbortController();
      const response = fetch(`${server.base}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ messages: USER, model: 'slow-model', stream }),
        signal: leaving.signal,
      });
      await until(() => calls.length === 1);
      leaving.abort();
      await expect(response).rejects.toThrow();
      await until(() => calls[0]?.hungUp === true);
      expect(calls).toMatchObject([{ name: 'slow', hungUp: true, answered: false }]);
      // The server learns of the client's leaving on its own time: its release follows.
      for (let i = 0; i < 200 && (await heldReservations(accountId)).length > 0; i++)
        await new Promise((resolve) => setTimeout(resolve, 25));
      expect(await heldReservations(accountId)).toEqual([]);
      // As for any request: a stream gone before its first event is released; a non-streamed request whose
      // client left is billed what was done (its prompt, nothing produced).
      await server.services.charges.idle();
      const entries = await server.services.ledger.listEntries(accountId, { limit: 1000 });
      const added = entries.filter((e) => e.type === 'CHARGE').slice(0, -before.length);
      expect(added.map((e) => e.sku)).toEqual(stream ? [] : ['chat.input_tokens']);
    }
    expect((await checkInvariants(server.services.database)).violations).toEqual([]);
  });

  test('behavior: a hold that covers only a lower bound makes the call again with that bound', async () => {
    const { accountId, key } = await server.account('20');
    const primed = await chat(server, key, { model: 'quick-model', max_tokens: 4000 });
    expect(primed.status).toBe(200);
    await primed.text();
    // What the full bound holds, read from the request that just held it.
    await server.services.charges.idle();
    const [last] = await server.services.database.db
      .selectFrom('reservations')
      .select('usd_nano')
      .where('account_id', '=', accountId)
      .orderBy('created_at_ms', 'desc')
      .limit(1)
      .execute();
    const full = BigInt(last?.usd_nano ?? 0n);
    expect(full).toBeGreaterThan(0n);
    // Half of it left once the judgement has said yes: the full bound no longer fits, a lower one does.
    const draining = drainAtNextHold(server, accountId, full / 2n, 'drain-bound');
    calls.length = 0;

    const response = await chat(server, key, { model: 'slow-model', max_tokens: 4000 });
    const drained = await draining;
    expect(response.status).toBe(200);
    expect(await response.json()).toMatchObject({ choices: [{ message: { content: 'Hello there' } }] });
    // The call made ahead asked for the full bound and was hung up on; the one made again asked for less.
    await until(() => calls.length === 2 && calls[0]?.hungUp === true);
    expect(calls).toMatchObject([
      { name: 'slow', maxTokens: 4000, hungUp: true, answered: false },
      { name: 'slow', hungUp: false, answered: true },
    ]);
    expect(calls[1]?.maxTokens).toBeLessThan(4000);
    expect(calls[1]?.maxTokens).toBeGreaterThan(0);
    await server.services.ledger.release(drained.reservation.id);
    await server.services.charges.idle();
    expect(await heldReservations(accountId)).toEqual([]);
    expect((await checkInvariants(server.services.database)).violations).toEqual([]);
  });
});

describe('without CHAT_CALL_BEFORE_HOLD (the default)', () => {
  test('behavior: every hold is made before the call: a refused one calls nobody, whatever the judgement says', async () => {
    const server = await startChatServer({
      catalogYaml: catalog(upstreamBase),
      env: { UPSTREAM_TIMEOUT_MS: '5000' },
    });
    try {
      const { accountId, key, keyId } = await server.account('20');
      const primed = await chat(server, key, { model: 'quick-model' });
      expect(primed.status).toBe(200);
      await primed.text();
      const principal: ApiKeyPrincipal = { kind: 'apiKey', accountId, keyId, keyType: 'INFERENCE' };
      expect(server.services.charges.holdsAhead(principal, USD / 1000n)).toBe(true);
      // All but a nano-USD held elsewhere right before the next hold, after the judgement.
      void drainAtNextHold(server, accountId, 1n, 'drain-default');
      await refusedCallingNobody(server, key);
    } finally {
      await server.close();
    }
  });
});

describe('the judgement of a hold made ahead (Charges.holdsAhead), on a real ledger', () => {
  let database: Database;
  let clock = 0;

  beforeAll(async () => {
    database = await createDatabase('sqlite::memory:');
    await migrate(database);
  });

  afterAll(async () => {
    await database?.close();
  });

  async function setUp(usd: bigint) {
    const account = await createAccounts(database).createApiAccount({});
    const ledger = createLedger(database);
    await ledger.topUp({ accountId: account.id, amountNano: usd });
    const charges = createCharges({ ledger, reservationTtlMs: 60_000, now: () => clock });
    const { key } = await createApiKeys(database).create({ accountId: account.id, keyType: 'INFERENCE' });
    const principal: ApiKeyPrincipal = {
      kind: 'apiKey',
      accountId: account.id,
      keyId: key.id,
      keyType: 'INFERENCE',
    };
    const reserve = (amountNano: bigint, requestId: string) =>
      charges.reserve(principal, { amountNano, requestId });
    return { account, ledger, charges, principal, reserve };
  }

  test('behavior: yes only when the latest reservation left the margin beyond the holds being made, and not for long', async () => {
    clock = 1_000;
    const { charges, principal, reserve } = await setUp(20n * USD);
    // Nothing seen of the account yet.
    expect(charges.holdsAhead(principal, USD)).toBe(false);
    await reserve(10n * USD, 'r-1');
    // 10 USD left: a hold fits AHEAD_MARGIN times up to 10 / AHEAD_MARGIN.
    expect(AHEAD_MARGIN).toBe(2n);
    expect(charges.holdsAhead(principal, 5n * USD)).toBe(true);
    expect(charges.holdsAhead(principal, 5n * USD + 1n)).toBe(false);
    // A hold being made counts from the moment it is asked for: 10 - 3 USD left for the judgement at once.
    const making = reserve(3n * USD, 'r-2');
    expect(charges.holdsAhead(principal, 3n * USD + 500_000_000n)).toBe(true);
    expect(charges.holdsAhead(principal, 3n * USD + 500_000_001n)).toBe(false);
    await making;
    // Made: the 7 USD left, as the reservation itself found it.
    expect(charges.holdsAhead(principal, 3n * USD + 500_000_000n)).toBe(true);
    expect(charges.holdsAhead(principal, 3n * USD + 500_000_001n)).toBe(false);
    // What was seen is trusted for AHEAD_TTL_MS.
    clock += AHEAD_TTL_MS;
    expect(charges.holdsAhead(principal, USD)).toBe(true);
    clock += 1;
    expect(charges.holdsAhead(principal, USD)).toBe(false);
  });

  test('behavior: a refused reservation forgets the account; a key with a spend limit is never judged ahead', async () => {
    clock = 5_000;
    const { charges, principal, reserve } = await setUp(2n * USD);
    await reserve(USD / 2n, 'ok');
    expect(charges.holdsAhead(principal, USD / 4n)).toBe(true);
    await expect(reserve(10n * USD, 'too-much')).rejects.toMatchObject({ status: 402 });
    expect(charges.holdsAhead(principal, USD / 4n)).toBe(false);
    await reserve(USD / 2n, 'ok-again');
    expect(charges.holdsAhead(principal, USD / 4n)).toBe(true);
    expect(charges.holdsAhead({ ...principal, spendLimited: true }, USD / 4n)).toBe(false);
  });
});
