/**
 * The storage floor of the benchmark: what a billed request costs on this machine with nothing of this service
 * but its SQLite schema and the writes its rules require. A bare `node:http` server that, for each request,
 * writes the same rows the server writes, with hand-written statements on better-sqlite3 (no framework, no
 * validation, no query builder, no engine), its write transactions group-committed per event-loop turn and
 * its WAL checkpointed on a worker thread (the server's `startCheckpointer`), as the server's are: with
 * SQLite's own checkpoint inside the commit that crosses 1,000 pages, one request in about fifty would wait
 * for the fsyncs, and the floor's p99 would be that stall rather than the writes. The harness reports the
 * server against it: how far the server is from what per-request ledger writes allow, apart from how far it
 * is from the bare `node:http` ceiling.
 *
 * - `POST /chat`: a non-streamed chat's writes: in one transaction the caller's account and key read under
 *   the write lock, the reservation held in memory against them (as one server process on SQLite holds it:
 *   server/storage/held-reservations.ts); in the next event-loop turn (the work), a JSON answer, and in
 *   another transaction, which the answer does not wait for (the server's `Charges.captureDetached`; until the
 *   forty-fourth round the answer came after it), the reservation's row written settled, the account
 *   charged, two ledger entries (input and output tokens), the key's spend of the day: the captures of one
 *   commit group written together, as the server's are since the forty-ninth round (`writeCaptures`). Its
 *   three rate-limit windows and its tokens are counted in memory and written behind every 50 ms, as one
 *   server process on SQLite does (`countHeld`).
 * - `POST /rpc`: a JSON-RPC call's writes around a forward to `FLOOR_UPSTREAM`: the reservation before (its
 *   per-minute count held in memory as a chat's windows are); the upstream's bytes, then the capture (one
 *   ledger entry, the key's spend of the day), which the answer does not wait for (until the forty-fourth
 *   round it came after it).
 * - `POST /proxy`: the forward alone, no writes: what a bare proxy adds on this machine.
 * - `POST /upstream`: a streamed chat through an OpenAI-compatible upstream (`FLOOR_CHAT_UPSTREAM`'s
 *   `/v1/chat/completions`), as the server's upstream adapter does it: the chat's reservation (its three
 *   rate-limit windows counted in memory) before; the upstream's events parsed as they come, each re-emitted
 *   to the client with the request's id and model, its usage taken; then the final frames and,
 *   in the same event-loop turn, the capture (two ledger entries, the key's spend of the day; the tokens
 *   counted in memory), which the answer does not wait for (the server's `Charges.captureDetached`).
 *
 * The forwards go out as the server's do: undici's dispatcher with kept-alive connections per upstream and a
 * handler's callbacks (`server/providers/upstream-connections.ts`), so that the floor stays below what the
 * server can do with its client. Its event loop polls after a lone request's arrival and answer as the
 * server's does (`server/http/idle-poll.ts`, `IDLE_POLL_US`).
 *
 * Env: `PORT`; `FLOOR_DB`: a migrated SQLite file with the funded account and key of `FLOOR_KEY` (bench/setup.ts
 * `fundedKey`); `FLOOR_UPSTREAM`: the upstream's origin for `/rpc` and `/proxy`; `FLOOR_CHAT_UPSTREAM`: the chat
 * upstream's origin for `/upstream` (bench/upstream.ts). Listens on 127.0.0.1.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import Sqlite from 'better-sqlite3';
import { type Dispatcher, Pool } from 'undici';
import { IDLE_POLL_US, pollWhileServing } from '../server/http/idle-poll.ts';
import { createInFlight } from '../server/http/in-flight.ts';
import { randomHex } from '../server/http/random-hex.ts';
import { UPSTREAM_CONNECTIONS } from '../server/providers/upstream-connections.ts';
import {
  CHECKPOINT_INTERVAL_MS,
  SAFETY_CHECKPOINT_PAGES,
  startCheckpointer,
} from '../server/storage/database.ts';
import { QUIET_MS } from '../server/storage/group-commit.ts';
import { FLUSH_MS } from '../server/storage/held-counts.ts';
import { timeOrderedIds } from '../server/storage/internal.ts';

const env = (name: string) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is required`);
  return value;
};
const db = new Sqlite(env('FLOOR_DB'));
db.defaultSafeIntegers(true);
db.pragma('journal_mode = WAL');
db.pragma('foreign_keys = ON');
db.pragma('synchronous = NORMAL');
db.pragma(`wal_autocheckpoint = ${SAFETY_CHECKPOINT_PAGES}`);
const checkpointer = startCheckpointer(env('FLOOR_DB'), CHECKPOINT_INTERVAL_MS);

function keyOf(secret: string): { id: string; account_id: string } {
  const secretHash = createHash('sha256').update(secret, 'utf8').digest('hex');
  const row = db.prepare('select id, account_id from api_keys where secret_hash = ?').get(secretHash);
  if (!row) throw new Error('FLOOR_KEY is not a key of FLOOR_DB');
  return row as { id: string; account_id: string };
}
const key = keyOf(env('FLOOR_KEY'));
/**
 * The ids of the rows it writes (reservations, ledger entries): time-ordered, as the server's storage makes
 * them (`timeOrderedIds`), so that each insert lands at the end of its table's id index as the server's do.
 * Until the forty-ninth round they were random (`randomUUID`): each insert on a random leaf, more pages
 * written a commit, and a floor that slowed as its file grew.
 */
