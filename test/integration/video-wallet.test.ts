/**
 * Video jobs and decisions paid by a wallet (Sign-In-With-X) through the real server: the queue charge and the
 * refund of a failed job appear in the wallet's `/x402/transactions`, the video is retrieved with a wallet
 * proof, a decision is charged to the wallet, and a wallet without enough credit gets the wallet 402.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { parseUsdToNano } from '../../server/money.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const ORIGIN = 'https://api.example.test';

// biome-ignore lint/suspicious/noExplicitAny: response bodies as the tests read them; assertions check the shape.
type Json = any;

let server: ChatServer;
let refusing: Server;

/** A job-based upstream that accepts every job and then refuses it under its content policy. */
function refuse(req: IncomingMessage, res: ServerResponse) {
  req.resume();
  req.on('end', () => {
    res.writeHead(req.url === '/v1/video/queue' ? 200 : 422, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify(
        req.url === '/v1/video/queue' ? { queue_id: 'up-1' } : { error: 'Refused by policy', code: 'X' },
      ),
    );
  });
}

beforeAll(async () => {
  refusing = createServer(refuse).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => refusing.once('listening', () => resolve()));
  const baseUrl = `http://127.0.0.1:${(refusing.address() as AddressInfo).port}/v1`;
  server = await startChatServer({
    env: {
      PUBLIC_ORIGIN: ORIGIN,
      X402_PAY_TO_BASE: '0x7a3B9c2D1e4F5a6B7c8D9e0F1a2B3c4D5e6F7a8B',
      VIDEO_UPSTREAM_POLL_MS: '20',
    },
    catalogYaml: stringify({
      models: {
        'video-refuses': {
          type: 'video',
          created: 1761955200,
          provider: { kind: 'openai-compatible', baseUrl, upstreamModel: 'refuses' },
          rateLimits: { paid: { requestsPerMinute: 40 }, partner: { requestsPerMinute: 160 } },
          maxConcurrency: 4,
          video: { pricePerSecond: { '480p': '0.05' } },
          model_spec: {
            name: 'Refusing video',
            description: 'Always refused upstream.',
            modelSource: 'test',
            privacy: 'private',
            offline: false,
            constraints: {
              model_type: 'text-to-video',
              aspect_ratios: ['16:9'],
              resolutions: ['480p'],
              durations: ['5s'],
              audio: false,
              audio_configurable: false,
            },
          },
        },
      },
    }),
  });
});

afterAll(async () => {
  await server?.close();
  refusing?.closeAllConnections();
  await new Promise<void>((resolve) => (refusing ? refusing.close(() => resolve()) : resolve()));
});

async function wallet(usd: string) {
  const account = privateKeyToAccount(generatePrivateKey());
  const { account: row } = await server.services.accounts.findOrCreateWalletAccount(account.address);
  if (usd !== '0') {
    await server.services.ledger.topUp({
      accountId: row.id,
      amountNano: parseUsdToNano(usd),
      network: 'eip155:8453',
      txHash: `0x${account.address.slice(2)}`,
    });
  }
  return { account, accountId: row.id };
}

type Account = ReturnType<typeof privateKeyToAccount>;

const signed = async (account: Account, path: string, body?: unknown) =>
  fetch(`${server.base}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: {
      'content-type': 'application/json',
      'SIGN-IN-WITH-X': await evmSignIn(account, { origin: ORIGIN }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });

describe('wallet-paid video and decisions', () => {
  test('behavior: a wallet queues, the charge is in its transactions, and it retrieves the MP4 with a wallet proof', async () => {
    const { account } = await wallet('5');
    const queued = await signed(account, '/video/queue', {
      model: 'wan-2-7-text-to-video',
      prompt: 'a wallet-paid sunrise',
      duration: '5s',
      resolution: '480p',
      audio: false,
    });
    expect(queued.status).toBe(200);
    const job = (await queued.json()) as { queue_id: string; model: string };
    const history = (await (await signed(account, `/x402/transactions/${account.address}`)).json()) as Json;
    expect(history.data.transactions[0]).toMatchObject({ type: 'CHARGE', amount: -0.25, modelId: job.model });

    await server.services.video.worker.runOnce();
    const done = await signed(account, '/video/retrieve', job);
    expect(done.headers.get('content-type')).toBe('video/mp4');
    expect(
      Buffer.from(await done.arrayBuffer())
        .subarray(4, 8)
        .toString('latin1'),
    ).toBe('ftyp');
  });

  test('behavior: a failed job is refunded to the wallet: a REFUND in its transactions, the balance restored', async () => {
    const { account, accountId } = await wallet('5');
    const queued = await signed(account, '/video/queue', {
      model: 'video-refuses',
      prompt: 'anything',
      duration: '5s',
      resolution: '480p',
    });
    expect(queued.status).toBe(200);
    const job = (await queued.json()) as { queue_id: string; model: string };
    await server.services.video.worker.runOnce();
    const failed = await signed(account, '/video/retrieve', job);
    expect(failed.status).toBe(422);
    expect(await failed.json()).toMatchObject({ creditsRefunded: true });
    const history = (await (await signed(account, `/x402/transactions/${account.address}`)).json()) as Json;
    expect(history.data.transactions.map((t: Json) => [t.type, t.amount])).toEqual([
      ['REFUND', 0.25],
      ['CHARGE', -0.25],
      ['TOP_UP', 5],
    ]);
    expect((await server.services.ledger.getBalance(accountId)).usdNano).toBe(parseUsdToNano('5'));
  });

  test('behavior: a decision is charged to the wallet', async () => {
    const { account, accountId } = await wallet('1');
    const res = await signed(account, '/decisions', {
      model: 'jev-latest',
      state: 'The parcel arrived broken.',
      questions: { complaint: { type: 'noul', instructions: 'The customer is complaining.' } },
    });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { usage: { input_tokens: number } };
    const balance = await server.services.ledger.getBalance(accountId);
    expect(balance.usdNano).toBe(parseUsdToNano('1') - BigInt(body.usage.input_tokens) * 42n);
  });

  test('behavior: a wallet whose credit does not cover the video -> 402 wallet body, nothing charged or queued', async () => {
    const { account, accountId } = await wallet('0.2');
    const res = await signed(account, '/video/queue', {
      model: 'wan-2-7-text-to-video',
      prompt: 'too dear',
      duration: '10s',
      resolution: '1080p',
    });
    expect(res.status).toBe(402);
    expect(res.headers.get('payment-required')).toBeTruthy();
    expect((await server.services.ledger.getBalance(accountId)).usdNano).toBe(parseUsdToNano('0.2'));
    expect(await server.services.video.worker.runOnce()).toBe(0);
  });
});
