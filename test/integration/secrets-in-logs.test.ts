/**
 * Secrets never reach the logs: the server process as `npm start` runs it (server/main.ts, its pino logger
 * and redaction), at LOG_LEVEL=trace, on a real PostgreSQL whose DATABASE_URL carries a password, with
 * upstream API keys in the provider configuration, facilitator private keys for Base and Solana, and RPC node
 * URLs with credentials. A realistic session goes through it: the ADMIN key, an admin-created key, a wrong key,
 * Sign-In-With-X proofs, a signed x402 payment, upstreams that fail and echo the key they were sent. Then the
 * captured stdout and stderr are scanned for every secret used, raw and in obvious encodings (base64,
 * base64url, percent-encoding, hex). The answers to clients are scanned for the server's own secrets too.
 * A second start with an unreachable DATABASE_URL checks the start-up failure path.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodePaymentSignatureHeader } from '@x402/core/http';
import { encodeBase58 } from '@x402/extensions/sign-in-with-x';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import { repoRoot } from '../support/contract.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';
import { freePort } from '../support/process.ts';
import { sendBytes } from '../support/raw-http.ts';
import { startServerProcess, stopServerProcesses } from '../support/server-process.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const scratch = mkdtempSync(join(tmpdir(), 'secrets-'));
const ORIGIN = 'https://api.example.test';
const token = (prefix: string) => `${prefix}${randomBytes(18).toString('hex')}`;

/** Every secret the session uses, by name. */
const secrets = {
  adminKey: token('svc_admin_logscan_'),
  wrongKey: token('svc_wrong_'),
  upstreamKey: token('sk-upstream-'),
  rpcPathKey: token('rpcpathkey'),
  rpcPassword: token('rpcpass'),
  facilitatorKey: generatePrivateKey(),
  solanaFacilitatorKey: solanaSecretKey(),
} as Record<string, string>;

/** A base58 64-byte Solana secret key (seed and public key), as X402_SOLANA_FACILITATOR_PRIVATE_KEY takes it. */
function solanaSecretKey(): string {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url');
  const pub = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url');
  return encodeBase58(new Uint8Array(Buffer.concat([seed, pub])));
}

/** The forms a secret could take in a log line. */
function encodings(secret: string): string[] {
  const forms = new Set([
    secret,
    Buffer.from(secret).toString('base64'),
    Buffer.from(secret).toString('base64url'),
    encodeURIComponent(secret),
    Buffer.from(secret).toString('hex'),
  ]);
  if (/^0x[0-9a-f]+$/i.test(secret)) forms.add(secret.slice(2));
  // Base64 of a secret inside a longer value is shifted: also look for the middle of each form.
  return [...forms].filter((f) => f.length >= 16);
}

/** The names of the secrets found in `text`, with the form found. */
function leaks(text: string): string[] {
  const found: string[] = [];
  for (const [name, secret] of Object.entries(secrets)) {
    for (const form of encodings(secret)) {
      const at = text.indexOf(form);
      if (at >= 0) found.push(`${name} in …${text.slice(Math.max(0, at - 200), at + form.length + 40)}…`);
    }
  }
  return found;
}

// ---------------------------------------------------------------------------------------------------------
// Loopback upstreams that misbehave the way real ones do: refuse a key and echo it back, fail with 500.

let fake: Server;
let fakeBase = '';
const seenAuthorization: string[] = [];

function route(req: IncomingMessage, res: ServerResponse) {
  req.resume();
  seenAuthorization.push(String(req.headers.authorization ?? ''));
  const url = req.url ?? '';
  const key = String(req.headers.authorization ?? '').replace(/^Bearer /, '');
  if (url.startsWith('/echo401/')) {
    res.writeHead(401, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({ error: { message: `Incorrect API key provided: ${key}`, code: 'invalid_api_key' } }),
    );
    return;
  }
  if (url.startsWith('/echo500/')) {
    res.writeHead(500, { 'content-type': 'text/plain' });
    res.end(`internal error while serving key ${key} at ${url}`);
    return;
  }
  // RPC nodes (their URLs carry a key): answer garbage that echoes the request URL.
  res.writeHead(502, { 'content-type': 'text/html' });
  res.end(`<html>bad gateway for ${url} (${key})</html>`);
}