const newId = timeOrderedIds();

const MINUTE = 60_000n;
const DAY = 86_400_000n;
const RESERVE_NANO = 1_000_000n;

const statements = {
  principal: db.prepare(
    `select accounts.*, api_keys.id as key_id, api_keys.limit_usd_nano as key_limit_usd_nano
       from api_keys join accounts on accounts.id = api_keys.account_id where api_keys.id = ?`,
  ),
  heldRead: db
    .prepare('select used from rate_limit_counters where bucket = ? and window_start_ms = ?')
    .pluck(),
  heldWrite: db.prepare(
    `insert into rate_limit_counters (bucket, window_start_ms, used) values (?, ?, ?)
       on conflict (bucket, window_start_ms) do update set used = used + excluded.used`,
  ),
  charge: db.prepare(
    'update accounts set usd_balance_nano = usd_balance_nano - ? where id = ? returning usd_balance_nano',
  ),
  // The key's spend of the day (what its listing's trailing spend and a spend limit read), as the server's
  // capture adds it for every charge of a key (since the forty-ninth round here; before, the floor left it out).
  spendDay: db.prepare(
    `insert into api_key_spend_days (api_key_id, epoch_day, currency, net_nano) values (?, ?, 'USD', ?)
       on conflict (api_key_id, epoch_day, currency) do update set net_nano = net_nano + excluded.net_nano`,
  ),
};

type Billed = { reservationId: string; requestId: string; model: string; createdAt?: bigint };

/**
 * The USD held in memory for the account (server/storage/held-reservations.ts; since the forty-third round:
 * before, the reservation's row inserted held and the account's reserved sum raised, and the capture's claim
 * of the row and the sum lowered).
 */
let heldNano = 0n;

/**
 * A chat's rate-limit windows, held in memory and written behind every FLUSH_MS as the windows' sums, as one
 * server process on SQLite holds them (server/storage/held-counts.ts; forty-first round: before it, the
 * reservation's transaction counted them with one upsert of three rows, and the capture's the tokens).
 */
