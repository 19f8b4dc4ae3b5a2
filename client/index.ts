/**
 * The typed client for the Service API, generated types plus openapi-fetch.
 *
 *   const api = createServiceClient({ baseUrl: 'http://127.0.0.1:3000/api/v1', apiKey });
 *   const { data, error } = await api.GET('/models', { params: { query: { type: 'text' } } });
 *   for await (const chunk of api.streamChatCompletion({ model, messages })) …
 *   const { blob } = await api.generateImageBinary({ model, prompt, format: 'png' });
 *
 * Every JSON operation is typed from `generated/api.d.ts`; the helpers cover what JSON typing cannot: the
 * Server-Sent Events stream of chat and the binary media responses.
 */
import createClient, { type Client, type ClientOptions } from 'openapi-fetch';
import type { ChatCompletionChunk, ChatCompletionRequest, paths } from '../generated/api.d.ts';
import { readChatCompletionChunks } from './sse.ts';
import { checkedResponse, type ResponseValidation, validationMiddleware } from './validation.ts';

export type * from '../generated/api.d.ts';
export {
  IncompleteStreamError,
  readChatCompletionChunks,
  readSseEvents,
  ServiceStreamError,
  type SseEvent,
} from './sse.ts';
export {
  type CheckedResponse,
  ContractViolationError,
  type ResponseValidation,
} from './validation.ts';

/** A string, or a function called before each request (for example to sign a fresh wallet proof). */
export type CredentialSource = string | (() => string | Promise<string>);

export type ServiceClientOptions = {
  /** Base URL including the version prefix, e.g. `http://127.0.0.1:3000/api/v1`. */
  baseUrl: string;
  /** An API key, sent as `Authorization: Bearer <key>`. */
  apiKey?: CredentialSource;
  /** A base64 Sign-In-With-X proof, sent as `SIGN-IN-WITH-X`. */
  signInWithX?: CredentialSource;
  /** Replaces the global fetch (the test seam, or a custom agent). */
  fetch?: ClientOptions['fetch'];
  /** Headers sent with every request. */
  headers?: Record<string, string>;
  /**
   * Opt-in response validation: every response (and every streamed chat chunk) is checked before the call
   * returns, and a violation rejects the call (see `client/validation.ts`).
   */
  validation?: ResponseValidation;
};

/** Raised by the helpers when the server answers with an error status; `body` is the parsed error body. */
export class ServiceApiError extends Error {
  override readonly name = 'ServiceApiError';
  readonly status: number;
  readonly body: unknown;
  readonly headers: Headers;
  constructor(status: number, body: unknown, headers: Headers) {
    super(errorMessage(status, body));
    this.status = status;
    this.body = body;
    this.headers = headers;
  }
}

function errorMessage(status: number, body: unknown): string {
  if (body && typeof body === 'object' && 'error' in body && typeof body.error === 'string') {
    return `${status}: ${body.error}`;
  }
  return `HTTP ${status}`;
}

/** A binary media response: the bytes with the content type the server declared, and the headers. */
export type BinaryResult = { blob: Blob; contentType: string; headers: Headers };

type ImageGenerateBody = paths['/image/generate']['post']['requestBody']['content']['application/json'];
type SpeechBody = paths['/audio/speech']['post']['requestBody']['content']['application/json'];
type VideoRetrieveBody = paths['/video/retrieve']['post']['requestBody']['content']['application/json'];

export type ServiceClient = Client<paths, `${string}/json`> & {
  /** Streams a chat completion: yields each chunk; the last one carries `usage` and `cost`. */
  streamChatCompletion(
    body: Omit<ChatCompletionRequest, 'stream'>,
    init?: { signal?: AbortSignal; headers?: Record<string, string> },
  ): AsyncGenerator<ChatCompletionChunk>;
  /** Generates an image and returns its bytes (`return_binary: true`). */
  generateImageBinary(
    body: Omit<ImageGenerateBody, 'return_binary'>,
    init?: RequestInit,
  ): Promise<BinaryResult>;
  /** Synthesises speech and returns the audio bytes. */
  createSpeech(body: SpeechBody, init?: RequestInit): Promise<BinaryResult>;
  /**
   * Retrieves a video job: the MP4 bytes when it is done, otherwise the JSON status
   * (`{status: 'PROCESSING', …}`).
   */
  retrieveVideo(body: VideoRetrieveBody, init?: RequestInit): Promise<BinaryResult | { status: unknown }>;
};

