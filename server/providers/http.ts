/**
 * What every HTTP adapter of an upstream needs, in one place: bodies read with a size cap (upstream replies are
 * distrusted), URLs stripped of credentials before they reach a message, and the error text of an
 * OpenAI-style error body.
 */

/**
 * Reads a response body up to `maxBytes`. A declared `Content-Length` over the cap is refused before reading.
 * Over the cap: `undefined` (the body is cancelled), or with `truncate` the first `maxBytes` bytes.
 */
export async function readBodyCapped(
  response: Response,
  maxBytes: number,
  options: { truncate?: boolean } = {},
): Promise<Buffer | undefined> {
  const declared = Number(response.headers.get('content-length'));
  if (!options.truncate && Number.isFinite(declared) && declared > maxBytes) {
    await response.body?.cancel().catch(() => {});
    return undefined;
  }
  if (!response.body) return Buffer.alloc(0);
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    size += value.byteLength;
    parts.push(value);
    if (size > maxBytes) {
      await reader.cancel().catch(() => {});
      return options.truncate ? Buffer.concat(parts).subarray(0, maxBytes) : undefined;
    }
  }
  return Buffer.concat(parts);
}

/**
 * `text` with every occurrence of `secret` replaced by `[redacted]`: upstreams echo the API key they were sent
 * in their errors ("Incorrect API key provided: sk-…"), and those messages reach logs and clients.
 */
export function redactSecret(text: string, secret: string | undefined): string {
  return secret && secret.length >= 8 ? text.split(secret).join('[redacted]') : text;
}

/** A URL without credentials or query string, safe for messages and logs. */
export function redactUrl(url: string | URL): string {
  try {
    const u = typeof url === 'string' ? new URL(url) : url;
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return '[invalid url]';
  }
}

/** The message (and code) of an upstream error body: `{error: {message, code}}`, `{error}`, `{message}` or text. */
export function upstreamError(text: string): { message?: string; code?: string } {
  try {
    const body = JSON.parse(text) as {
      error?: string | { message?: string; code?: string | null };
      message?: string;
      code?: string;
    };
    if (typeof body.error === 'string')
      return { message: body.error, ...(body.code ? { code: body.code } : {}) };
    if (body.error && typeof body.error === 'object')
      return {
        ...(typeof body.error.message === 'string' ? { message: body.error.message } : {}),
        ...(typeof body.error.code === 'string' ? { code: body.error.code } : {}),
      };
    if (typeof body.message === 'string') return { message: body.message };
  } catch {
    // not JSON
  }
  const trimmed = text.trim().slice(0, 300);
  return trimmed ? { message: trimmed } : {};
}

/** What every OpenAI-compatible upstream adapter (chat, embeddings, speech, transcription) is built from. */
export type UpstreamAdapterOptions = {
  name: string;
  baseUrl: string;
  apiKey?: string;
  upstreamModel: string;
  /** Longest wait for the answer to start, and for each next piece. */
  timeoutMs: number;
  /** Most bytes read from one answer. */
  maxBytes?: number;
  fetch?: typeof fetch;
  /** Latency and outcome of each call (metrics). */
  observe?(outcome: string, seconds: number): void;
};