type Held = { bucket: string; start: bigint; used: bigint; unwritten: bigint };
const held = new Map<string, Held>();
let writeBehind: NodeJS.Timeout | undefined;
function countHeld(bucket: string, start: bigint, cost: bigint): void {
  const name = `${start}:${bucket}`;
  let count = held.get(name);
  if (!count) {
    count = {
      bucket,
      start,
      used: (statements.heldRead.get(bucket, start) as bigint | undefined) ?? 0n,
      unwritten: 0n,
    };
    held.set(name, count);
  }
  count.used += cost;
  count.unwritten += cost;
  if (cost > 0n && !writeBehind)
    writeBehind = setTimeout(() => {
      writeBehind = undefined;
      const due = [...held.values()].filter((c) => c.unwritten > 0n);
      const amounts = due.map((c) => c.unwritten);
      for (const c of due) c.unwritten = 0n;
      inGroup(
        () => {
          for (let i = 0; i < due.length; i++) {
            const count = due[i] as Held;
            statements.heldWrite.run(count.bucket, count.start, amounts[i]);
          }
        },
        () => undefined,
        true,
      );
    }, FLUSH_MS);
}

function reserve(billed: Billed, buckets: string[]): void {
  const at = BigInt(Date.now());
  const account = statements.principal.get(key.id) as { usd_balance_nano: bigint; usd_reserved_nano: bigint };
  const minute = at - (at % MINUTE);
  if (buckets.length === 3) {
    // The tokens-per-minute window is only looked at (counted at the capture); the day and the minute count
    // one, held (a chat's: countHeld).
    countHeld(buckets[0] as string, minute, 0n);
    countHeld(buckets[1] as string, at - (at % DAY), 1n);
    countHeld(buckets[2] as string, minute, 1n);
  } else {
    // A JSON-RPC call's minute, held as well (since the forty-second round; before, an upsert in the reservation's
    // transaction).
    countHeld(buckets[0] as string, minute, 1n);
  }
  if (account.usd_balance_nano - account.usd_reserved_nano - heldNano < RESERVE_NANO)
    throw new Error('unfunded');
  heldNano += RESERVE_NANO;
  billed.createdAt = at;
}

/** A capture asked for in a commit group's transaction, written with the group's others (writeCaptures). */
type Capture = {
  billed: Billed;
  parts: Array<{ sku: string; units: bigint; priceNano: bigint }>;
  at: bigint;
  cost: bigint;
};
const captures: Capture[] = [];

function capture(
  billed: Billed,
  parts: Array<{ sku: string; units: bigint; priceNano: bigint }>,
  tokens = 0n,
) {
  const at = BigInt(Date.now());
  const cost = parts.reduce((sum, p) => sum + p.units * p.priceNano, 0n);
  captures.push({ billed, parts, at, cost });
  // Let go of once the capture is written (the server lets go once it is committed).
  heldNano -= RESERVE_NANO;
  if (tokens > 0n) countHeld(`key:${key.id}:model:${billed.model}:TPM`, at - (at % MINUTE), tokens);
}

/** An insert of `rows` rows of `row`'s placeholders, prepared once per row count (kept in `inserts`). */
function insertOf(inserts: Sqlite.Statement[], head: string, row: string, rows: number): Sqlite.Statement {
  let statement = inserts[rows];
  if (!statement) {
    statement = db.prepare(`${head} values ${Array(rows).fill(row).join(', ')}`);
    inserts[rows] = statement;
  }
  return statement;
}
/** writeCaptures' inserts by row count: the reservations' rows, written captured, and the entries. */
const settledInserts: Sqlite.Statement[] = [];
const settledRows = (rows: number) =>
  insertOf(
    settledInserts,
    `insert into reservations (id, account_id, api_key_id, request_id, model_id, usd_nano, diem_nano, epoch_day,
       status, created_at_ms, expires_at_ms, settled_at_ms)`,
    "(?, ?, ?, ?, ?, ?, 0, ?, 'captured', ?, ?, ?)",
    rows,
  );
