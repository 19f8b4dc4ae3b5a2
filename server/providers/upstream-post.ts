/**
 * One POST to an upstream whose answer is read as it arrives, over node:http(s) with keep-alive agents: on the
 * streamed chat path, `fetch` (undici and its web streams) cost more CPU than the rest of the adapter. With a
 * `fetch` injected (tests, or a deployment's own), the same shape is served through it.
 */
import http from 'node:http';
import https from 'node:https';
import { urlToHttpOptions } from 'node:url';
import { readerChunks } from '../../client/sse.ts';
import { extend } from '../objects.ts';

export type UpstreamAnswer = {
  status: number;
  /** A response header (case-insensitive name), undefined when absent. */
  header(name: string): string | undefined;
  /** The body's chunks as they arrive. Cancelling the call ends it with an error. */
  body: AsyncIterable<Uint8Array>;
  /**
   * Done with the answer: `complete` when everything needed was read (the rest is drained, and this settles
   * once the connection is free for the next call), otherwise the connection is dropped.
   */
  release(complete: boolean): Promise<void>;
};

/**
 * A call under way. `cancel()` ends it at any point (the caller's timer, its client gone): the answer, or the
 * body being read, fails and the connection is dropped; after the answer was released it does nothing. A call
 * takes no `AbortSignal`: each signal Node makes gets a hidden class of its own in V8's old generation, which
 * the adapter's path paid for on every call (bench/HISTORY.md, thirteenth round).
 */
export type UpstreamCall = { answer: Promise<UpstreamAnswer>; cancel(): void };

export type UpstreamPost = (
  url: string,
  init: { headers: Record<string, string>; body: string },
) => UpstreamCall;

const agents = {
  http: new http.Agent({ keepAlive: true, maxSockets: 256 }),
  https: new https.Agent({ keepAlive: true, maxSockets: 256 }),
};

const cancelled = () => new DOMException('This operation was aborted', 'AbortError');

type Target = { secure: boolean; options: http.RequestOptions };

/** Each upstream URL as request options, parsed once: a provider posts every call to the same endpoint. */
const targets = new Map<string, Target>();
const TARGETS_MAX = 256;

function targetOf(url: string): Target {
  let target = targets.get(url);
  if (!target) {
    const parsed = new URL(url);
    target = { secure: parsed.protocol === 'https:', options: urlToHttpOptions(parsed) };
    if (targets.size >= TARGETS_MAX) targets.clear();
    targets.set(url, target);
  }
  return target;
}

/** The default transport: node:http(s), a kept-alive connection per upstream host. */
export const nodePost: UpstreamPost = (url, init) => {
  const { secure, options } = targetOf(url);
  let request: http.ClientRequest | undefined;
  const answer = new Promise<UpstreamAnswer>((resolve, reject) => {
    request = (secure ? https : http).request(
      extend(options, {
        method: 'POST',
        agent: secure ? agents.https : agents.http,
        headers: extend(init.headers, { 'content-length': String(Buffer.byteLength(init.body)) }),
      }),
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
  // A request whose connection went back to the agent is `destroyed` already: cancelling it then does nothing.
  return { answer, cancel: () => void request?.destroy(cancelled()) };
};

/** A body without chunks (an answer without one). */
async function* noChunks(): AsyncGenerator<Uint8Array> {}

/** The same through a `fetch` implementation. */
export function fetchPost(doFetch: typeof fetch): UpstreamPost {
  return (url, init) => {
    const controller = new AbortController();
    const answer = (async (): Promise<UpstreamAnswer> => {
      const response = await doFetch(url, {
        method: 'POST',
        headers: init.headers,
        body: init.body,
        signal: controller.signal,
      });
      const body = response.body;
      return {
        status: response.status,
        header: (name) => response.headers.get(name) ?? undefined,
        body: body ? readerChunks(body) : noChunks(),
        async release() {
          if (body && !body.locked) await body.cancel().catch(() => {});
        },
      };
    })();
    return { answer, cancel: () => controller.abort(cancelled()) };
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