// ---------------------------------------------------------------------------------------------------------
// The server process.

/** The real `server/main.ts`, as an operator runs it, logging everything (`LOG_LEVEL=trace`). */
const start = (env: Record<string, string>, options: { listening?: number } = {}) =>
  startServerProcess({ NODE_ENV: 'development', LOG_LEVEL: 'trace', ...env }, options);

const postgres = postgresPerFile();

beforeAll(async () => {
  fake = createServer(route).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => fake.once('listening', () => resolve()));
  fakeBase = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  secrets.databasePassword = decodeURIComponent(new URL(postgres().url).password);
}, 120_000);

afterAll(async () => {
  await stopServerProcesses();
  fake?.closeAllConnections();
  await new Promise<void>((resolve) => (fake ? fake.close(() => resolve()) : resolve()));
  rmSync(scratch, { recursive: true, force: true });
});

/** A catalogue override: llama-like models on upstreams that refuse the key and echo it, or fail with 500. */
function serviceConfig(): string {
  const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
    models: Record<string, Record<string, unknown>>;
  };
  const llama = defaults.models['llama-3.3-70b'] as Record<string, unknown>;
  const upstream = (path: string) => ({
    kind: 'openai-compatible',
    name: path,
    baseUrl: `${fakeBase}/${path}/v1`,
    apiKeyEnv: 'LEAK_TEST_UPSTREAM_KEY',
  });
  const file = join(scratch, 'service.yaml');
  writeFileSync(
    file,
    stringify({
      models: {
        'echo401-model': { ...llama, provider: upstream('echo401') },
        'echo500-model': { ...llama, provider: upstream('echo500') },
        // The media adapters too: embeddings, images, speech and transcription on upstreams that echo the key.
        'text-embedding-bge-m3': {
          ...defaults.models['text-embedding-bge-m3'],
          provider: upstream('echo401'),
        },
        'z-image-turbo': { ...defaults.models['z-image-turbo'], provider: upstream('echo500') },
        'tts-kokoro': { ...defaults.models['tts-kokoro'], provider: upstream('echo500') },
        'openai/whisper-large-v3': {
          ...defaults.models['openai/whisper-large-v3'],
          provider: upstream('echo401'),
        },
      },
    }),
  );
  return file;
}

