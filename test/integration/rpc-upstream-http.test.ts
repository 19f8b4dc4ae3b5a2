/**
 * The HTTP JSON-RPC upstream on the wire, against a loopback node that records what it receives: the request
 * line and headers a node behind a virtual host needs (Host, the URL's credentials as Basic auth, the path and
 * query kept, the body's length), the request bytes unchanged, and one keep-alive connection reused by
 * sequential calls. undici hands a connection back a turn of the event loop after its answer ended (a server
 * that said it keeps the connection may still close it): the calls here are that far apart, as a proxy's are.
 */
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createHttpRpcUpstream } from '../../server/providers/rpc/http.ts';

type Seen = { method: string; url: string; headers: IncomingHttpHeaders; body: string; socket: number };

/** A turn of the event loop. */
const nextTurn = () => new Promise((resolve) => setImmediate(resolve));

let server: Server;
let port = 0;
const seen: Seen[] = [];
const sockets = new Map<unknown, number>();

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      if (!sockets.has(req.socket)) sockets.set(req.socket, sockets.size + 1);
      seen.push({
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
        socket: sockets.get(req.socket) ?? 0,
      });
      const answer = '{"jsonrpc":"2.0","id":7,"result":"0x2a"}';
      if (req.url === '/late') {
        // The head first, the body later: not in the client's buffer when its head is read.
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(answer.length) });
        res.flushHeaders();
        setTimeout(() => res.end(answer), 20);
        return;
      }
      if (req.url === '/chunked') {
        // No length: two chunks, the second later.
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write(answer.slice(0, 10));
        setTimeout(() => res.end(answer.slice(10)), 20);
        return;
      }
      if (req.url === '/big') {
        // Over the cap, declared.
        const big = Buffer.alloc(4096, 0x20);
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(big.length) });
        res.end(big);
        return;
      }
      if (req.url === '/big-chunked') {
        // Over the cap, undeclared: chunks until the client gives up.
        res.writeHead(200, { 'content-type': 'application/json' });
        const timer = setInterval(() => res.write(Buffer.alloc(1024, 0x20)), 1);
        res.on('close', () => clearInterval(timer));
        return;
      }
      if (req.url === '/silent') return; // Never answers.
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(answer);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as AddressInfo).port;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

test('behavior: Host, Basic credentials from the URL, path and query, length and bytes reach the node', async () => {
  const upstream = createHttpRpcUpstream({
    endpoints: [{ url: `http://rpc%40user:p%3Ass@127.0.0.1:${port}/v2/key-123?tier=x`, timeoutMs: 5000 }],
    maxResponseBytes: 1 << 20,
  });
  try {
    seen.length = 0;
    const payload = Buffer.from('{"jsonrpc":"2.0","id":7,"method":"eth_blockNumber","params":[]}');
    const answer = await upstream.forward({
      payload,
      parse: (status, body) => `${status}:${body.toString()}`,
    });
    expect(answer.parsed).toBe('200:{"jsonrpc":"2.0","id":7,"result":"0x2a"}');
    expect(seen).toHaveLength(1);
    const [request] = seen;
    expect(request).toMatchObject({ method: 'POST', url: '/v2/key-123?tier=x', body: payload.toString() });
    expect(request?.headers).toMatchObject({
      host: `127.0.0.1:${port}`,
      authorization: `Basic ${Buffer.from('rpc@user:p:ss').toString('base64')}`,
      'content-type': 'application/json',
      accept: 'application/json',
      'content-length': String(payload.length),
      connection: 'keep-alive',
    });
  } finally {
    upstream.close();
  }
});

test('behavior: sequential calls reuse one keep-alive connection; no credentials when the URL has none', async () => {
  const upstream = createHttpRpcUpstream({
    endpoints: [{ url: `http://127.0.0.1:${port}`, timeoutMs: 5000 }],
    maxResponseBytes: 1 << 20,
  });
  try {
    seen.length = 0;
    const payload = Buffer.from('{"jsonrpc":"2.0","id":7,"method":"eth_chainId"}');
    for (let i = 0; i < 3; i++) {
      if (i > 0) await nextTurn();
      await upstream.forward({ payload, parse: () => true });
    }
    expect(seen.map((s) => s.url)).toEqual(['/', '/', '/']);
    expect(new Set(seen.map((s) => s.socket)).size).toBe(1);
    expect(seen[0]?.headers.authorization).toBeUndefined();
    expect(seen[0]?.headers.host).toBe(`127.0.0.1:${port}`);
  } finally {
    upstream.close();
  }
});

test('behavior: an answer whole at once, its body after its head, or chunked: the same bytes, one connection', async () => {
  const payload = Buffer.from('{"jsonrpc":"2.0","id":7,"method":"eth_chainId"}');
  for (const path of ['', '/late', '/chunked']) {
    const upstream = createHttpRpcUpstream({
      endpoints: [{ url: `http://127.0.0.1:${port}${path}`, timeoutMs: 5000 }],
      maxResponseBytes: 1 << 20,
    });
    try {
      seen.length = 0;
      for (let i = 0; i < 3; i++) {
        if (i > 0) await nextTurn();
        const answer = await upstream.forward({ payload, parse: (status, body) => `${status}:${body}` });
        expect(answer.parsed, path).toBe('200:{"jsonrpc":"2.0","id":7,"result":"0x2a"}');
      }
      // Each answer read to its end: the connection went back to the agent for the next call.
      expect(new Set(seen.map((s) => s.socket)).size, path).toBe(1);
    } finally {
      upstream.close();
    }
  }
});

test('behavior: an answer over the cap (declared or not), no answer in time, the caller gone: each ends its call and its connection', async () => {
  const payload = Buffer.from('{"jsonrpc":"2.0","id":7,"method":"eth_chainId"}');
  const failure = async (path: string, timeoutMs: number, signal?: AbortSignal) => {
    const upstream = createHttpRpcUpstream({
      endpoints: [{ url: `http://127.0.0.1:${port}${path}`, timeoutMs }],
      maxResponseBytes: 1024,
    });
    try {
      return await upstream.forward({ payload, parse: () => true, ...(signal ? { signal } : {}) }).then(
        () => undefined,
        (error: unknown) => error as { kind: string },
      );
    } finally {
      upstream.close();
    }
  };
  expect(await failure('/big', 5000)).toMatchObject({ kind: 'too_large' });
  expect(await failure('/big-chunked', 5000)).toMatchObject({ kind: 'too_large' });
  expect(await failure('/silent', 50)).toMatchObject({ kind: 'timeout' });
  const gone = new AbortController();
  setTimeout(() => gone.abort(), 50);
  expect(await failure('/silent', 5000, gone.signal)).toMatchObject({ kind: 'aborted' });
  // Gone before the call: nothing is sent.
  seen.length = 0;
  expect(await failure('', 5000, AbortSignal.abort())).toMatchObject({ kind: 'aborted' });
  await nextTurn();
  expect(seen).toHaveLength(0);
});