const entryInserts: Sqlite.Statement[] = [];
const ENTRY_VALUES = 12;
const entryRows = (rows: number) =>
  insertOf(
    entryInserts,
    `insert into ledger_entries (id, account_id, api_key_id, reservation_id, type, currency, amount_nano,
       balance_after_nano, request_id, model_id, sku, units, unit_price_nano, created_at_ms)`,
    "(?, ?, ?, ?, 'CHARGE', 'USD', ?, ?, ?, ?, ?, ?, ?, ?)",
    rows,
  );

/**
 * The captures of a commit group, written together as the server's are (ledger.ts `writeHeldCaptures`, since
 * the forty-ninth round): the reservations' rows in one insert, the account charged once, every entry in one
 * insert with the balance left after it, the key's spend once per day.
 */
function writeCaptures(): void {
  if (captures.length === 0) return;
  const batch = captures.splice(0);
  const settled: unknown[] = [];
  let total = 0n;
  for (const { billed, at, cost } of batch) {
    const createdAt = billed.createdAt ?? at;
    settled.push(
      billed.reservationId,
      key.account_id,
      key.id,
      billed.requestId,
      billed.model,
      RESERVE_NANO,
      createdAt / DAY,
      createdAt,
      createdAt + 10n * MINUTE,
      at,
    );
    total += cost;
  }
  settledRows(batch.length).run(...settled);
  const [row] = statements.charge.all(total, key.account_id) as [{ usd_balance_nano: bigint }];
  let balance = row.usd_balance_nano + total;
  const entries: unknown[] = [];
  const days = new Map<bigint, bigint>();
  for (const { billed, parts, at, cost } of batch) {
    for (const part of parts) {
      const amount = part.units * part.priceNano;
      balance -= amount;
      entries.push(
        newId(),
        key.account_id,
        key.id,
        billed.reservationId,
        -amount,
        balance,
        billed.requestId,
        billed.model,
        part.sku,
        String(part.units),
        String(part.priceNano),
        at,
      );
    }
    days.set(at / DAY, (days.get(at / DAY) ?? 0n) - cost);
  }
  if (entries.length > 0) entryRows(entries.length / ENTRY_VALUES).run(...entries);
  for (const [day, net] of days) statements.spendDay.run(key.id, day, net);
}

/**
 * Write transactions queued in one event-loop turn run as one transaction (the server's group commit). As
 * the server's, an `eager` one (a reservation: the request waits on it) runs at once when no group of more
 * than one transaction has run for QUIET_MS.
 */
const queued: Array<{ write: () => void; done: () => void }> = [];
const runGroup = db.transaction((writes: typeof queued) => {
  for (const { write } of writes) write();
  writeCaptures();
});
let sharedUntil = 0;
function flush(writes: typeof queued): void {
  runGroup.immediate(writes);
  if (writes.length > 1) sharedUntil = performance.now() + QUIET_MS;
  for (const { done } of writes) done();
}
function inGroup(write: () => void, done: () => void, eager = false): void {
  if (queued.length === 0) {
    if (eager && performance.now() >= sharedUntil) {
      flush([{ write, done }]);
      return;
    }
    setImmediate(() => flush(queued.splice(0)));
  }
  queued.push({ write, done });
}

/** What a forward does with the upstream's answer: its status (false: not wanted), its chunks, its end. */
type Receiver = { start(status: number): boolean; data(chunk: Buffer): void; end(): void; fail(): void };

const pools = new Map<string, Pool>();