describe('secrets never appear in logs', () => {
  test('behavior: a realistic session at LOG_LEVEL=trace writes none of the secrets it used, in any encoding', {
    timeout: 180_000,
  }, async () => {
    const wallet = privateKeyToAccount(generatePrivateKey());
    const payer = privateKeyToAccount(generatePrivateKey());
    const databaseUrl = await postgres().createDatabase('secrets');
    const server = await start({
      DATABASE_URL: databaseUrl,
      ADMIN_API_KEY: secrets.adminKey as string,
      PUBLIC_ORIGIN: ORIGIN,
      SERVICE_CONFIG: serviceConfig(),
      LEAK_TEST_UPSTREAM_KEY: secrets.upstreamKey as string,
      UPSTREAM_TIMEOUT_MS: '5000',
      RPC_UPSTREAM_BASE_MAINNET: `http://rpcuser:${secrets.rpcPassword}@127.0.0.1:${new URL(fakeBase).port}/v2/${secrets.rpcPathKey}`,
      X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
      X402_BASE_RPC_URL: `${fakeBase}/base-rpc/${secrets.rpcPathKey}`,
      X402_FACILITATOR_PRIVATE_KEY: secrets.facilitatorKey as string,
      X402_PAY_TO_SOLANA: 'CKy5mRJcBbXnBkchNsqWvmALmLWJd5Vq1U2H7oWyTtBx',
      X402_SOLANA_RPC_URL: `${fakeBase}/solana-rpc/${secrets.rpcPathKey}`,
      X402_SOLANA_FACILITATOR_PRIVATE_KEY: secrets.solanaFacilitatorKey as string,
    });
    const answers: string[] = [];
    const call = async (path: string, init: RequestInit = {}) => {
      const response = await fetch(`${server.base}${path}`, init).catch((error: unknown) => {
        throw new Error(`${path}: ${String(error)}\n${server.output().slice(-3000)}`);
      });
      const text = await response.text();
      answers.push(text);
      return { status: response.status, text, headers: response.headers };
    };
    const json = (key: string, body: unknown, extra: Record<string, string> = {}): RequestInit => ({
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...extra },
      body: JSON.stringify(body),
    });
    const admin = { authorization: `Bearer ${secrets.adminKey}` };

    // The ADMIN key, and a key it creates.
    expect((await call('/billing/balance', { headers: admin })).status).toBe(200);
    const created = await call(
      '/api_keys',
      json(secrets.adminKey as string, { apiKeyType: 'INFERENCE', description: 'log scan' }),
    );
    expect(created.status).toBe(200);
    secrets.createdKey = (JSON.parse(created.text) as { data: { apiKey: string } }).data.apiKey;
    const chat = { model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 };
    expect((await call('/chat/completions', json(secrets.createdKey, chat))).status).toBe(200);
    // A wrong key, a key on an admin-only route, a malformed header.
    expect(
      (await call('/billing/balance', { headers: { authorization: `Bearer ${secrets.wrongKey}` } })).status,
    ).toBe(401);
    expect(
      (await call('/billing/balance', { headers: { authorization: `Bearer ${secrets.createdKey}` } })).status,
    ).toBe(401);
    expect((await call('/models', { headers: { authorization: `Basic ${secrets.wrongKey}` } })).status).toBe(
      401,
    );
    // Upstreams that refuse the key and echo it, or fail with it in the text.
    const refused = await call(
      '/chat/completions',
      json(secrets.createdKey, { ...chat, model: 'echo401-model' }),
    );
    expect(refused.status).toBeGreaterThanOrEqual(500);
    const failed = await call(
      '/chat/completions',
      json(secrets.createdKey, { ...chat, model: 'echo500-model', stream: true }),
    );
    expect(failed.status).toBeGreaterThanOrEqual(500);
    const media: [string, RequestInit][] = [
      ['/embeddings', json(secrets.createdKey, { model: 'text-embedding-bge-m3', input: 'hello' })],
      ['/image/generate', json(secrets.createdKey, { model: 'z-image-turbo', prompt: 'a lighthouse' })],
      ['/audio/speech', json(secrets.createdKey, { model: 'tts-kokoro', input: 'hello', voice: 'af_sky' })],
    ];
    const form = new FormData();
    form.set('model', 'openai/whisper-large-v3');
    form.set('file', new Blob([Buffer.from('RIFF0000WAVEfmt ')], { type: 'audio/wav' }), 'a.wav');
    media.push([
      '/audio/transcriptions',
      { method: 'POST', headers: { authorization: `Bearer ${secrets.createdKey}` }, body: form },
    ]);
    for (const [path, init] of media) {
      const answer = await call(path, init);
      expect(answer.status, `${path}: ${answer.text.slice(0, 200)}`).toBeGreaterThanOrEqual(400);
    }
    expect(
      seenAuthorization.filter((h) => h === `Bearer ${secrets.upstreamKey}`).length,
    ).toBeGreaterThanOrEqual(6);
    // An RPC node whose URL carries credentials, answering garbage.
    const rpc = await call(
      '/crypto/rpc/base-mainnet',
      json(secrets.adminKey as string, { jsonrpc: '2.0', id: 1, method: 'eth_blockNumber' }),
    );
    expect(rpc.status).toBeGreaterThanOrEqual(500);
    // Sign-In-With-X: a good proof, a replayed one, one for the wrong wallet.
    const proof = await evmSignIn(wallet, { origin: ORIGIN });
    secrets.siwxHeader = proof;
    secrets.siwxSignature = (
      JSON.parse(Buffer.from(proof, 'base64').toString()) as { signature: string }
    ).signature;
    expect(
      (await call(`/x402/balance/${wallet.address}`, { headers: { 'sign-in-with-x': proof } })).status,
    ).toBe(200);
    expect(
      (await call(`/x402/balance/${wallet.address}`, { headers: { 'sign-in-with-x': proof } })).status,
    ).toBe(401);
    expect(
      (
        await call(`/x402/balance/${payer.address}`, {
          headers: { 'x-sign-in-with-x': await evmSignIn(wallet, { origin: ORIGIN }) },
        })
      ).status,
    ).toBe(403);
    // A signed x402 payment: verification needs the Base node, which answers garbage.
    const offer = await call('/x402/top-up', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amountUsd: 5 }),
    });
    expect(offer.status).toBe(402);
    const payment = await evmPaymentHeader(JSON.parse(offer.text), payer);
    secrets.paymentHeader = payment;
    secrets.paymentSignature = (
      decodePaymentSignatureHeader(payment).payload as { signature: string }
    ).signature;
    const paid = await call('/x402/top-up', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'payment-signature': payment },
      body: JSON.stringify({ amountUsd: 5 }),
    });
    expect(paid.status).toBeGreaterThanOrEqual(400);
    // A payment header where none belongs.
    expect(
      (await call('/chat/completions', json(secrets.createdKey, chat, { 'x-payment': payment }))).status,
    ).toBe(400);

    // What Node's HTTP parser refuses (here a secret inside oversized headers) is answered in the error shape
    // by main.ts too (server/http/client-errors.ts), and written nowhere.
    const origin = server.origin;
    const refusedRaw = await sendBytes(
      origin,
      `GET /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${secrets.adminKey}\r\nX-Big: ${'a'.repeat(64 * 1024)}\r\n\r\n`,
    );
    expect(refusedRaw).toMatch(/^HTTP\/1\.1 431 /);
    expect(JSON.parse(refusedRaw.slice(refusedRaw.indexOf('\r\n\r\n') + 4))).toMatchObject({
      code: 'HEADERS_TOO_LARGE',
    });

    server.signal('SIGTERM');
    expect(await server.exited).toBe(0);
    const output = server.output();
    // The session was logged (request lines, upstream failures), so an empty log cannot pass.
    const lines = output.split('\n').filter((l) => l.startsWith('{'));
    expect(lines.length).toBeGreaterThan(15);
    expect(output).toContain('"msg":"request"');
    expect(leaks(output)).toEqual([]);
    // The server's own secrets never reach a client either (an echoing upstream, an RPC URL with a key).
    const serverSecrets = [
      'upstreamKey',
      'rpcPathKey',
      'rpcPassword',
      'facilitatorKey',
      'solanaFacilitatorKey',
      'databasePassword',
    ];
    expect(
      leaks(answers.join('\n')).filter((l) => serverSecrets.some((s) => l.startsWith(`${s} in `))),
    ).toEqual([]);
  });

  test('behavior: a start-up that cannot reach PostgreSQL logs the failure without the password', {
    timeout: 60_000,
  }, async () => {
    const password = token('pgpass');
    secrets.unreachablePassword = password;
    const failed = await start(
      {
        DATABASE_URL: `postgres://svc:${password}@127.0.0.1:${await freePort()}/svc`,
        ADMIN_API_KEY: secrets.adminKey as string,
      },
      { listening: 0 },
    );
    expect(await failed.exited).not.toBe(0);
    expect(failed.output()).toMatch(/start-up failed|unreachable/i);
    expect(leaks(failed.output())).toEqual([]);
  });
});
