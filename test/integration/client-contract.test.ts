/**
 * Coverage by construction, through the generated typed client with response validation on
 * (test/support/client-validation.ts): every operation of `generated/openapi.yaml` is called against the real
 * server, each response checked against the contract (a violation rejects the call) and recorded for the
 * coverage gate (`npm run coverage:contract` fails when an operation was never called this way). Streams and
 * bytes go through the client helpers: each chunk against `ChatCompletionChunk`, images, audio and video
 * through their decoders. The documented error statuses are produced for real: a wrong credential (401), a
 * body over the configured limit (413), a body in the wrong media type (415).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MPEGDecoder } from 'mpg123-decoder';
import sharp from 'sharp';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { ContractViolationError, type ServiceClient } from '../../client/index.ts';
import { bundledFfmpegPath } from '../../server/providers/video/local.ts';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { contractValidation, sendOperation, validatingClient } from '../support/client-validation.ts';
import {
  exampleParams as contractExampleParams,
  deref,
  exampleJsonBody,
  listOperations,
  loadBundle,
  mediaOf,
  type Operation,
  type Parameter,
} from '../support/contract.ts';
import { type StartedServer, startServer, TEST_ADMIN_KEY } from '../support/server.ts';
import { installTestUsdc, mintUsdc } from '../support/x402/contracts.ts';
import { evmPaymentHeader } from '../support/x402/payments.ts';
import { evmSignIn } from '../support/x402/siwx.ts';

const ORIGIN = 'https://api.example.test';
const ffprobe = (createRequire(import.meta.url)('@ffprobe-installer/ffprobe') as { path: string }).path;
const doc = loadBundle();
const operations = listOperations(doc);
const validation = contractValidation(doc);
const scratch = mkdtempSync(join(tmpdir(), 'client-contract-'));
let anvil: StartedAnvil;
let asr: Server;
let server: StartedServer;
let admin: ServiceClient;

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  await installTestUsdc(anvil.rpc);
  // A loopback speech-to-text upstream (OpenAI's transcription API shape) for the ASR model.
  asr = createServer((req, res) => {
    req.resume();
    req.on('end', () =>
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ text: 'Welcome aboard.', duration: 1.5 })),
    );
  }).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => asr.once('listening', () => resolve()));
  const catalog = join(scratch, 'catalog.yaml');
  writeFileSync(
    catalog,
    stringify({
      models: {
        'whisper-up': {
          type: 'asr',
          created: 1727740800,
          rateLimits: { paid: { requestsPerMinute: 60 }, partner: { requestsPerMinute: 240 } },
          maxConcurrency: 4,
          provider: {
            kind: 'openai-compatible',
            baseUrl: `http://127.0.0.1:${(asr.address() as AddressInfo).port}/v1`,
            apiKeyEnv: 'ASR_KEY',
            upstreamModel: 'whisper-1',
          },
          model_spec: {
            name: 'Whisper upstream',
            privacy: 'private',
            offline: false,
            pricing: { per_audio_second: '0.0001' },
          },
        },
      },
    }),
  );
  server = await startServer(
    `sqlite:${join(scratch, 'client.db')}`,
    {
      PUBLIC_ORIGIN: ORIGIN,
      JSON_BODY_LIMIT_MB: '1',
      SERVICE_CONFIG: catalog,
      ASR_KEY: 'sk-upstream-asr',
      RPC_UPSTREAM_BASE_MAINNET: anvil.url,
      X402_PAY_TO_BASE: privateKeyToAccount(generatePrivateKey()).address,
      X402_BASE_RPC_URL: anvil.url,
      X402_FACILITATOR_PRIVATE_KEY: ANVIL_PRIVATE_KEYS[0],
    },
    { proxy: false },
  );
  admin = validatingClient({ baseUrl: server.directBase, apiKey: TEST_ADMIN_KEY }, validation);
}, 180_000);

afterAll(async () => {
  await server?.close();
  asr?.closeAllConnections();
  await new Promise<void>((resolve) => (asr ? asr.close(() => resolve()) : resolve()));
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

type Init = {
  params?: {
    path?: Record<string, unknown>;
    query?: Record<string, unknown>;
    header?: Record<string, unknown>;
  };
  body?: unknown;
  headers?: Record<string, string>;
  parseAs?: 'json' | 'text' | 'blob';
  bodySerializer?: (body: unknown) => unknown;
};
type Sent = { status: number; data?: unknown; error?: unknown; response: Response };

/** Calls an operation through the typed client's method for its HTTP verb (validation runs inside). */
function send(client: ServiceClient, op: Operation, init: Init): Promise<Sent> {
  return sendOperation<Sent>(client, op, init).then((sent) => ({ ...sent, status: sent.response.status }));
}