/** A JSON POST to `target` on its kept-alive connections, with `headers` (name, value, …) besides its own. */
function post(target: URL, body: string | Buffer, headers: string[], receiver: Receiver): void {
  let pool = pools.get(target.origin);
  if (!pool) {
    pool = new Pool(target.origin, UPSTREAM_CONNECTIONS);
    pools.set(target.origin, pool);
  }
  let wanted = true;
  const handler: Dispatcher.DispatchHandler = {
    // undici takes a handler for one of its new kind by this method: without it, a handler of the old kind.
    onRequestStart() {},
    onResponseStart(controller, status) {
      if (status < 200) return;
      wanted = receiver.start(status);
      if (!wanted) controller.abort(new Error('not wanted'));
    },
    onResponseData(_controller, chunk) {
      receiver.data(chunk);
    },
    onResponseEnd() {
      receiver.end();
    },
    onResponseError() {
      if (wanted) receiver.fail();
    },
  };
  pool.dispatch(
    {
      method: 'POST',
      path: `${target.pathname}${target.search}`,
      headers: ['content-type', 'application/json', ...headers],
      body,
    },
    handler,
  );
}

const upstream = process.env.FLOOR_UPSTREAM ? new URL(process.env.FLOOR_UPSTREAM) : undefined;
function forward(payload: Buffer, answer: (status: number, body: Buffer) => void, fail: () => void): void {
  if (!upstream) {
    fail();
    return;
  }
  let status = 502;
  const chunks: Buffer[] = [];
  post(upstream, payload, [], {
    start(code) {
      status = code;
      return true;
    },
    data: (chunk) => chunks.push(chunk),
    end: () => answer(status, chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks)),
    fail,
  });
}

const chatUpstream = process.env.FLOOR_CHAT_UPSTREAM
  ? new URL('/v1/chat/completions', process.env.FLOOR_CHAT_UPSTREAM)
  : undefined;

type UpstreamChunk = { usage?: { prompt_tokens?: number; completion_tokens?: number } };

