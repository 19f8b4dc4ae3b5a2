/**
 * The mock server: Prism serves the whole contract from generated/openapi.yaml, and this small front adds
 * what Prism cannot do, a real Server-Sent Events stream for `POST /chat/completions` with `"stream": true`.
 *
 * Every request goes to Prism, which validates it (shape, security) and answers from the spec's examples. A
 * streamed chat request is sent to Prism as a JSON request first, so an invalid or unauthenticated one gets
 * Prism's documented error; a valid one gets the chunk examples of `ChatCompletionChunk` as `data:` frames,
 * then `data: [DONE]`. The front also accepts paths with or without the `/api/v1` base path.
 */
import { readFileSync } from 'node:fs';
import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  request,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { accepts, isPublic, loadContract } from '../server/http/spec.ts';
import { startPrism } from './prism.ts';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const BASE_PATH = '/api/v1';
const MAX_BODY_BYTES = 40 * 1024 * 1024;

export type MockOptions = {
  /** Port of the front; 0 picks a free one. */
  port?: number;
  host?: string;
  /** The bundled spec Prism serves. */
  specPath?: string;
  /** Pause between streamed frames, so that clients really see a stream. */
  frameDelayMs?: number;
  /** Receives Prism's log lines and the front's own. */
  log?: (line: string) => void;
};

export type RunningMock = {
  /** Base URL including `/api/v1`. */
  url: string;
  port: number;
  /** Pid of the Prism child process. */
  prismPid: number;
  close(): Promise<void>;
};

type ChunkLike = { model?: unknown } & Record<string, unknown>;

/** Reads the streamed frames the mock serves: the `examples` of the `ChatCompletionChunk` schema. */
export function loadChunkExamples(specPath: string): ChunkLike[] {
  const doc = parse(readFileSync(specPath, 'utf8')) as {
    components?: { schemas?: Record<string, { examples?: unknown }> };
  };
  const examples = doc.components?.schemas?.ChatCompletionChunk?.examples;
  if (!Array.isArray(examples) || examples.length < 2) {
    throw new Error(`${specPath}: components.schemas.ChatCompletionChunk.examples must list a whole stream`);
  }
  return examples as ChunkLike[];
}

/**
 * The x402 discovery body the contract documents for an inference operation called without credentials (the
 * example of the shared 402 response that carries `x402Version`).
 */
export function loadDiscoveryExample(specPath: string): Record<string, unknown> {
  const doc = parse(readFileSync(specPath, 'utf8')) as {
    components?: {
      responses?: Record<string, { content?: Record<string, { examples?: Record<string, unknown> }> }>;
    };
  };
  const examples = doc.components?.responses?.PaymentRequired?.content?.['application/json']?.examples ?? {};
  for (const example of Object.values(examples)) {
    const value = (example as { value?: unknown }).value;
    if (value && typeof value === 'object' && 'x402Version' in value) return value as Record<string, unknown>;
  }
  throw new Error(`${specPath}: the PaymentRequired response documents no x402 discovery example`);
}

/** The `PAYMENT-REQUIRED` header: base64 of the x402 `PaymentRequired` part of a discovery body. */
export function paymentRequiredHeader(body: Record<string, unknown>): string {
  const { authOptions: _authOptions, ...paymentRequired } = body;
  return Buffer.from(JSON.stringify(paymentRequired)).toString('base64');
}

const CREDENTIAL_HEADERS = ['authorization', 'sign-in-with-x', 'x-sign-in-with-x'];

/** Renders chunks as the frames of an event stream, ending with `data: [DONE]`. */
export function renderChunkFrames(chunks: readonly unknown[]): string[] {
  return [...chunks.map((chunk) => `data: ${JSON.stringify(chunk)}\n\n`), 'data: [DONE]\n\n'];
}

