/**
 * A client that goes away while its chat waits for the upstream's first event is no failure of the server's:
 * the request ends as 499 `CLIENT_CLOSED` (as the JSON-RPC proxy's do), what was not used of its reservation
 * is given back, and nothing is logged at error level. Before, it was logged as a 500 `INFERENCE_FAILED` (every load test that
 * stopped with streams open filled the error log). The upstream here accepts requests and never answers.
 */
import { readFileSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';

const defaults = parse(readFileSync(`${repoRoot}/server/catalog/default-catalog.yaml`, 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};

/** Log lines the server wrote, parsed. */
const lines: Array<{ level: number; msg: string; err?: { code?: string } }> = [];
const capture = new Writable({
  write(chunk: Buffer, _encoding, done) {
    for (const line of chunk.toString('utf8').split('\n').filter(Boolean)) lines.push(JSON.parse(line));
    done();
  },
});

let server: ChatServer;
let upstream: ReturnType<typeof createServer>;
/** Requests the upstream holds, in order of arrival. */
const held: ServerResponse[] = [];
let arrived: () => void = () => {};

beforeAll(async () => {
  upstream = createServer((req, res) => {
    req.resume();
    held.push(res);
    arrived();
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  server = await startChatServer({
    logger: pino({ level: 'info' }, capture),
    catalogYaml: stringify({
      models: {
        silent: {
          ...defaults.models['llama-3.3-70b'],
          provider: {
            kind: 'openai-compatible',
            name: 'silent',
            baseUrl: `${origin}/v1`,
            upstreamModel: 'silent',
          },
        },
      },
    }),
  });
}, 60_000);

afterAll(async () => {
  await server?.close();
  upstream?.closeAllConnections();
  await new Promise<void>((resolve) => upstream?.close(() => resolve()));
});

describe('a client that goes away before the first event', () => {
  test.each([{ stream: true }, { stream: false }])(
    'behavior: stream $stream -> ended as a client close (499, not logged as an error), nothing held, no output billed',
    async ({ stream }) => {
      const { accountId, key } = await server.account('1');
      const reached = new Promise<void>((resolve) => {
        arrived = resolve;
      });
      const aborter = new AbortController();
      const answered = fetch(`${server.base}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'silent', messages: [{ role: 'user', content: 'Hi' }], stream }),
        signal: aborter.signal,
      }).catch((error: unknown) => error);
      await reached;
      expect((await server.services.ledger.getBalance(accountId)).usdReservedNano).toBeGreaterThan(0n);
      aborter.abort();
      expect(await answered).toBeInstanceOf(Error);
      // The server notices the close, stops the upstream call and gives the reservation back.
      for (let tries = 0; ; tries++) {
        if ((await server.services.ledger.getBalance(accountId)).usdReservedNano === 0n) break;
        if (tries > 200) throw new Error('the reservation was not given back');
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      await server.services.charges.idle();
      // Nothing was produced: a stream gives its reservation back; a JSON request is billed its prompt, which
      // the upstream was sent, and no output.
      const charged = (await server.services.ledger.listEntries(accountId)).filter(
        (e) => e.type === 'CHARGE',
      );
      expect(charged.map((e) => e.sku)).toEqual(stream ? [] : ['chat.input_tokens']);
      expect(lines.filter((line) => line.level >= 50)).toEqual([]);
    },
  );
});
