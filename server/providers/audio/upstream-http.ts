/**
 * One request to an OpenAI-compatible upstream for the media ports (embeddings, speech, transcription): a time
 * limit on the whole exchange, a cap on the bytes read, credentials kept out of messages, and HTTP failures
 * mapped to the provider error kinds (429/503/529 capacity, 408/504 timeout, 400/404/413/415/422 the
 * upstream's refusal, anything else failed). The caller checks the shape of what comes back.
 */
import { ChatProviderError } from '../chat/types.ts';
import { redactSecret } from '../http.ts';

export type UpstreamRequest = {
  /** Backend name, for messages. */
  name: string;
  url: string;
  apiKey?: string;
  timeoutMs: number;
  /** Most bytes read from the answer. */
  maxBytes: number;
  body: string | FormData;
  /** Content type of a string body (a FormData body sets its own). */
  contentType?: string;
  accept?: string;
  signal?: AbortSignal;
  fetch?: typeof fetch;
  /** Latency and outcome of the call (metrics). */
  observe?(outcome: string, seconds: number): void;
};

export type UpstreamAnswer = { contentType: string; body: Buffer };

/** Strips credentials and query strings from a URL before it reaches a message. */
export function redact(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return '[invalid url]';
  }
}

export async function postUpstream(request: UpstreamRequest): Promise<UpstreamAnswer> {
  const doFetch = request.fetch ?? fetch;
  const started = performance.now();
  const timer = AbortSignal.timeout(request.timeoutMs);
  const signal = request.signal ? AbortSignal.any([request.signal, timer]) : timer;
  let outcome = 'ok';
  const fail = (
    kind: ChatProviderError['kind'],
    message: string,
    extra: { cause?: unknown; retryAfter?: number } = {},
  ) => {
    outcome = kind;
    return new ChatProviderError(kind, message, extra);
  };
  const translate = (error: unknown): unknown => {
    if (error instanceof ChatProviderError) return error;
    if (request.signal?.aborted) {
      outcome = 'client_abort';
      return error;
    }
    if (timer.aborted)
      return fail('timeout', `Upstream ${request.name} did not answer within ${request.timeoutMs} ms`, {
        cause: error,
      });
    return fail(
      'failed',
      `Upstream ${request.name} (${redact(request.url)}) failed: ${(error as Error)?.message ?? error}`,
      {
        cause: error,
      },
    );
  };
  try {
    let response: Response;
    try {
      response = await doFetch(request.url, {
        method: 'POST',
        headers: {
          ...(typeof request.body === 'string'
            ? { 'content-type': request.contentType ?? 'application/json' }
            : {}),
          accept: request.accept ?? 'application/json',
          ...(request.apiKey ? { authorization: `Bearer ${request.apiKey}` } : {}),
        },
        body: request.body,
        signal,
      });
    } catch (error) {
      throw translate(error);
    }
    let body: Buffer;
    try {
      body = await readCapped(
        response,
        response.status === 200 ? request.maxBytes : 64 * 1024,
        response.status === 200,
      );
    } catch (error) {
      if (error instanceof ChatProviderError) throw fail(error.kind, error.message);
      throw translate(error);
    }
    if (response.status !== 200) {
      const message = redactSecret(
        upstreamMessage(body.toString('utf8')) ?? `status ${response.status}`,
        request.apiKey,
      );
      const retry = Number(response.headers.get('retry-after'));
      const retryAfter = Number.isFinite(retry) && retry > 0 ? retry : undefined;
      if (response.status === 429 || response.status === 503 || response.status === 529)
        throw fail(
          'capacity',
          `Upstream ${request.name} is at capacity: ${message}`,
          retryAfter ? { retryAfter } : {},
        );
      if (response.status === 408 || response.status === 504)
        throw fail('timeout', `Upstream ${request.name} timed out: ${message}`);
      if ([400, 404, 413, 415, 422].includes(response.status)) throw fail('bad_request', message);
      throw fail('failed', `Upstream ${request.name} answered ${response.status}: ${message}`);
    }
    return { contentType: response.headers.get('content-type') ?? '', body };
  } catch (error) {
    if (outcome === 'ok') outcome = request.signal?.aborted ? 'client_abort' : 'failed';
    throw error;
  } finally {
    request.observe?.(outcome, (performance.now() - started) / 1000);
  }
}

/** Reads the body up to `limit` bytes: beyond it, a failure (`strict`) or a truncation (error bodies). */
async function readCapped(response: Response, limit: number, strict: boolean): Promise<Buffer> {
  if (!response.body) return Buffer.alloc(0);
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => {});
      if (strict) throw new ChatProviderError('failed', `Upstream answer exceeds ${limit} bytes`);
      parts.push(value.subarray(0, value.byteLength - (size - limit)));
      break;
    }
    parts.push(value);
  }
  return Buffer.concat(parts);
}

function upstreamMessage(text: string): string | undefined {
  try {
    const body = JSON.parse(text) as { error?: string | { message?: string }; message?: string };
    if (typeof body.error === 'string') return body.error;
    if (body.error && typeof body.error.message === 'string') return body.error.message;
    if (typeof body.message === 'string') return body.message;
  } catch {
    // not JSON
  }
  return text.trim().slice(0, 300) || undefined;
}
