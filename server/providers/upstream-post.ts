/**
 * One POST to an upstream whose answer is read as it arrives. The default transport is undici's dispatcher
 * with kept-alive connections per upstream origin, its answer handed over chunk by chunk through callbacks:
 * per call it costs about 17 µs of CPU less than node:http (a `ClientRequest`, an `IncomingMessage` and its
 * stream; bench/HISTORY.md, seventeenth round), and `fetch` (undici's web streams) cost more than either.
 * With a `fetch` injected (tests, or a deployment's own), the same shape is served through it.
 */
import { Agent, type Dispatcher } from 'undici';
import { readerChunks } from '../../client/sse.ts';
import { UPSTREAM_CONNECTIONS } from './upstream-connections.ts';

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
  init: {
    headers: Record<string, string>;
    body: string;
    /**
     * Told once the request is on its way (its bytes handed to the connection), in a microtask: what the
     * caller does during the upstream's wait may start then.
     */
    onSent?: () => void;
  },
) => UpstreamCall;

/** Kept-alive connections per upstream origin, bounded by the caller's timer (upstream-connections.ts). */
const dispatcher = new Agent(UPSTREAM_CONNECTIONS);

const cancelled = () => new DOMException('This operation was aborted', 'AbortError');

/** Each upstream URL as its origin and path, parsed once: a provider posts every call to the same endpoint. */
const targets = new Map<string, { origin: string; path: string }>();
const TARGETS_MAX = 256;

function targetOf(url: string): { origin: string; path: string } {
  let target = targets.get(url);
  if (!target) {
    const parsed = new URL(url);
    target = { origin: parsed.origin, path: `${parsed.pathname}${parsed.search}` };
    if (targets.size >= TARGETS_MAX) targets.clear();
    targets.set(url, target);
  }
  return target;
}

/** Chunks held for the reader before the connection is paused (an upstream faster than its reader). */
const HELD_CHUNKS = 16;
const DONE: IteratorResult<Uint8Array> = { done: true, value: undefined };

/**
 * One call through the dispatcher: its handler, its answer and the answer's body (an async iterator over the
 * chunks the handler is given). A class, not closures made per call.
 */
class DispatchedCall implements Dispatcher.DispatchHandler, UpstreamAnswer, AsyncIterator<Uint8Array> {
  readonly answer: Promise<UpstreamAnswer>;
  status = 0;
  /** The call is its own body: an async iterator over the chunks. */
  readonly body: AsyncIterable<Uint8Array> = this;
  private started = false;
  private settleAnswer!: { resolve(answer: UpstreamAnswer): void; reject(error: unknown): void };
  private controller: Dispatcher.DispatchController | undefined;
  private headers: Record<string, string | string[] | undefined> = {};
  /** Chunks given and not read yet; once released whole, chunks are dropped. */
  private held: Uint8Array[] = [];
  private released = false;
  /** The connection paused because HELD_CHUNKS are held (resumed once the reader or `release` takes them). */
  private paused = false;
  /** The read waiting for a chunk, the end or an error. */
  private reading:
    | { resolve(result: IteratorResult<Uint8Array>): void; reject(error: unknown): void }
    | undefined;
  private ended = false;
  private failure: unknown;
  private failed = false;
  /** Told when the call is over (its end or an error): what `release(true)` waits for. */
  private over: (() => void) | undefined;

  constructor(private readonly onSent?: () => void) {
    this.answer = new Promise<UpstreamAnswer>((resolve, reject) => {
      this.settleAnswer = { resolve, reject };
    });
  }

  /**
   * Ends the call now: its request is aborted (which drops its connection), or, before it reaches a
   * connection, aborted as soon as it does (`onRequestStart`); the answer or the read under way fails.
   */
  cancel(): void {
    if (this.ended || this.failed) return;
    const error = cancelled();
    this.controller?.abort(error);
    this.fail(error);
  }

  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    return this;
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.failed) controller.abort(this.failure as Error);
    // undici writes the request (headers and a string body) right after this, in the same turn.
    else if (this.onSent) queueMicrotask(this.onSent);
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: Record<string, string | string[] | undefined>,
  ): void {
    // 1xx answers come before the answer itself.
    if (statusCode < 200 || this.failed) return;
    this.status = statusCode;
    this.headers = headers;
    this.started = true;
    this.settleAnswer.resolve(this);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.released) return;
    const reading = this.reading;
    if (reading) {
      this.reading = undefined;
      reading.resolve({ done: false, value: chunk });
      return;
    }
    this.held.push(chunk);
    if (this.held.length >= HELD_CHUNKS && !this.paused) {
      this.paused = true;
      controller.pause();
    }
  }

  private resume(): void {
    if (!this.paused) return;
    this.paused = false;
    this.controller?.resume();
  }

  onResponseEnd(): void {
    this.ended = true;
    const reading = this.reading;
    this.reading = undefined;
    reading?.resolve(DONE);
    this.over?.();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.fail(error);
  }

  private fail(error: unknown): void {
    if (this.failed || this.ended) return;
    this.failed = true;
    this.failure = error;
    if (!this.started) this.settleAnswer.reject(error);
    const reading = this.reading;
    this.reading = undefined;
    reading?.reject(error);
    this.over?.();
  }

  header(name: string): string | undefined {
    const value = this.headers[name.toLowerCase()];
    return Array.isArray(value) ? value.join(', ') : value;
  }

  next(): Promise<IteratorResult<Uint8Array>> {
    const chunk = this.held.shift();
    if (chunk) {
      if (this.held.length === 0) this.resume();
      return Promise.resolve({ done: false, value: chunk });
    }
    if (this.failed) return Promise.reject(this.failure);
    if (this.ended || this.released) return Promise.resolve(DONE);
    return new Promise((resolve, reject) => {
      this.reading = { resolve, reject };
    });
  }

  release(complete: boolean): Promise<void> {
    if (this.ended || this.failed) return Promise.resolve();
    if (!complete) {
      // What is left of the body stays unread: the call is ended, which drops its connection.
      this.cancel();
      return Promise.resolve();
    }
    // Usually only the body's last chunk marker is left; the caller's own timer bounds the wait.
    this.released = true;
    this.held.length = 0;
    this.resume();
    return new Promise<void>((settle) => {
      this.over = settle;
    });
  }
}

/** The default transport: undici's dispatcher, kept-alive connections per upstream origin. */
export const dispatchPost: UpstreamPost = (url, init) => {
  const { origin, path } = targetOf(url);
  const call = new DispatchedCall(init.onSent);
  dispatcher.dispatch({ origin, path, method: 'POST', headers: init.headers, body: init.body }, call);
  return call;
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
    // `fetch` has no moment its request leaves: told once it was handed the request.
    if (init.onSent) queueMicrotask(init.onSent);
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