export async function startMock(options: MockOptions = {}): Promise<RunningMock> {
  const specPath = options.specPath ?? join(root, 'generated', 'openapi.yaml');
  const host = options.host ?? '127.0.0.1';
  const log = options.log ?? ((line: string) => process.stdout.write(`${line}\n`));
  const chunks = loadChunkExamples(specPath);
  const contract = loadContract(specPath);
  const discovery = loadDiscoveryExample(specPath);
  const prism = await startPrism({ mode: 'mock', specPath, host, log });
  const prismPort = prism.port;

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      log(`mock front: ${error instanceof Error ? error.message : String(error)}`);
      if (!res.headersSent) sendJson(res, 502, { error: 'The mock front could not reach Prism' });
      else res.destroy();
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? '/';
    const path =
      url === BASE_PATH || url.startsWith(`${BASE_PATH}/`) || url.startsWith(`${BASE_PATH}?`)
        ? url.slice(BASE_PATH.length) || '/'
        : url;
    const body = await readBody(req);
    if (body === undefined) {
      sendJson(res, 413, { error: 'Request body too large for the mock' });
      return;
    }
    const pathname = path.split('?')[0] ?? '/';
    const op = contract.match(req.method ?? 'GET', pathname);
    if (
      op?.declaresPaymentRequired &&
      !isPublic(op) &&
      !CREDENTIAL_HEADERS.some((name) => req.headers[name])
    ) {
      // As the server does: no credentials on an inference operation is 402 with how to pay or sign in.
      res.writeHead(402, {
        'content-type': 'application/json; charset=utf-8',
        'payment-required': paymentRequiredHeader(discovery),
        'access-control-allow-origin': '*',
        'access-control-expose-headers': 'PAYMENT-REQUIRED',
      });
      res.end(JSON.stringify(discovery));
      return;
    }
    if (req.method === 'POST' && pathname === '/chat/completions') {
      const requested = parseJson(body);
      if (isStreamRequest(requested)) {
        await streamChat(req, res, path, body, requested);
        return;
      }
    }
    // As the server does: an operation that takes no credentials ignores any sent (Prism would answer 401,
    // which such an operation does not document).
    if (op && !accepts(op, 'BearerAuth') && !accepts(op, 'siwx')) {
      for (const name of CREDENTIAL_HEADERS) delete req.headers[name];
    }
    const upstream = await forward(req, path, body);
    res.writeHead(upstream.statusCode ?? 502, withRealHeaders(upstream.headers));
    upstream.pipe(res);
  }

  async function streamChat(
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
    body: Buffer,
    requested: { model?: unknown },
  ): Promise<void> {
    // Prism validates the request and checks its credentials as for a JSON answer.
    const check = await forward(req, path, body, { accept: 'application/json' });
    const status = check.statusCode ?? 502;
    if (status < 200 || status >= 300) {
      res.writeHead(status, withRealHeaders(check.headers));
      check.pipe(res);
      return;
    }
    check.resume();
    const headers = { ...check.headers };
    for (const name of ['content-type', 'content-length', 'content-encoding', 'transfer-encoding']) {
      delete headers[name];
    }
    res.writeHead(200, {
      ...headers,
      'access-control-allow-origin': '*',
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    });
    const model = typeof requested.model === 'string' ? requested.model : undefined;
    const frames = renderChunkFrames(chunks.map((chunk) => (model ? { ...chunk, model } : chunk)));
    let closed = false;
    res.on('close', () => {
      closed = true;
    });
    for (const frame of frames) {
      if (closed) return;
      res.write(frame);
      if (options.frameDelayMs) await sleep(options.frameDelayMs);
    }
    res.end();
  }

  function forward(
    req: IncomingMessage,
    path: string,
    body: Buffer,
    override: Record<string, string> = {},
  ): Promise<IncomingMessage> {
    const headers = { ...req.headers, ...override, host: `${host}:${prismPort}` };
    delete headers['content-length'];
    if (body.length > 0) headers['content-length'] = String(body.length);
    return new Promise((resolvePromise, reject) => {
      const upstream = request({ host, port: prismPort, method: req.method, path, headers }, resolvePromise);
      upstream.on('error', reject);
      upstream.end(body);
    });
  }

  await new Promise<void>((resolvePromise, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 4010, host, () => resolvePromise());
  });
  const port = (server.address() as AddressInfo).port;

  return {
    url: `http://${host}:${port}${BASE_PATH}`,
    port,
    prismPid: prism.pid,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolvePromise) => server.close(() => resolvePromise()));
      await prism.stop();
    },
  };
}

/**
 * Prism sends every declared header with its example value, `Content-Encoding: gzip` included, but never
 * compresses: passing that header on would make clients fail to decode the body.
 */
function withRealHeaders(headers: IncomingHttpHeaders): IncomingHttpHeaders {
  const { 'content-encoding': _ignored, ...rest } = headers;
  // Prism also replays the documented example `Date`; a response carries its real time.
  return { ...rest, date: new Date().toUTCString() };
}

function isStreamRequest(value: unknown): value is { stream: true; model?: unknown } {
  return typeof value === 'object' && value !== null && (value as { stream?: unknown }).stream === true;
}

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8'));
  } catch {
    return undefined;
  }
}

async function readBody(req: IncomingMessage): Promise<Buffer | undefined> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const part of req) {
    size += (part as Buffer).length;
    if (size > MAX_BODY_BYTES) return undefined;
    parts.push(part as Buffer);
  }
  return Buffer.concat(parts);
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' });
  res.end(JSON.stringify(body));
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolvePromise) => setTimeout(resolvePromise, ms));
}