function op(operationId: string): Operation {
  const found = operations.find((o) => o.operationId === operationId);
  if (!found) throw new Error(`no operation ${operationId}`);
  return found;
}

const exampleParams = (operation: Operation) => contractExampleParams(doc, operation);
const exampleBody = (operation: Operation) => exampleJsonBody(doc, operation);

/** Called below through the client's binary helpers or with a multipart body. */
const HELPER_OPERATIONS = new Set(['createSpeech', 'retrieveVideo', 'createTranscription']);

const jsonBodied = operations.filter((o) => {
  const body = o.requestBody ? deref(doc, o.requestBody) : undefined;
  return Boolean(mediaOf(body, 'application/json'));
});

/** What each documented example request gets from a fresh server (the example ids name no stored key or job). */
const EXAMPLE_STATUS: Record<string, number> = {
  createChatCompletion: 200,
  generateImage: 200,
  createImage: 200,
  listImageStyles: 200,
  createEmbedding: 200,
  quoteVideo: 200,
  queueVideo: 200,
  completeVideo: 404,
  createDecision: 200,
  listCharacters: 200,
  getCharacter: 200,
  listModels: 200,
  listModelTraits: 200,
  listModelCompatibilityMapping: 200,
  listApiKeys: 200,
  createApiKey: 200,
  deleteApiKey: 404,
  updateApiKey: 404,
  getApiKey: 404,
  getApiKeyRateLimits: 200,
  listApiKeyRateLimitLogs: 200,
  getBillingBalance: 200,
  getBillingUsageHistory: 200,
  getBillingUsageAnalytics: 200,
  callCryptoRpc: 200,
  listCryptoRpcNetworks: 200,
  // An admin key is no wallet proof, and the top-up without a payment is the x402 challenge.
  getX402Balance: 401,
  listX402Transactions: 401,
  topUpX402Balance: 402,
};

type Account = ReturnType<typeof privateKeyToAccount>;

/** A client for a wallet: a fresh Sign-In-With-X proof for every request. */
function walletClient(account: Account): ServiceClient {
  return validatingClient(
    { baseUrl: server.directBase, signInWithX: () => evmSignIn(account, { origin: ORIGIN }) },
    validation,
  );
}