export function createServiceClient(options: ServiceClientOptions): ServiceClient {
  const fetchImpl = options.fetch ?? globalThis.fetch;
  const baseUrl = options.baseUrl.replace(/\/+$/, '');
  const client = createClient<paths, `${string}/json`>({
    baseUrl,
    fetch: fetchImpl,
    ...(options.headers ? { headers: options.headers } : {}),
  });
  client.use({
    async onRequest({ request }) {
      await applyCredentials(request.headers, options);
      return request;
    },
  });
  if (options.validation) client.use(validationMiddleware(options.validation));

  async function post(
    path: string,
    body: unknown,
    init: RequestInit & { accept: string },
  ): Promise<Response> {
    const headers = new Headers(options.headers);
    new Headers(init.headers).forEach((value, key) => {
      headers.set(key, value);
    });
    headers.set('content-type', 'application/json');
    headers.set('accept', init.accept);
    await applyCredentials(headers, options);
    const response = await fetchImpl(
      new Request(`${baseUrl}${path}`, { ...init, method: 'POST', headers, body: JSON.stringify(body) }),
    );
    await options.validation?.response(
      await checkedResponse('POST', path, response, init.accept === 'text/event-stream'),
    );
    if (!response.ok) throw new ServiceApiError(response.status, await readBody(response), response.headers);
    return response;
  }

  async function binary(path: string, body: unknown, init: RequestInit = {}): Promise<BinaryResult> {
    const response = await post(path, body, { ...init, accept: '*/*' });
    return {
      blob: await response.blob(),
      contentType: response.headers.get('content-type') ?? 'application/octet-stream',
      headers: response.headers,
    };
  }

  return Object.assign(client, {
    async *streamChatCompletion(
      body: Omit<ChatCompletionRequest, 'stream'>,
      init: { signal?: AbortSignal; headers?: Record<string, string> } = {},
    ): AsyncGenerator<ChatCompletionChunk> {
      const response = await post(
        '/chat/completions',
        { ...body, stream: true },
        {
          ...init,
          accept: 'text/event-stream',
        },
      );
      if (!response.body) throw new ServiceApiError(response.status, 'empty stream', response.headers);
      const validation = options.validation;
      if (!validation?.chunk) {
        yield* readChatCompletionChunks(response.body);
        return;
      }
      for await (const chunk of readChatCompletionChunks(response.body)) {
        await validation.chunk(chunk);
        yield chunk;
      }
    },
    generateImageBinary: (body: Omit<ImageGenerateBody, 'return_binary'>, init?: RequestInit) =>
      binary('/image/generate', { ...body, return_binary: true }, init),
    createSpeech: (body: SpeechBody, init?: RequestInit) => binary('/audio/speech', body, init),
    async retrieveVideo(body: VideoRetrieveBody, init: RequestInit = {}) {
      const response = await post('/video/retrieve', body, {
        ...init,
        accept: 'video/mp4, application/json',
      });
      const contentType = response.headers.get('content-type') ?? '';
      if (contentType.startsWith('application/json')) return (await response.json()) as { status: unknown };
      return { blob: await response.blob(), contentType, headers: response.headers };
    },
  });
}

async function applyCredentials(headers: Headers, options: ServiceClientOptions): Promise<void> {
  if (options.apiKey !== undefined && !headers.has('authorization')) {
    headers.set('authorization', `Bearer ${await resolveCredential(options.apiKey)}`);
  }
  if (options.signInWithX !== undefined && !headers.has('sign-in-with-x')) {
    headers.set('sign-in-with-x', await resolveCredential(options.signInWithX));
  }
}

function resolveCredential(source: CredentialSource): string | Promise<string> {
  return typeof source === 'function' ? source() : source;
}

async function readBody(response: Response): Promise<unknown> {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