/** The chat upstream's answer, streamed: its events re-emitted as they come; `end` with the usage it reported. */
function streamFrom(
  body: string,
  res: ServerResponse,
  billed: Billed,
  end: (usage: { prompt: bigint; completion: bigint }) => void,
  fail: () => void,
): void {
  if (!chatUpstream) {
    fail();
    return;
  }
  let pending = '';
  let usage = { prompt: 0n, completion: 0n };
  const decoder = new TextDecoder();
  post(chatUpstream, body, ['accept', 'text/event-stream'], {
    start(status) {
      if (status !== 200) {
        fail();
        return false;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      return true;
    },
    data(chunk) {
      pending += decoder.decode(chunk, { stream: true });
      // The frames of one read leave in one socket write, as the server's do.
      res.cork();
      for (let at = pending.indexOf('\n\n'); at >= 0; at = pending.indexOf('\n\n')) {
        const event = pending.slice(0, at);
        pending = pending.slice(at + 2);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        const chunk = JSON.parse(event.slice(6)) as UpstreamChunk & { id?: string; model?: string };
        if (chunk.usage)
          usage = {
            prompt: BigInt(chunk.usage.prompt_tokens ?? 0),
            completion: BigInt(chunk.usage.completion_tokens ?? 0),
          };
        chunk.id = `chatcmpl-${billed.requestId}`;
        chunk.model = billed.model;
        res.write(`data: ${JSON.stringify(chunk)}\n\n`);
      }
      process.nextTick(() => res.uncork());
    },
    end: () => end(usage),
    fail,
  });
}

function reply(res: ServerResponse, status: number, body: string | Buffer): void {
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

const CHAT_ANSWER = 'Hello, benchmark! This is the floor answering with sixteen tokens of text.';

function chat(res: ServerResponse, billed: Billed): void {
  const base = `key:${key.id}:model:${billed.model}`;
  const answer = () =>
    reply(
      res,
      200,
      JSON.stringify({
        id: `chatcmpl-${billed.requestId}`,
        object: 'chat.completion',
        created: Math.floor(Date.now() / 1000),
        model: billed.model,
        choices: [
          { index: 0, message: { role: 'assistant', content: CHAT_ANSWER }, finish_reason: 'length' },
        ],
        usage: { prompt_tokens: 20, completion_tokens: 16, total_tokens: 36 },
      }),
    );
  const charge = () =>
    capture(
      billed,
      [
        { sku: 'input_tokens', units: 20n, priceNano: 700n },
        { sku: 'output_tokens', units: 16n, priceNano: 2_800n },
      ],
      36n,
    );
  // The work takes the next event-loop turn, as the local engine's does; the answer does not wait for the
  // capture (the server's Charges.captureDetached, since the forty-fourth round under load too).
  inGroup(
    () => reserve(billed, [`${base}:TPM`, `${base}:RPD`, `${base}:RPM`]),
    () =>
      setImmediate(() => {
        answer();
        inGroup(charge, () => {});
      }),
    true,
  );
}

function rpc(res: ServerResponse, billed: Billed, payload: Buffer, failed: () => void): void {
  inGroup(
    () => reserve(billed, [`rpc:${key.account_id}:RPM`]),
    () =>
      forward(
        payload,
        (status, answer) => {
          reply(res, status, answer);
          inGroup(
            () => capture(billed, [{ sku: 'rpc_credits', units: 20n, priceNano: 700n }]),
            () => {},
          );
        },
        failed,
      ),
    true,
  );
}

function upstreamChat(res: ServerResponse, billed: Billed, body: ChatBody, failed: () => void): void {
  const base = `key:${key.id}:model:${billed.model}`;
  // What the upstream is sent: the caller's messages and bound, streamed with its usage.
  const sent = JSON.stringify({
    model: billed.model,
    messages: body.messages ?? [],
    max_completion_tokens: body.max_tokens ?? 16,
    stream: true,
    stream_options: { include_usage: true },
  });
  inGroup(
    () => reserve(billed, [`${base}:TPM`, `${base}:RPD`, `${base}:RPM`]),
    () =>
      streamFrom(
        sent,
        res,
        billed,
        ({ prompt, completion }) => {
          res.end('data: [DONE]\n\n');
          inGroup(
            () =>
              capture(
                billed,
                [
                  { sku: 'input_tokens', units: prompt, priceNano: 700n },
                  { sku: 'output_tokens', units: completion, priceNano: 2_800n },
                ],
                prompt + completion,
              ),
            () => {},
          );
        },
        () => (res.headersSent ? res.destroy() : failed()),
      ),
    true,
  );
}

type ChatBody = { model?: string; messages?: unknown[]; max_tokens?: number };

function handle(req: IncomingMessage, res: ServerResponse, payload: Buffer): void {
  const body = JSON.parse(payload.toString('utf8')) as ChatBody;
  const billed: Billed = {
    reservationId: newId(),
    // From a pool of random bytes, as the server's request ids (`randomBytes` a request: 2.4 µs of the floor's
    // main thread under `perf`, forty-ninth round).
    requestId: randomHex(16),
    model: body.model ?? 'base-mainnet',
  };
  const failed = () => reply(res, 502, '{"error":"upstream failed"}');
  if (req.url === '/chat') chat(res, billed);
  else if (req.url === '/rpc') rpc(res, billed, payload, failed);
  else if (req.url === '/upstream') upstreamChat(res, billed, body, failed);
  else if (req.url === '/proxy') forward(payload, (status, answer) => reply(res, status, answer), failed);
  else reply(res, 404, '{"error":"not found"}');
}

const inFlight = createInFlight();
const server = createServer((req, res) => {
  inFlight.track(res);
  if (req.method !== 'POST') return reply(res, 200, '{"floor":true}');
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => handle(req, res, Buffer.concat(chunks)));
});
// Polling after a lone request's arrival and answer as the server does (server/http/idle-poll.ts,
// `IDLE_POLL_US`), so that the floor's wake-ups are the server's.
pollWhileServing(server, inFlight, Number(process.env.IDLE_POLL_US ?? IDLE_POLL_US));
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1');
process.on('SIGTERM', () => server.close(() => void checkpointer.stop().finally(() => process.exit(0))));