describe('every operation through the validating typed client', { timeout: 180_000 }, () => {
  test('behavior: the documented example request of every JSON operation gets its answer, within the contract', async () => {
    const statuses: Record<string, number> = {};
    for (const operation of operations) {
      if (HELPER_OPERATIONS.has(operation.operationId)) continue;
      const body = exampleBody(operation);
      const sent = await send(admin, operation, {
        params: exampleParams(operation),
        ...(body === undefined ? {} : { body }),
      });
      statuses[operation.operationId] = sent.status;
    }
    expect(statuses).toEqual(EXAMPLE_STATUS);
    expect(Object.keys(statuses).length + HELPER_OPERATIONS.size).toBe(operations.length);
  });

  test('behavior: an API key is created, read, updated and deleted', async () => {
    const created = await admin.POST('/api_keys', {
      body: { apiKeyType: 'INFERENCE', description: 'client coverage' },
    });
    expect(created.response.status).toBe(200);
    const id = created.data?.data.id as string;
    const read = await admin.GET('/api_keys/{id}', { params: { path: { id } } });
    expect(read.response.status).toBe(200);
    const updated = await admin.PATCH('/api_keys', { body: { id, description: 'renamed' } });
    expect(updated.response.status).toBe(200);
    const deleted = await admin.DELETE('/api_keys', { params: { query: { id } } });
    expect(deleted.response.status).toBe(200);
    expect((await admin.GET('/api_keys/{id}', { params: { path: { id } } })).response.status).toBe(404);
  });

  test('behavior: a streamed chat through the client: every chunk validated, usage and cost last', async () => {
    const chunks = [];
    for await (const chunk of admin.streamChatCompletion({
      model: 'llama-3.3-70b',
      seed: 3,
      max_completion_tokens: 16,
      messages: [{ role: 'user', content: 'Hello stream.' }],
    })) {
      chunks.push(chunk);
    }
    expect(chunks.length).toBeGreaterThan(2);
    expect(chunks.at(-1)?.usage?.completion_tokens).toBeGreaterThan(0);
  });

  test('behavior: images in each format and speech through the binary helpers, read by their decoders', async () => {
    for (const format of ['png', 'jpeg', 'webp'] as const) {
      const image = await admin.generateImageBinary({
        model: 'z-image-turbo',
        prompt: 'a lighthouse',
        format,
        width: 256,
        height: 256,
      });
      expect(image.contentType).toBe(`image/${format}`);
      const meta = await sharp(Buffer.from(await image.blob.arrayBuffer())).metadata();
      expect(meta.format).toBe(format);
      expect([meta.width, meta.height]).toEqual([256, 256]);
    }
    const speech = await admin.createSpeech({ model: 'tts-kokoro', input: 'Welcome aboard.' });
    expect(speech.contentType).toBe('audio/mpeg');
    const decoder = new MPEGDecoder();
    await decoder.ready;
    const decoded = decoder.decode(new Uint8Array(await speech.blob.arrayBuffer()));
    decoder.free();
    expect(decoded.errors).toEqual([]);
    expect(decoded.samplesDecoded).toBeGreaterThan(0);
  });

  test('behavior: the usage history as CSV through the client', async () => {
    const csv = await admin.GET('/billing/usage-history', {
      params: { header: { Accept: 'text/csv' } } as never,
      parseAs: 'text',
    });
    expect(csv.response.status).toBe(200);
    expect(csv.response.headers.get('content-type')).toMatch(/^text\/csv/);
  });

  test('behavior: a video job: PROCESSING, then the MP4 through the helper, then completed', async () => {
    const queued = await admin.POST('/video/queue', {
      body: {
        model: 'wan-2-7-text-to-video',
        prompt: 'quiet snow',
        duration: '5s',
        resolution: '480p',
        audio: false,
      } as never,
    });
    expect(queued.response.status).toBe(200);
    const { queue_id, model } = queued.data as { queue_id: string; model: string };
    expect(await admin.retrieveVideo({ model, queue_id })).toMatchObject({ status: 'PROCESSING' });
    // The job of the example request above may run in the same pass.
    expect(await server.services.video.worker.runOnce()).toBeGreaterThanOrEqual(1);
    const video = await admin.retrieveVideo({ model, queue_id });
    if (!('blob' in video)) throw new Error(`expected the MP4, got ${JSON.stringify(video)}`);
    expect(video.contentType).toBe('video/mp4');
    const bytes = Buffer.from(await video.blob.arrayBuffer());
    expect(bytes.subarray(4, 8).toString('latin1')).toBe('ftyp');
    // Read by the real ffprobe, and every frame decoded by ffmpeg (a broken stream exits non-zero).
    const file = join(scratch, 'video.mp4');
    writeFileSync(file, bytes);
    const probe = JSON.parse(
      execFileSync(ffprobe, ['-v', 'error', '-show_streams', '-of', 'json', file], { encoding: 'utf8' }),
    ) as { streams: { codec_type: string }[] };
    expect(probe.streams.map((stream) => stream.codec_type)).toContain('video');
    execFileSync(bundledFfmpegPath() as string, ['-v', 'error', '-xerror', '-i', file, '-f', 'null', '-']);
    const completed = await admin.POST('/video/complete', { body: { model, queue_id } });
    expect(completed.response.status).toBe(200);
  });

  test('behavior: a transcription (multipart) through the client', async () => {
    const form = new FormData();
    form.append('model', 'whisper-up');
    form.append('file', new Blob([wav(1.5)], { type: 'audio/wav' }), 'hello.wav');
    const sent = await admin.POST('/audio/transcriptions', {
      body: form as never,
      bodySerializer: (body: unknown) => body as FormData,
    });
    expect(sent.response.status, JSON.stringify(sent.error)).toBe(200);
    expect(sent.data).toMatchObject({ text: 'Welcome aboard.' });
  });

  test('behavior: a wallet tops up (402, then paid), and reads its balance and transactions, signed', async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    await mintUsdc(anvil.url, ANVIL_PRIVATE_KEYS[1], account.address, 10_000_000n);
    const anonymous = validatingClient({ baseUrl: server.directBase }, validation);
    const offer = await anonymous.POST('/x402/top-up', { body: { amountUsd: 5 } });
    expect(offer.response.status).toBe(402);
    const payment = await evmPaymentHeader(offer.error, account, '$10');
    const paid = await anonymous.POST('/x402/top-up', {
      body: { amountUsd: 5 },
      headers: { 'PAYMENT-SIGNATURE': payment },
    });
    expect(paid.response.status).toBe(200);
    const wallet = walletClient(account);
    const path = { walletAddress: account.address };
    const balance = await wallet.GET('/x402/balance/{walletAddress}', { params: { path } });
    expect(balance.data?.data.balanceUsd).toBe(5);
    const chat = await wallet.POST('/chat/completions', {
      body: { model: 'llama-3.3-70b', max_completion_tokens: 8, messages: [{ role: 'user', content: 'Hi' }] },
    });
    expect(chat.response.status).toBe(200);
    const transactions = await wallet.GET('/x402/transactions/{walletAddress}', { params: { path } });
    expect(transactions.data?.data.transactions[0]?.type).toBe('CHARGE');
    // Another wallet's records are refused.
    const other = { walletAddress: privateKeyToAccount(generatePrivateKey()).address };
    expect(
      (await wallet.GET('/x402/balance/{walletAddress}', { params: { path: other } })).response.status,
    ).toBe(403);
    expect(
      (await wallet.GET('/x402/transactions/{walletAddress}', { params: { path: other } })).response.status,
    ).toBe(403);
  });
});

