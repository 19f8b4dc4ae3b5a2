/**
 * One POST to an upstream whose answer is read as it arrives, over node:http(s) with keep-alive agents: on the
 * streamed chat path, `fetch` (undici and its web streams) cost more CPU than the rest of the adapter. With a
 * `fetch` injected (tests, or a deployment's own), the same shape is served through it.
 */
import http from 'node:http';
import https from 'node:https';
import { readerChunks } from '../../client/sse.ts';

export type UpstreamAnswer = {
  status: number;
  /** A response header (case-insensitive name), undefined when absent. */
  header(name: string): string | undefined;
  /** The body's chunks as they arrive. Aborting the request's signal ends it with an error. */
  body: AsyncIterable<Uint8Array>;
  /**
   * Done with the answer: `complete` when everything needed was read (the rest is drained, and this settles
   * once the connection is free for the next call), otherwise the connection is dropped.
   */
  release(complete: boolean): Promise<void>;
};

export type UpstreamPost = (
  url: string,
  init: { headers: Record<string, string>; body: string; signal: AbortSignal },
) => Promise<UpstreamAnswer>;

const agents = {
  http: new http.Agent({ keepAlive: true, maxSockets: 256 }),
  https: new https.Agent({ keepAlive: true, maxSockets: 256 }),
};

/** The default transport: node:http(s), a kept-alive connection per upstream host. */
export const nodePost: UpstreamPost = (url, init) =>
  new Promise((resolve, reject) => {
    const target = new URL(url);
    const secure = target.protocol === 'https:';
    const request = (secure ? https : http).request(
      target,
      {
        method: 'POST',
        agent: secure ? agents.https : agents.http,
        headers: { ...init.headers, 'content-length': String(Buffer.byteLength(init.body)) },
        signal: init.signal,
      },
      (response) => {
        resolve({
          status: response.statusCode ?? 0,
          header(name) {
            const value = response.headers[name.toLowerCase()];
            return Array.isArray(value) ? value.join(', ') : value;
          },
          body: response,
          release(complete) {
            if (!complete || response.destroyed) {
              response.destroy();
              return Promise.resolve();
            }
            if (response.readableEnded) return Promise.resolve();
            // Usually only the body's last chunk marker is left; the caller's own timer bounds the wait.
            return new Promise<void>((settle) => {
              response.once('end', settle);
              response.once('close', settle);
              response.resume();
            });
          },
        });
      },
    );
    // After the answer has started, errors reach the reader of its body; this only settles the start.
    request.on('error', reject);
    request.end(init.body);
  });

/** The same through a `fetch` implementation. */
export function fetchPost(doFetch: typeof fetch): UpstreamPost {
  return async (url, init) => {
    const response = await doFetch(url, {
      method: 'POST',
      headers: init.headers,
      body: init.body,
      signal: init.signal,
    });
    const body = response.body;
    return {
      status: response.status,
      header: (name) => response.headers.get(name) ?? undefined,
      body: body ? readerChunks(body) : (async function* () {})(),
      async release() {
        if (body && !body.locked) await body.cancel().catch(() => {});
      },
    };
  };
}

/**
 * Reads an answer's body up to `maxBytes`; over it, the first `maxBytes` bytes with `truncate`, otherwise
 * undefined. The answer is released either way.
 */
export async function readAnswerCapped(
  answer: UpstreamAnswer,
  maxBytes: number,
  options: { truncate?: boolean } = {},
): Promise<Buffer | undefined> {
  const parts: Uint8Array[] = [];
  let size = 0;
  let complete = false;
  try {
    for await (const chunk of answer.body) {
      size += chunk.byteLength;
      parts.push(chunk);
      if (size > maxBytes) return options.truncate ? Buffer.concat(parts).subarray(0, maxBytes) : undefined;
    }
    complete = true;
    return Buffer.concat(parts);
  } finally {
    await answer.release(complete);
  }
}
