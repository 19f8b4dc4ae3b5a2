/**
 * The JSON-RPC upstream over HTTP(S): POSTs the request bytes to each configured node in order, over undici
 * (kept-alive connections per node, the answer handed over through a handler's callbacks: no request or
 * response stream per call), with a per-attempt timeout and a response size cap. Everything per node (its
 * connections, path and header list) is built once at start.
 */
import { type Dispatcher, Pool } from 'undici';
import type { UpstreamEndpoint } from '../../domains/rpc/networks.ts';
import type { AbortLike } from '../../http/request-abort.ts';
import { UPSTREAM_CONNECTIONS } from '../upstream-connections.ts';
import { type ForwardInput, type ForwardResult, type RpcUpstream, UpstreamError } from './port.ts';

export type HttpRpcUpstreamOptions = {
  endpoints: readonly UpstreamEndpoint[];
  /** Largest answer accepted, in bytes. */
  maxResponseBytes: number;
};

type Node = {
  /** Host only: never the path or credentials, which may hold an API key. */
  label: string;
  timeoutMs: number;
  pool: Pool;
  path: string;
  /**
   * Every request header but Host and the length (undici writes both: Host as the URL's, without a default
   * port), as a flat name/value list; the URL's credentials as Basic auth.
   */
  headers: string[];
};

type FailureKind = 'timeout' | 'unreachable' | 'too_large' | 'aborted';
type Attempt = { ok: true; status: number; body: Buffer } | { ok: false; kind: FailureKind; cause?: unknown };

function toNode(endpoint: UpstreamEndpoint): Node {
  const url = new URL(endpoint.url);
  const auth =
    url.username || url.password
      ? `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`
      : undefined;
  return {
    label: url.host,
    timeoutMs: endpoint.timeoutMs,
    pool: new Pool(url.origin, UPSTREAM_CONNECTIONS),
    path: `${url.pathname}${url.search}`,
    headers: [
      'content-type',
      'application/json',
      'accept',
      'application/json',
      ...(auth ? ['authorization', `Basic ${Buffer.from(auth).toString('base64')}`] : []),
    ],
  };
}

/** What ends an attempt early also aborts its request, which drops its connection. */
const ended = () => new Error('attempt ended');

/** One attempt at a node: the handler of its request, settling `result` once (answer, failure, timeout). */
class NodeAttempt implements Dispatcher.DispatchHandler {
  readonly result: Promise<Attempt>;
  private settle!: (attempt: Attempt) => void;
  private controller: Dispatcher.DispatchController | undefined;
  private done = false;
  private status = 0;
  private chunks: Buffer[] = [];
  private size = 0;
  private readonly timer: NodeJS.Timeout;
  private readonly onAbort = () => this.fail('aborted');

  constructor(
    timeoutMs: number,
    private readonly maxBytes: number,
    private readonly signal: AbortLike | undefined,
  ) {
    this.result = new Promise<Attempt>((resolve) => {
      this.settle = resolve;
    });
    this.timer = setTimeout(() => this.fail('timeout'), timeoutMs);
    signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  fail(kind: FailureKind, cause?: unknown): void {
    if (this.finish({ ok: false, kind, cause })) this.controller?.abort(ended());
  }

  private finish(attempt: Attempt): boolean {
    if (this.done) return false;
    this.done = true;
    clearTimeout(this.timer);
    this.signal?.removeEventListener('abort', this.onAbort);
    this.settle(attempt);
    return true;
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    // Ended before its request reached a connection (the caller gone, the time up): nothing is sent.
    if (this.done) controller.abort(ended());
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: Record<string, string | string[] | undefined>,
  ): void {
    if (statusCode < 200) return;
    if (Number(headers['content-length']) > this.maxBytes) this.fail('too_large');
    else this.status = statusCode;
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.done) return;
    this.size += chunk.length;
    if (this.size > this.maxBytes) this.fail('too_large');
    else this.chunks.push(chunk);
  }

  onResponseEnd(): void {
    const { chunks, size } = this;
    this.finish({
      ok: true,
      status: this.status,
      body: chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size),
    });
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.fail('unreachable', error);
  }
}

function attempt(node: Node, payload: Buffer, maxBytes: number, signal?: AbortLike): Promise<Attempt> {
  const call = new NodeAttempt(node.timeoutMs, maxBytes, signal);
  if (signal?.aborted) call.fail('aborted');
  else node.pool.dispatch({ path: node.path, method: 'POST', headers: node.headers, body: payload }, call);
  return call.result;
}

/** A JSON-RPC upstream over HTTP with failover across `endpoints`, in order. */
export function createHttpRpcUpstream(options: HttpRpcUpstreamOptions): RpcUpstream {
  const nodes = options.endpoints.map(toNode);
  return {
    async forward<T>(input: ForwardInput<T>): Promise<ForwardResult<T>> {
      let last: UpstreamError | undefined;
      for (let i = 0; i < nodes.length; i++) {
        const node = nodes[i] as Node;
        const attempts = i + 1;
        const result = await attempt(node, input.payload, options.maxResponseBytes, input.signal);
        if (!result.ok) {
          const error = new UpstreamError(result.kind, `upstream ${node.label}: ${result.kind}`, {
            attempts,
            cause: result.cause,
          });
          if (result.kind === 'aborted' || result.kind === 'too_large') throw error;
          last = error;
          continue;
        }
        if (result.status >= 500 || result.status === 429) {
          last = new UpstreamError('bad_status', `upstream ${node.label}: HTTP ${result.status}`, {
            attempts,
          });
          continue;
        }
        const parsed = input.parse(result.status, result.body);
        if (parsed === undefined) {
          last = new UpstreamError('bad_body', `upstream ${node.label}: not a JSON-RPC answer`, { attempts });
          continue;
        }
        return { body: result.body, parsed, attempts };
      }
      throw last ?? new UpstreamError('unreachable', 'no upstream configured', { attempts: 0 });
    },
    close() {
      for (const node of nodes) void node.pool.destroy();
    },
  };
}
