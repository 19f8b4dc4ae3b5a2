/**
 * The port of a JSON-RPC upstream: one network's nodes, tried in order. The proxy hands over the request bytes
 * and a parser; the upstream returns the first answer the parser accepts, failing over to the next node on
 * timeouts, refused connections, 5xx and 429 answers, and answers that are not JSON-RPC.
 */
import type { AbortLike } from '../../http/request-abort.ts';

export type UpstreamFailureKind =
  /** No answer within the node's timeout. */
  | 'timeout'
  /** Connection refused, reset or DNS failure. */
  | 'unreachable'
  /** A 5xx or 429 status. */
  | 'bad_status'
  /** An answer that is not JSON-RPC. */
  | 'bad_body'
  /** An answer larger than the cap (not retried: another node would answer the same). */
  | 'too_large'
  /** The caller went away. */
  | 'aborted';

/** Why forwarding failed, after every node was tried. Carries no URL (upstream URLs may embed secrets). */
export class UpstreamError extends Error {
  override readonly name = 'UpstreamError';
  readonly kind: UpstreamFailureKind;
  readonly attempts: number;
  constructor(kind: UpstreamFailureKind, message: string, options: { attempts: number; cause?: unknown }) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.kind = kind;
    this.attempts = options.attempts;
  }
}

export type ForwardInput<T> = {
  /** The JSON-RPC request, already serialised. */
  payload: Buffer;
  /** The caller's abort (an `AbortSignal` will do): the call ends when it aborts. */
  signal?: AbortLike;
  /** Accepts an answer (returns what it parsed) or rejects it (undefined: fail over to the next node). */
  parse(status: number, body: Buffer): T | undefined;
};

export type ForwardResult<T> = {
  /** The accepted answer's bytes, unchanged. */
  body: Buffer;
  parsed: T;
  /** Nodes tried, this one included. */
  attempts: number;
};

export type RpcUpstream = {
  forward<T>(input: ForwardInput<T>): Promise<ForwardResult<T>>;
  /** Closes idle keep-alive connections. */
  close(): void;
};
