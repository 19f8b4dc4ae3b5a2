/**
 * The harness's one-at-a-time measurement (bench/measure.ts, `latencies`): several targets take turns of
 * `block` requests, each on its own keep-alive connection, the first request of a turn not counted, so that
 * the noise of the machine falls on each target alike.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, expect, test } from 'vitest';
import { latencies, latency, requestsServed, type Target, warmUp } from '../../bench/measure.ts';

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((resolve) => s.close(resolve))));
});

/** A loopback server that records, in one shared log, which target each request reached and on which socket. */
async function recorder(name: string, log: string[], sockets: Set<string>, status = 200): Promise<Target> {
  const server = createServer((req, res) => {
    log.push(name);
    sockets.add(`${name}:${req.socket.remotePort}`);
    req.resume();
    req.on('end', () => res.writeHead(status, { 'content-type': 'application/json' }).end('{}'));
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`, method: 'POST', body: '{}' };
}

test('targets take turns of `block` requests after their warm-ups; a turn’s first request is not counted', async () => {
  const log: string[] = [];
  const sockets = new Set<string>();
  const a = await recorder('A', log, sockets);
  const b = await recorder('B', log, sockets);
  let warmedUp = -1;
  const [ra, rb] = await latencies([a, b], 7, {
    warmup: 2,
    block: 3,
    afterWarmup: async () => {
      warmedUp = log.length;
    },
  });
  // Warm-ups first, each target on its own; then turns of 3 (+1 uncounted), the last turn shorter.
  expect(warmedUp).toBe(4);
  expect(log.join('')).toBe(`AABB${'AAAA' + 'BBBB'}${'AAAA' + 'BBBB'}${'AA' + 'BB'}`);
  expect(ra?.count).toBe(7);
  expect(rb?.count).toBe(7);
  for (const r of [ra, rb]) {
    expect(r?.p50Us).toBeGreaterThan(0);
    expect(r?.p99Us).toBeGreaterThanOrEqual(r?.p50Us ?? Number.POSITIVE_INFINITY);
  }
  // One keep-alive connection per target for the whole measurement.
  expect([...sockets].filter((s) => s.startsWith('A:'))).toHaveLength(1);
  expect([...sockets].filter((s) => s.startsWith('B:'))).toHaveLength(1);
});

test('one target runs its requests in one turn, none of them uncounted', async () => {
  const log: string[] = [];
  const a = await recorder('A', log, new Set());
  const result = await latency(a, 250, { warmup: 3 });
  expect(result.count).toBe(250);
  expect(log).toHaveLength(253);
});

test('a target that fails is reported, with its URL', async () => {
  const log: string[] = [];
  const a = await recorder('A', log, new Set());
  const b = await recorder('B', log, new Set(), 503);
  await expect(latencies([a, b], 4, { warmup: 0, block: 2 })).rejects.toThrow(`${b.url} answered 503`);
});

test('requestsServed tells what each target was sent after its warm-up, as the turns above sent it', async () => {
  const log: string[] = [];
  const a = await recorder('A', log, new Set());
  const b = await recorder('B', log, new Set());
  let warmedUp = 0;
  await latencies([a, b], 7, {
    warmup: 2,
    block: 3,
    afterWarmup: async () => {
      warmedUp = log.length;
    },
  });
  const sent = log.slice(warmedUp);
  expect(sent.filter((name) => name === 'A')).toHaveLength(requestsServed(2, 7, 3));
  expect(requestsServed(2, 7, 3)).toBe(10);
  // One target: its requests in one turn, none uncounted.
  expect(requestsServed(1, 250)).toBe(250);
});

test('a warm-up loads each target in turn for its seconds, and none with 0 seconds', async () => {
  const calls: string[] = [];
  const run = async (target: Target, seconds: number, connections: number) => {
    calls.push(`${target.url} ${seconds}s x${connections}`);
  };
  const targets: Target[] = [
    { url: 'http://127.0.0.1:1/chat', method: 'POST' },
    { url: 'http://127.0.0.1:1/rpc', method: 'POST' },
  ];
  await warmUp(targets, 2, 16, run);
  expect(calls).toEqual(['http://127.0.0.1:1/chat 2s x16', 'http://127.0.0.1:1/rpc 2s x16']);
  calls.length = 0;
  await warmUp(targets, 0, 16, run);
  expect(calls).toEqual([]);
});

test('a warm-up with the real load reaches the target before the measurement', async () => {
  const log: string[] = [];
  const target = await recorder('W', log, new Set());
  await warmUp([target], 1, 2);
  expect(log.length).toBeGreaterThan(0);
});
