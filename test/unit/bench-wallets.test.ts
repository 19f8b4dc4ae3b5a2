/**
 * The harness's wallet targets (bench/wallets.ts, bench/measure.ts): the synchronous EVM sign-in is the tests'
 * helper's header, byte for byte; a throughput run hands every request a header of its own, each connection
 * from its own signer, from a pool signed before the run, counting what it had to sign during the run; and the
 * pool's size follows the bound it is given. Also the header of each connection's own (a key per connection):
 * the same on every request of a connection, another on each connection.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { privateKeyToAccount } from 'viem/accounts';
import { verifyMessage } from 'viem/utils';
import { afterEach, expect, test } from 'vitest';
import { headersPerConnection, type Target, throughput } from '../../bench/measure.ts';
import { signIn, WALLET_ORIGIN, type Wallet } from '../../bench/wallets.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((resolve) => s.close(resolve))));
});

const decode = (header: string) => JSON.parse(Buffer.from(header, 'base64').toString('utf8'));

test("behavior: the harness's EVM sign-in is the tests' helper's header; a Solana one names its wallet", async () => {
  const privateKey = `0x${'11'.repeat(32)}` as const;
  const account = privateKeyToAccount(privateKey);
  const wallet: Wallet = { kind: 'evm', address: account.address, privateKey };
  const issuedAt = new Date('2026-01-02T03:04:05.000Z');
  const header = signIn(wallet, WALLET_ORIGIN, { nonce: 'abcdef0123456789', issuedAt });
  expect(header).toBe(
    await evmSignIn(account, { origin: WALLET_ORIGIN, nonce: 'abcdef0123456789', issuedAt }),
  );
  const proof = decode(header);
  expect(proof.message).toContain('bench.example.test wants you to sign in');
  expect(
    await verifyMessage({ address: account.address, message: proof.message, signature: proof.signature }),
  ).toBe(true);
  // A fresh nonce on every call.
  expect(decode(signIn(wallet)).message).not.toBe(decode(signIn(wallet)).message);
});

test('behavior: the pool per connection is 30% above the bound, spread over the connections, plus a margin', () => {
  expect(headersPerConnection(1000, 2, 16)).toBe(Math.ceil(2600 / 16) + 16);
  expect(headersPerConnection(1000, 2, 16, 0)).toBe(163);
  // No bound measured: the margin alone.
  expect(headersPerConnection(Number.NaN, 2, 16)).toBe(16);
  expect(headersPerConnection(0, 2, 16, 4)).toBe(4);
});

/** A loopback server that records each request's `header` (`x-signed`) with the socket it came on. */
async function recorder(
  seen: Array<{ socket: number; value: string }>,
  header = 'x-signed',
): Promise<string> {
  const server = createServer((req, res) => {
    seen.push({ socket: req.socket.remotePort ?? 0, value: String(req.headers[header] ?? '') });
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
}

test('behavior: each request has a header of its own, each connection its own signer; what ran short is counted', async () => {
  const seen: Array<{ socket: number; value: string }> = [];
  const url = await recorder(seen);
  const signed = [0, 0, 0];
  const target: Target = {
    url,
    method: 'POST',
    body: '{}',
    signed: {
      header: 'x-signed',
      signers: signed.map((_, i) => () => {
        signed[i] = (signed[i] ?? 0) + 1;
        return `signer${i}-${signed[i]}`;
      }),
    },
  };
  const result = await throughput(target, 1, 3, { presign: 2 });
  // Every signature was made either before the run (2 per connection) or during it, and counted.
  expect(result.signed?.before).toBe(6);
  expect(signed.reduce((a, b) => a + b, 0)).toBe(6 + (result.signed?.during ?? 0));
  expect(result.failures).toBe(0);
  expect(seen.length).toBeGreaterThan(6);
  expect(result.signed?.during).toBeGreaterThan(0);
  // No header twice, and each connection (socket) only ever sent one signer's headers.
  expect(new Set(seen.map((s) => s.value)).size).toBe(seen.length);
  const signerOf = new Map<number, Set<string>>();
  for (const { socket, value } of seen) {
    signerOf.set(socket, (signerOf.get(socket) ?? new Set()).add(value.split('-')[0] ?? ''));
  }
  expect([...signerOf.values()].map((s) => s.size)).toEqual([1, 1, 1]);
  expect(new Set([...signerOf.values()].flatMap((s) => [...s])).size).toBe(3);
});

test('behavior: a signed target needs a signer per connection', async () => {
  const target: Target = {
    url: 'http://127.0.0.1:9/',
    method: 'GET',
    signed: { header: 'x-signed', signers: [() => 'one'] },
  };
  await expect(throughput(target, 1, 2)).rejects.toThrow('1 signers for 2 connections');
});

test('behavior: a header per connection is the same on every request of a connection and differs between them', async () => {
  const seen: Array<{ socket: number; value: string }> = [];
  const url = await recorder(seen, 'authorization');
  const values = ['Bearer a', 'Bearer b', 'Bearer c', 'Bearer unused'];
  const target: Target = {
    url,
    method: 'POST',
    body: '{}',
    headers: { 'content-type': 'application/json' },
    perConnection: { header: 'authorization', values },
  };
  const result = await throughput(target, 1, 3);
  expect(result.failures).toBe(0);
  expect(seen.length).toBeGreaterThan(3);
  const valuesOf = new Map<number, Set<string>>();
  for (const { socket, value } of seen) valuesOf.set(socket, (valuesOf.get(socket) ?? new Set()).add(value));
  // Three connections, one value each, the first three values.
  expect([...valuesOf.values()].map((v) => v.size)).toEqual([1, 1, 1]);
  expect(new Set([...valuesOf.values()].flatMap((v) => [...v]))).toEqual(new Set(values.slice(0, 3)));
  await expect(
    throughput({ ...target, perConnection: { header: 'authorization', values: ['x'] } }, 1, 2),
  ).rejects.toThrow('1 values of authorization for 2 connections');
});
