/**
 * Handler types derived from the generated contract: a handler for operation `K` receives the validated
 * parameters and body of `K` and must reply with one of `K`'s documented success bodies. The operation table
 * `satisfies HandlerTable`, so a missing, misspelt or mistyped handler does not compile.
 */
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { operations } from '../../generated/api.d.ts';
import type { Principal } from './auth.ts';
import type { AbortLike } from './request-abort.ts';
import type { OperationId } from './spec.ts';

type Op<K extends OperationId> = operations[K];
type Params<K extends OperationId> = Op<K> extends { parameters: infer P } ? P : never;

type Defined<T> = [T] extends [never] ? Record<string, never> : Exclude<T, undefined>;

export type QueryOf<K extends OperationId> = Defined<Params<K> extends { query?: infer Q } ? Q : never>;
export type PathOf<K extends OperationId> = Defined<Params<K> extends { path?: infer P } ? P : never>;

type Content<T> = T extends { content: infer C } ? C : never;
type JsonContent<T> = Content<T> extends { 'application/json': infer B } ? B : never;

export type BodyOf<K extends OperationId> =
  Op<K> extends { requestBody: infer R }
    ? JsonContent<R> extends never
      ? Content<R>[keyof Content<R>]
      : JsonContent<R>
    : Op<K> extends { requestBody?: infer R }
      ? JsonContent<R> | undefined
      : undefined;

type Responses<K extends OperationId> = Op<K>['responses'];
type SuccessStatus<K extends OperationId> = Extract<keyof Responses<K>, 200 | 201 | 202 | 204>;

export type ReplyHeaders = Record<string, string | number>;

/** No headers: the one frozen object a hook answers with when it has none to add. */
export const NO_HEADERS: ReplyHeaders = Object.freeze({});

/** A documented JSON success body with its status. */
export type JsonReply<K extends OperationId> = {
  [S in SuccessStatus<K>]: JsonContent<Responses<K>[S]> extends never
    ? never
    : { status: S; body: JsonContent<Responses<K>[S]>; headers?: ReplyHeaders };
}[SuccessStatus<K>];

/** Bytes with their media type: images, audio, video, CSV. */
export type RawReply = { status: 200; contentType: string; body: Buffer | string; headers?: ReplyHeaders };

/** A response the handler writes itself (Server-Sent Events); `signal` aborts when the client goes away. */
export type StreamReply = {
  stream: (res: ServerResponse, signal: AbortLike) => Promise<void>;
  headers?: ReplyHeaders;
};

export type Reply<K extends OperationId> = JsonReply<K> | RawReply | StreamReply;

export type HandlerContext<K extends OperationId> = {
  operationId: K;
  /** Validated query parameters, with the spec's defaults filled in. */
  query: QueryOf<K>;
  /** Names of the query parameters the client actually sent. */
  sentQuery: ReadonlySet<string>;
  path: PathOf<K>;
  body: BodyOf<K>;
  /** The JSON body as the client wrote it, before the validator filled in defaults (top level and one level down). */
  sentBody?: Record<string, unknown>;
  headers: IncomingHttpHeaders;
  /** The caller; undefined only on public operations called without credentials. */
  principal: Principal | undefined;
  /** The request id (also the `CF-RAY` header and every log line's `cfRay`). */
  requestId: string;
  log: Logger;
  /**
   * Aborted when the client disconnects, or by `abort`. Made when first read (request-abort.ts): pass
   * `cancellation` instead where only `aborted`, `throwIfAborted` and 'abort' listeners are used.
   */
  readonly signal: AbortSignal;
  /** The same aborts as `signal`, read without making one. */
  readonly cancellation: AbortLike;
  /**
   * Aborts `signal`: the handler gives up the request's work (its time limit), with one signal for both ends
   * instead of a second linked to this one. The answer is still the handler's to give.
   */
  abort(reason?: unknown): void;
  /** The files of a multipart request. */
  files?: readonly UploadedFile[];
  /** Adds response headers (for example balance headers computed before the work). */
  setHeader(name: string, value: string | number): void;
};

/** A file of a multipart request, held in memory (the validator's upload limits apply). */
export type UploadedFile = {
  fieldname: string;
  originalname: string;
  mimetype: string;
  size: number;
  buffer: Buffer;
};

export type Handler<K extends OperationId> = (ctx: HandlerContext<K>) => Promise<Reply<K>>;

export type HandlerTable = { [K in OperationId]: Handler<K> };