describe('documented error statuses, produced for real through the client', { timeout: 180_000 }, () => {
  test('behavior: 401 for a wrong credential on every operation that takes one', async () => {
    const wrongKey = validatingClient(
      { baseUrl: server.directBase, apiKey: 'svc_inference_not_a_key_0000000000000000000000' },
      validation,
    );
    const wrongWallet = validatingClient(
      { baseUrl: server.directBase, signInWithX: Buffer.from('{"address":"0x0"}').toString('base64') },
      validation,
    );
    const refused: string[] = [];
    for (const operation of operations) {
      const schemes = operation.security.flatMap((r) => Object.keys(r));
      if (schemes.length === 0 || !operation.responses['401']) continue;
      const client = schemes.includes('BearerAuth') ? wrongKey : wrongWallet;
      const body = exampleBody(operation);
      const sent =
        operation.operationId === 'createTranscription'
          ? await send(client, operation, { body: transcriptionForm(), bodySerializer: (b) => b })
          : await send(client, operation, {
              params: exampleParams(operation),
              ...(body === undefined ? {} : { body }),
              ...(HELPER_OPERATIONS.has(operation.operationId) ? { parseAs: 'blob' as const } : {}),
            });
      if (sent.status === 401) refused.push(operation.operationId);
    }
    const expected = operations
      .filter((o) => o.security.some((r) => Object.keys(r).length > 0) && o.responses['401'])
      .map((o) => o.operationId);
    expect(refused).toEqual(expected);
  });

  test('behavior: 413 for a body over the limit and 415 for a body in another media type, on every operation with a body', async () => {
    const tooLarge: string[] = [];
    const wrongType: string[] = [];
    const padding = 'x'.repeat(1024 * 1024 + 1);
    for (const operation of jsonBodied) {
      const params = exampleParams(operation);
      const large = await send(admin, operation, {
        params,
        body: { ...(exampleBody(operation) as object), padding },
      });
      if (large.status === 413) tooLarge.push(operation.operationId);
      const text = await send(admin, operation, {
        params,
        body: JSON.stringify(exampleBody(operation)),
        bodySerializer: (b) => b,
        headers: { 'content-type': 'text/plain' },
      });
      if (text.status === 415) wrongType.push(operation.operationId);
    }
    const transcription = op('createTranscription');
    const huge = new FormData();
    huge.append('model', 'whisper-up');
    huge.append('file', new Blob([new Uint8Array(25 * 1024 * 1024 + 1)], { type: 'audio/wav' }), 'big.wav');
    if ((await send(admin, transcription, { body: huge, bodySerializer: (b) => b })).status === 413)
      tooLarge.push('createTranscription');
    const json = await send(admin, transcription, { body: { model: 'whisper-up' } });
    if (json.status === 415) wrongType.push('createTranscription');

    const documented = (status: string) =>
      operations.filter((o) => o.requestBody && o.responses[status]).map((o) => o.operationId);
    expect(tooLarge.sort()).toEqual(documented('413').sort());
    expect(wrongType.sort()).toEqual(documented('415').sort());
  });

  test('behavior: 400 for a request outside the contract on every operation', async () => {
    const refused: string[] = [];
    const withInput: string[] = [];
    for (const operation of operations) {
      if (!operation.responses['400']) continue;
      const params = exampleParams(operation);
      const parameters = operation.parameters as Parameter[];
      // A query parameter whose values are constrained (an enum, a number, a boolean).
      const query = parameters.find((p) => {
        const schema = p.schema ? deref<Record<string, unknown>>(doc, p.schema) : undefined;
        return (
          p.in === 'query' &&
          (['enum', 'format', 'pattern', 'anyOf', 'oneOf'].some((k) => schema?.[k] !== undefined) ||
            ['integer', 'number', 'boolean'].includes(String(schema?.type)))
        );
      });
      const path = parameters.find((p) => p.in === 'path');
      let init: Init | undefined;
      if (operation.operationId === 'createTranscription') {
        const form = new FormData();
        form.append('model', 'whisper-up'); // no file
        init = { body: form, bodySerializer: (b) => b };
      } else if (operation.requestBody) {
        // An array where the contract wants an object.
        init = { params, body: [] };
      } else if (query) {
        init = { params: { ...params, query: { ...params.query, [query.name]: 'not a valid value %%' } } };
      } else if (path) {
        init = { params: { ...params, path: { ...params.path, [path.name]: 'not a valid value %%' } } };
      } else {
        // A query parameter the operation does not declare.
        init = { params: { ...params, query: { undeclared_parameter: '1' } } };
      }
      withInput.push(operation.operationId);
      const walletOnly = operation.security.every((r) => 'siwx' in r);
      const client = walletOnly ? walletClient(privateKeyToAccount(generatePrivateKey())) : admin;
      const sent = await send(client, operation, {
        ...init,
        ...(HELPER_OPERATIONS.has(operation.operationId) ? { parseAs: 'blob' as const } : {}),
      });
      if (sent.status === 400) refused.push(operation.operationId);
    }
    expect(refused).toEqual(withInput);
    expect(refused).toEqual(operations.filter((o) => o.responses['400']).map((o) => o.operationId));
  });

  test('fault: a response outside the contract rejects the client call (a field of another type)', async () => {
    const changed = structuredClone(doc);
    const modelList = changed.components.schemas?.ModelList as { properties: Record<string, unknown> };
    modelList.properties.data = { type: 'string' };
    const strict = validatingClient(
      { baseUrl: server.directBase },
      contractValidation(changed, { record: false }),
    );
    await expect(strict.GET('/models')).rejects.toBeInstanceOf(ContractViolationError);
    await expect(strict.GET('/models')).rejects.toThrow(/listModels 200 violates the contract/);
  });
});

/** A short WAV of silence at 16 kHz. */
function wav(seconds: number): Uint8Array<ArrayBuffer> {
  const samples = Math.round(16000 * seconds);
  const buffer = Buffer.alloc(44 + samples * 2);
  buffer.write('RIFF', 0, 'latin1');
  buffer.writeUInt32LE(36 + samples * 2, 4);
  buffer.write('WAVEfmt ', 8, 'latin1');
  buffer.writeUInt32LE(16, 16);
  buffer.writeUInt16LE(1, 20);
  buffer.writeUInt16LE(1, 22);
  buffer.writeUInt32LE(16000, 24);
  buffer.writeUInt32LE(32000, 28);
  buffer.writeUInt16LE(2, 32);
  buffer.writeUInt16LE(16, 34);
  buffer.write('data', 36, 'latin1');
  buffer.writeUInt32LE(samples * 2, 40);
  const bytes = new Uint8Array(buffer.length);
  bytes.set(buffer);
  return bytes;
}

function transcriptionForm(): FormData {
  const form = new FormData();
  form.append('model', 'whisper-up');
  form.append('file', new Blob([wav(1)], { type: 'audio/wav' }), 'hello.wav');
  return form;
}
