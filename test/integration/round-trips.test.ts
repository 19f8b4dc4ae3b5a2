/**
 * Database round trips per request, counted at the driver (every statement, `begin` and `commit` included),
 * so that the hot paths cannot quietly regress: a chat completion, a JSON-RPC call, a wallet-paid chat (its
 * account looked up on its first sign-in only, its request slot and admission minimum in one round trip on
 * PostgreSQL), and the reservation and capture inside them. Runs on SQLite and on a real PostgreSQL. On
 * PostgreSQL a reservation and a capture are one statement each (the account row locked for that statement,
 * not across round trips). Once a path's first request has run, its requests build no statement with Kysely's
 * query builder: each is compiled once (compiledOnce).
 */

import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type CompiledQuery, DefaultQueryCompiler } from 'kysely';
import { pino } from 'pino';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import { createApp } from '../../server/app.ts';
import { loadConfig } from '../../server/config.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { createServices, type Services } from '../../server/services.ts';
import { type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';
import { sqliteOpcodes } from '../support/sqlite-program.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const ORIGIN = 'https://api.example.test';
let anvil: StartedAnvil;
const postgres = postgresPerFile();
const scratch = mkdtempSync(join(tmpdir(), 'round-trips-'));

beforeAll(async () => {
  anvil = await startAnvil();
}, 120_000);

afterAll(async () => {
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

type Counted = {
  base: string;
  services: Services;
  key: string;
  /** The statements sent while `fn` ran. */
  during(fn: () => Promise<unknown>): Promise<string[]>;
  /**
   * The statements of Kysely's query builder compiled during the last `during`: none on a hot path once its
   * first request has compiled them (compiledOnce in server/storage/internal.ts). Raw `sql` templates are
   * left out: PostgreSQL's one-statement holds and captures are composed per call by design.
   */
  compiled: string[];
  close(): Promise<void>;
};

/** Every statement Kysely compiles (the spy calls through). */
const compiles = vi.spyOn(DefaultQueryCompiler.prototype, 'compileQuery');

async function start(databaseUrl: string, env: Record<string, string> = {}): Promise<Counted> {
  let recording: string[] | undefined;
  let compiled: string[] = [];
  const config = loadConfig({
    NODE_ENV: 'test',
    LOG_LEVEL: 'silent',
    DATABASE_URL: databaseUrl,
    VIDEO_WORKER_ENABLED: 'false',
    RPC_UPSTREAM_BASE_MAINNET: anvil.url,
    PUBLIC_ORIGIN: ORIGIN,
    // Long enough that the warm-up request's key lookup is still cached when the counted one runs.
    API_KEY_CACHE_TTL_MS: '60000',
    ...env,
  });
  const services = await createServices(config, pino({ level: 'silent' }), {
    database: { onQuery: (sql) => recording?.push(sql) },
  });
  const server = createApp(services.app).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const account = await services.accounts.createApiAccount({});
  await services.ledger.topUp({ accountId: account.id, amountNano: parseUsdToNano('50') });
  const { secret } = await services.keys.create({ accountId: account.id, keyType: 'INFERENCE' });
  return {
    base: `http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`,
    services,
    key: secret,
    get compiled() {
      return compiled;
    },
    async during(fn) {
      // Let fire-and-forget work of earlier requests finish first.
      await new Promise((resolve) => setTimeout(resolve, 50));
      recording = [];
      compiles.mockClear();
      try {
        await fn();
        await new Promise((resolve) => setTimeout(resolve, 50));
        compiled = compiles.mock.calls.flatMap(([node], i) => {
          const result = compiles.mock.results[i];
          return node.kind === 'RawNode' || !result ? [] : [(result.value as CompiledQuery).sql];
        });
        // The key's last-used time is written at most once a second per key, off the request's path.
        return recording.filter((s) => !s.startsWith('update "api_keys" set "last_used_at_ms"'));
      } finally {
        recording = undefined;
      }
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await services.close();
    },
  };
}

/** The statements of each transaction (`begin` … `commit`) among `statements`. */
function transactions(statements: string[]): string[][] {
  const found: string[][] = [];
  let open: string[] | undefined;
  for (const statement of statements) {
    if (statement === 'begin') open = [];
    else if (statement === 'commit' && open) {
      found.push(open);
      open = undefined;
    } else open?.push(statement);
  }
  return found;
}

/**
 * The statements with RETURNING, by their first words. On SQLite a RETURNING statement runs through an
 * ephemeral table of its own (bench/HISTORY.md, thirty-first round): the hot paths use it only where they read
 * the rows back (`readBack`; PostgreSQL's statements are not checked: no ephemeral tables there, and its
 * one-statement writes guard with RETURNING).
 */
const returning = (statements: string[]) =>
  statements.filter((s) => /\breturning\b/i.test(s)).map((s) => s.split(' (')[0]);
// SQLite: what reads rows back is the chat's admission (its counts: the `x-ratelimit-remaining-*` headers).
const ADMISSION = ['insert into "rate_limit_counters"'];

/**
 * SQLite: the statements, by their first words, whose program builds a table of its own at every run (an
 * ephemeral B-tree, a sorter, an automatic index): a RETURNING, a CHECK that tests a column against a list of
 * more than two values, an INSERT whose SELECT reads the table it inserts into (bench/HISTORY.md,
 * thirty-seventh round: each about as dear as a statement). On the hot paths, only the admission's RETURNING.
 */
async function buildingTables(services: Services, statements: string[]): Promise<string[]> {
  const found: string[] = [];
  for (const text of new Set(statements)) {
    const opcodes = await sqliteOpcodes(services.database.db, text);
    if (opcodes.some((opcode) => /^(OpenEphemeral|SorterOpen|OpenAutoindex)$/.test(opcode)))
      found.push(text.split(' (')[0] ?? text);
  }
  return found;
}

// PostgreSQL, a reservation with the caller's writes: the script of the lock and one statement (reserveAtOnce).
// So is a reservation for a key with a spend limit (the hold checks the limit, after the lock).
// The statement after the lock is a prepared one (SQL-level: `execute`), prepared by a connection's first call.
const script = /^select 1 from accounts where id = '[^']+' for update;\nexecute svc_[0-9a-f]+_s\(/;
// SQLite: the reservation's lock of the account with its key's limits (held in memory, it writes nothing; in the
// rows, it also inserts the reservation, as the capture of one held in memory does: written settled).
const reserves = (s: string) => /"api_keys"\."id" as "key_id"|^with held as/.test(s) || script.test(s);
const captures = (s: string) => /^(insert into "ledger_entries"|with settled as)/.test(s);
const reservation = (tx: string[]) => tx.some(reserves);
const capture = (tx: string[]) => tx.some(captures);

// Statements inside a transaction, `begin` and `commit` not counted. SQLite (in-process: a statement is no round
// trip): a reservation locks the account (with the key's spend limits) and holds in memory (one process:
// held-reservations.ts; in the rows it also inserts the reservation and raises the reserved amount); a chat's
// capture, knowing the reservation's figures, writes the reservation's row settled (in the rows: claims it),
// settles the account and reads the balances it left (a select: an UPDATE … RETURNING costs SQLite an ephemeral table),
// inserts the entries (one statement), adds them to the key's spend of the day (api_key_spend_days, which the
// spend limits read instead of the entries), counts the tokens per minute.
// PostgreSQL: a reservation of free USD is one statement on its own (no transaction: the account row is locked
// for that statement only); so is a capture, the chat's token count a write of that statement (a capture with
// other statements of the caller's runs them with it in a transaction).
// A JSON-RPC call: before the node is asked, the reservation with the per-minute count and the credit cap's take
// (one guarded upsert each, and the take's hour) under the same account lock (PostgreSQL: one round trip, the script of the lock
// and one statement); after, the capture knowing the reservation's figures (SQLite: claim the reservation,
// settle the account and read what it left, insert the entry, add it to the key's spend of the day;
// PostgreSQL: one statement, alone).
// Neither reads the balance for its `x-service-balance-*` headers: the reservation found it.
const engines = [
  {
    name: 'SQLite',
    url: () => `sqlite:${join(scratch, 'db.sqlite')}`,
    // One process holds its rate-limit counts and writes them behind (held-counts.ts): no statement of a
    // request's own counts them; here written only when a test flushes them.
    // It holds its reservations in memory too (held-reservations.ts): a reservation of free USD is one read of
    // the account and its key, alone (no transaction: Database.readNow), checked and held in the same turn.
    env: { SQLITE_RATE_LIMIT_FLUSH_MS: '60000' } as Record<string, string>,
    // A key with a spend limit: in a transaction, its day of spend and its held reservations (in the rows) read.
    chat: {
      total: 8,
      commits: 1,
      reserve: [],
      capture: [5],
      alone: 1,
      limitedReserve: [3],
      limitedAlone: 0,
      limitedTotal: 12,
      readBack: [] as string[],
    },
    // The call's minute and credits held by the process too (taken back should its hold be refused), and its
    // hold in memory: the reservation one read alone, as a chat's (no transaction: ReserveWithin.now).
    rpc: {
      total: 8,
      commits: 1,
      reserve: [],
      capture: [5],
      alone: 1,
      minute: 0,
      credits: 'held' as const,
      readBack: [] as string[],
    },
    // A wallet-paid chat: the nonce, the slot (its lock the read of the balance for the admission minimum,
    // then count, insert), the chat's statements (without a key), the balance for `X-Balance-Remaining`, the
    // slot freed.
    wallet: { total: 15, commits: 2, readBack: [] as string[] },
    building: [] as string[],
  },
  {
    name: 'SQLite, counts and holds in the rows',
    url: () => `sqlite:${join(scratch, 'rows.sqlite')}`,
    // As several workers on one file count and hold (`WORKERS` > 1): the admission one statement, the tokens
    // one in the capture's transaction; the reservation's row inserted held, then claimed.
    env: { SQLITE_RATE_LIMIT_FLUSH_MS: '0', SQLITE_MEMORY_HOLDS: 'false' },
    chat: {
      total: 14,
      commits: 2,
      reserve: [3],
      capture: [6],
      alone: 0,
      limitedReserve: [5],
      limitedAlone: 0,
      limitedTotal: 16,
      readBack: ADMISSION,
    },
    rpc: {
      total: 15,
      commits: 2,
      reserve: [6],
      capture: [5],
      alone: 0,
      minute: 1,
      credits: 'rows' as const,
      readBack: [] as string[],
    },
    wallet: { total: 21, commits: 3, readBack: ADMISSION },
    building: ADMISSION,
  },
  {
    name: 'PostgreSQL',
    url: () => postgres().createDatabase('round_trips'),
    env: {} as Record<string, string>,
    chat: {
      total: 3,
      commits: 0,
      reserve: [],
      capture: [],
      alone: 2,
      limitedReserve: [],
      limitedAlone: 2,
      limitedTotal: 3,
      readBack: undefined,
    },
    rpc: {
      total: 2,
      commits: 0,
      reserve: [],
      capture: [],
      alone: 2,
      minute: 1,
      credits: 'script' as const,
      readBack: undefined,
    },
    // The same, the slot taken with the balance for the admission minimum in one round trip (the script of
    // the lock and one statement).
    wallet: { total: 7, commits: 0, readBack: undefined },
    building: undefined,
  },
];

/** The statements sent outside any transaction that reserve or capture. */
function alone(statements: string[]): string[] {
  let open = false;
  return statements.filter((statement) => {
    if (statement === 'begin') open = true;
    else if (statement === 'commit') open = false;
    return !open && (reserves(statement) || captures(statement));
  });
}

describe.each(engines)(
  'round trips on $name',
  ({ url, env, chat: chatShape, rpc: rpcShape, wallet, building }) => {
    let server: Counted;
    beforeAll(async () => {
      server = await start(await url(), env);
    }, 60_000);
    afterAll(async () => {
      await server?.close();
    });

    const chat = (key = server.key) =>
      fetch(`${server.base}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'llama-3.3-70b',
          messages: [{ role: 'user', content: 'Hi' }],
          max_tokens: 8,
        }),
      }).then(async (response) => {
        expect(response.status).toBe(200);
        return response.json();
      });

    const rpc = () =>
      fetch(`${server.base}/crypto/rpc/base-mainnet`, {
        method: 'POST',
        headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] }),
      }).then(async (response) => {
        expect(response.status).toBe(200);
        return response.json();
      });

    test('a chat completion: no key lookup (cached), one reservation and one capture of few statements', async () => {
      await chat(); // warm: the key lookup, its last-used time, the first rate-limit windows
      const statements = await server.during(chat);
      expect(statements.filter((s) => s.startsWith('select * from "api_keys"'))).toEqual([]);
      const txs = transactions(statements);
      expect(txs.filter(reservation).map((tx) => tx.length)).toEqual(chatShape.reserve);
      expect(txs.filter(capture).map((tx) => tx.length)).toEqual(chatShape.capture);
      // PostgreSQL: the reservation and the capture each alone (one statement). SQLite holding in memory: the
      // reservation's read alone (Database.readNow), the capture a transaction.
      expect(alone(statements)).toHaveLength(chatShape.alone);
      expect(statements.filter(reserves)).toHaveLength(1);
      expect(statements.filter(captures)).toHaveLength(1);
      // The rate limits: one statement admits the request in all its windows, one counts its tokens after it,
      // inside the capture's transaction (SQLite: at most two commits per request, not three) or as a write of
      // the capture's one statement (PostgreSQL). Held by the process (SQLite, one process): none.
      const counters = statements.filter((s) => s.includes('rate_limit_counters'));
      if (server.services.rateLimits.holds) {
        expect(counters).toEqual([]);
      } else if (chatShape.alone === 0) {
        expect(counters[0]?.split(' (')[0]).toBe('insert into "rate_limit_counters"');
        expect(counters).toHaveLength(2);
        const [captured] = txs.filter(capture);
        expect(captured?.at(-1)).toMatch(/^insert into "rate_limit_counters"/);
      } else {
        expect(counters[0]?.split(' (')[0]).toBe('insert into "rate_limit_counters"');
        expect(counters).toEqual([counters[0], statements.find(captures)]);
      }
      expect(statements.filter((s) => s === 'commit')).toHaveLength(chatShape.commits);
      expect(statements.length, statements.join('\n')).toBe(chatShape.total);
      if (chatShape.readBack) expect(returning(statements)).toEqual(chatShape.readBack);
      if (building) expect(await buildingTables(server.services, statements)).toEqual(building);
      expect(server.compiled).toEqual([]);
    });

    test('a chat with a key that has a spend limit: checked in the reservation, reading no entry', async () => {
      const { services } = server;
      const account = await services.accounts.createApiAccount({});
      await services.ledger.topUp({ accountId: account.id, amountNano: parseUsdToNano('50') });
      const { secret } = await services.keys.create({
        accountId: account.id,
        keyType: 'INFERENCE',
        limitUsdNano: parseUsdToNano('40'),
      });
      await chat(secret);
      const statements = await server.during(() => chat(secret));
      const txs = transactions(statements);
      expect(txs.filter(reservation).map((tx) => tx.length)).toEqual(chatShape.limitedReserve);
      // PostgreSQL: the script of the lock and the hold that checks the limit, one round trip as for any key.
      expect(alone(statements)).toHaveLength(chatShape.limitedAlone);
      const [reserved] = statements.filter(reserves);
      if (chatShape.limitedAlone > 0) expect(reserved).toMatch(script);
      // The key's spend read by the reservation, added to by the capture.
      // (PostgreSQL: the prepared hold, whose text the connection's first such call sent, is the read.)
      expect(statements.filter((s) => s.includes('api_key_spend_days') || script.test(s))).toHaveLength(2);
      expect(statements.filter((s) => /from "?ledger_entries/.test(s))).toEqual([]);
      expect(statements.length, statements.join('\n')).toBe(chatShape.limitedTotal);
      expect(server.compiled).toEqual([]);
    });

    test("each chat's tokens are counted in its model's tokens-per-minute window", async () => {
      // The count is written with the capture, which a lone request's answer does not wait for (held by the
      // process: written behind, here when flushed).
      const counted = async () => {
        await server.services.charges.idle();
        await server.services.rateLimits.flush();
        const rows = await server.services.database.db
          .selectFrom('rate_limit_counters')
          .select('used')
          .where('bucket', 'like', '%:TPM')
          .execute();
        return rows.reduce((sum, row) => sum + Number(row.used), 0);
      };
      const before = await counted();
      const answers = (await Promise.all([chat(), chat()])) as Array<{ usage: { total_tokens: number } }>;
      const tokens = answers.reduce((sum, answer) => sum + answer.usage.total_tokens, 0);
      expect(tokens).toBeGreaterThan(0);
      expect((await counted()) - before).toBe(tokens);
    });

    test('a JSON-RPC call: the reservation (with the caps) and the capture, two transactions (PostgreSQL: two round trips)', async () => {
      // The call before makes the minute's credit bucket, which the measured one adds to: both in one minute
      // (again if a minute began between them).
      let statements: string[] = [];
      for (let attempt = 0; attempt < 3; attempt++) {
        const minute = Math.floor(Date.now() / 60_000);
        await rpc();
        statements = await server.during(rpc);
        if (Math.floor(Date.now() / 60_000) === minute) break;
      }
      const txs = transactions(statements);
      expect(txs.length, statements.join('\n')).toBe(rpcShape.commits);
      expect(txs.filter(reservation).map((tx) => tx.length)).toEqual(rpcShape.reserve);
      expect(txs.filter(capture).map((tx) => tx.length)).toEqual(rpcShape.capture);
      expect(alone(statements)).toHaveLength(rpcShape.alone);
      expect(statements.filter(captures)).toHaveLength(1);
      // The per-minute count is a statement of the reservation's transaction (at most two commits per call), or
      // on PostgreSQL with the credits' take a write of the reservation's script; held by one SQLite process,
      // none.
      const [reserved] = rpcShape.alone === 0 ? txs.filter(reservation) : [statements.filter(reserves)];
      expect(
        reserved?.filter((s) => s.startsWith('insert into "rate_limit_counters"') || script.test(s)),
      ).toHaveLength(rpcShape.minute);
      // (PostgreSQL: the take is a write of the prepared statement the script executes. SQLite in the rows: an
      // update of the minute's bucket, which the call before made. Held by one SQLite process: none, written
      // behind.)
      const credits = {
        held: { usage: [], hours: [] },
        rows: {
          usage: [expect.stringMatching(/^update "rpc_credit_usage"/)],
          hours: [expect.stringMatching(/^insert into "rpc_credit_hours"/)],
        },
        script: { usage: [statements.find(reserves)], hours: [statements.find(reserves)] },
      }[rpcShape.credits];
      expect(statements.filter((s) => s.includes('rpc_credit_usage') || script.test(s))).toEqual(
        credits.usage,
      );
      expect(statements.filter((s) => /insert into "?rpc_credit_hours/.test(s) || script.test(s))).toEqual(
        credits.hours,
      );
      expect(statements.filter((s) => s === 'commit')).toHaveLength(rpcShape.commits);
      expect(statements.length, statements.join('\n')).toBe(rpcShape.total);
      if (rpcShape.readBack) expect(returning(statements)).toEqual(rpcShape.readBack);
      if (building) expect(await buildingTables(server.services, statements)).toEqual([]);
      expect(server.compiled).toEqual([]);
    });

    test('a wallet-paid chat: the account of the wallet is looked up on its first sign-in only; few round trips', async () => {
      const signer = privateKeyToAccount(generatePrivateKey());
      const { account } = await server.services.accounts.findOrCreateWalletAccount(signer.address);
      await server.services.ledger.topUp({
        accountId: account.id,
        amountNano: parseUsdToNano('50'),
        network: 'eip155:8453',
        txHash: `0x${signer.address.slice(2).toLowerCase()}`,
      });
      const walletChat = async () => {
        const response = await fetch(`${server.base}/chat/completions`, {
          method: 'POST',
          headers: {
            'SIGN-IN-WITH-X': await evmSignIn(signer, { origin: ORIGIN }),
            'content-type': 'application/json',
          },
          body: JSON.stringify({
            model: 'llama-3.3-70b',
            messages: [{ role: 'user', content: 'Hi' }],
            max_tokens: 8,
          }),
        });
        expect(response.status).toBe(200);
        return response.json();
      };
      const byAddress = (statements: string[]) =>
        statements.filter((s) => /"?wallet_address"? =/.test(s) || s.startsWith('insert into "accounts"'));
      const first = await server.during(walletChat);
      expect(byAddress(first).length).toBeGreaterThan(0);
      const second = await server.during(walletChat);
      expect(byAddress(second)).toEqual([]);
      expect(second.filter((s) => s === 'commit')).toHaveLength(wallet.commits);
      expect(second.length, second.join('\n')).toBe(wallet.total);
      if (wallet.readBack) expect(returning(second)).toEqual(wallet.readBack);
      if (building) expect(await buildingTables(server.services, second)).toEqual(building);
      expect(server.compiled).toEqual([]);
    });
  },
);
