/**
 * createApp(deps): the HTTP application. Request flow:
 *
 *   request id + common headers -> CORS -> operations surface (/healthz, /readyz, /metrics, /docs)
 *   -> authentication (from the spec's security) -> JSON body (size and nesting capped)
 *   -> express-openapi-validator (shape, 404/405/415; responses too when enabled) -> the typed handler of the operation
 *   -> one error handler writing the interface's error bodies.
 *
 * Handlers are looked up by the operationId the validator matched, so the spec is the router. Every step up to
 * dispatch runs in one Express layer (http/pipeline.ts): the router's per-layer matching would otherwise run a
 * dozen times per request, and the routes outside the base path (the operations surface, pre-signed media
 * links) are one router that a request under the base path skips (1% of a JSON-RPC call's instructions:
 * bench/HISTORY.md, thirty-fifth round). The server of http/server.ts enters that layer and the error handler
 * directly (`serve`), without Express's dispatch around them; `app.listen` and tests go through Express.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import compression from 'compression';
import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import * as OpenApiValidator from 'express-openapi-validator';
import type { Logger } from 'pino';
import type { Config } from './config.ts';
import { coerceMultipartFields } from './domains/audio/multipart-fields.ts';
import { type AuthPorts, type Principal, resolvePrincipal } from './http/auth.ts';
import {
  type Handler,
  type HandlerContext,
  type HandlerTable,
  NO_HEADERS,
  type Reply,
  type ReplyHeaders,
} from './http/contract.ts';
import { planDiscriminators } from './http/discriminators.ts';
import { ApiError, internalError, notFound, toValidationDetails } from './http/errors.ts';
import { refuseNonFiniteParameters } from './http/finite-numbers.ts';
import type { InFlight } from './http/in-flight.ts';
import { jsonBody } from './http/json-body.ts';
import { limitJsonDepth } from './http/json-depth.ts';
import {
  multipartOnlyWhereDeclared,
  outsideBasePath,
  pathBelowBase,
  rememberRouteMatches,
  sequence,
  underBasePath,
} from './http/pipeline.ts';
import { randomHex } from './http/random-hex.ts';
import { type AbortLike, RequestAbort } from './http/request-abort.ts';
import { memoizeRouteRegexps } from './http/route-regexps.ts';
import { BASE_PATH, type Contract, type OperationId } from './http/spec.ts';
import { directValidator } from './http/validator-direct.ts';
import { memoizeValidatorRequestWork } from './http/validator-memo.ts';
import { warmRequestValidation } from './http/validator-warmup.ts';
import { isPromise, setOwn } from './objects.ts';
import type { Metrics } from './observability/metrics.ts';
import { mountOperationsSurface } from './observability/surface.ts';

export type AppDeps = {
  config: Config;
  contract: Contract;
  logger: Logger;
  auth: AuthPorts;
  handlers: HandlerTable;
  metrics: Metrics;
  /** Resolves when the service can take traffic (database reachable); throws otherwise. */
  readiness(): Promise<void>;
  /**
   * Admission of an authenticated request after validation (rate limits): returns headers to send, or throws
   * the ApiError to answer with (429). The headers themselves, not a promise, when it decided at once.
   */
  admit?(input: {
    operationId: OperationId;
    principal: Principal;
    body: unknown;
  }): ReplyHeaders | Promise<ReplyHeaders>;
  /** Routes outside the contract and its base path (pre-signed media links), mounted before authentication. */
  mountRoutes?(router: express.Router): void;
  /**
   * Takes one of the caller's in-flight slots before admission (wallets: at most 5 paid requests at once, and
   * the wallet's admission minimum checked with the slot); returns the release, called when the response is
   * over, or throws the ApiError to answer with (429, or the wallet 402 with the slot already freed).
   * Undefined, not a promise, when the request takes no slot (an API key's).
   */
  acquireSlot?(input: {
    operationId: OperationId;
    principal: Principal;
  }): Promise<(() => void) | undefined> | undefined;
  /**
   * What an authenticated request waits for before it is admitted: its account's captures still under way in
   * this process (Charges.settled; undefined when there are none), so that it sees the account as the answers
   * already written left it.
   */
  settled?(accountId: string): Promise<void> | undefined;
  /** Counts every request from its arrival to the end of its response (see http/in-flight.ts). */
  inFlight?: InFlight;
  /**
   * Headers computed once the handler is done, before the reply is written (`X-Balance-Remaining`); undefined,
   * not a promise, when the request has none (an API key's).
   */
  replyHeaders?(input: { operationId: OperationId; principal: Principal }): Promise<ReplyHeaders> | undefined;
  /**
   * Headers of whatever answers an admitted request, its reply or its error, computed once the handler is done
   * (the balance before the request). Never throws: what cannot be computed is left out. The headers
   * themselves, not a promise, when they are known at once (the balance as the reservation found it).
   */
  answerHeaders?(input: {
    operationId: OperationId;
    principal: Principal;
  }): ReplyHeaders | Promise<ReplyHeaders>;
};

/** A request that no operation of the contract answers. */
const unmatched = (req: Request) => notFound(`Not found: ${req.method} ${req.originalUrl}`);

/** Names of the x402 payment header; only the top-up operation reads them. */
const PAYMENT_HEADERS = ['payment-signature', 'x-payment', 'x-402-payment'];

/**
 * A request's own state (`res.locals`). A class, not the object Express makes (`Object.create(null)`, whose
 * properties V8 keeps in a dictionary): one shape for every request. Its logger is made when first used:
 * a pino child serialises its bindings when it is made (about 2 to 7 µs on a request's cold path), and most
 * requests log nothing of their own.
 */
class Locals {
  /** This request's own object (AuthPorts): per-request state may be keyed by it. */
  principal: Principal | undefined = undefined;
  operationId: OperationId | undefined = undefined;
  sentBody: Record<string, unknown> | undefined = undefined;
  private child: Logger | undefined = undefined;

  constructor(
    readonly requestId: string,
    readonly start: bigint,
    private readonly logger: Logger,
  ) {}

  /** The request's logger: the server's with the request's id (`cfRay`) in every line. */
  get log(): Logger {
    this.child ??= this.logger.child({ cfRay: this.requestId });
    return this.child;
  }
}

/** Headers a browser client may read. */
const EXPOSED_HEADERS = [
  'CF-RAY',
  'x-service-version',
  'x-service-host-name',
  'x-service-model-id',
  'x-service-model-name',
  'x-service-model-router',
  'x-service-model-deprecation-warning',
  'x-service-model-deprecation-date',
  'x-service-balance-usd',
  'x-service-balance-diem',
  'x-service-enhanced-prompt',
  'x-service-is-blurred',
  'x-service-is-content-violation',
  'x-ratelimit-limit-requests',
  'x-ratelimit-remaining-requests',
  'x-ratelimit-reset-requests',
  'x-ratelimit-limit-tokens',
  'x-ratelimit-remaining-tokens',
  'x-ratelimit-reset-tokens',
  'x-ratelimit-type',
  'x-pagination-limit',
  'x-pagination-page',
  'x-pagination-total',
  'x-pagination-total-pages',
  'x-next-cursor',
  'X-Balance-Remaining',
  'X-Service-RPC-Credits',
  'X-Service-RPC-Cost-USD',
  'X-Request-ID',
  'Idempotent-Replayed',
  'X-RateLimit-Limit',
  'X-RateLimit-Remaining',
  'X-RateLimit-Reset',
  'Retry-After',
  'PAYMENT-REQUIRED',
  'PAYMENT-RESPONSE',
  'Content-Disposition',
].join(', ');

const ALLOWED_HEADERS = [
  'Authorization',
  'Content-Type',
  'Accept',
  'Accept-Encoding',
  'SIGN-IN-WITH-X',
  'X-Sign-In-With-X',
  'PAYMENT-SIGNATURE',
  'X-PAYMENT',
  'X-402-Payment',
  'Idempotency-Key',
].join(', ');

/**
 * The app, and what builds every operation's request validation ahead of the first request
 * (http/validator-warmup.ts): the process's entry point calls it at start; tests need not.
 */
export type App = express.Express & {
  warmRequestValidation(): Promise<{ operations: number; ms: number }>;
  /** The request listener of http/server.ts's server: the application without Express's dispatch (below). */
  serve(req: IncomingMessage, res: ServerResponse): void;
};

export function createApp(deps: AppDeps): App {
  const { config, contract, logger, metrics } = deps;
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  app.set('query parser', 'extended');

  // Each response's line, by a child of the logger without its redaction: the line's fields (the request id,
  // method, path, status, operation, duration) are primitives none of whose names the logger redacts
  // (observability/logger.ts), so redaction could change nothing in it, and passing it over cost about 3 µs
  // a line (the same bytes; test/unit/request-log.test.ts).
  const responseLog = logger.child({}, { redact: { paths: [] } });

  // Request id and the headers every response carries.
  const identify: RequestHandler = (req, res, next) => {
    deps.inFlight?.track(res);
    const requestId = `${randomHex(8)}-${config.colo}`;
    const locals = new Locals(requestId, process.hrtime.bigint(), logger);
    res.locals = locals as unknown as Response['locals'];
    res.setHeader('CF-RAY', requestId);
    res.setHeader('x-service-version', contract.version);
    res.on('finish', () => {
      const seconds = Number(process.hrtime.bigint() - locals.start) / 1e9;
      const operation = locals.operationId ?? 'unmatched';
      metrics.observeRequest(operation, res.statusCode, seconds);
      responseLog.info(
        {
          cfRay: requestId,
          method: req.method,
          path: req.path,
          status: res.statusCode,
          operation,
          ms: Math.round(seconds * 1000),
        },
        'request',
      );
    });
    next();
  };

  // CORS, including the x402 headers a browser client must be able to read and send.
  const cors: RequestHandler = (req, res, next) => {
    const origin = req.headers.origin;
    const allowAll = config.corsOrigins.includes('*');
    if (origin && (allowAll || config.corsOrigins.includes(origin))) {
      res.setHeader('Access-Control-Allow-Origin', allowAll ? '*' : origin);
      if (!allowAll) res.setHeader('Vary', 'Origin');
      res.setHeader('Access-Control-Expose-Headers', EXPOSED_HEADERS);
    }
    if (req.method === 'OPTIONS' && origin && req.headers['access-control-request-method']) {
      res.setHeader('Access-Control-Allow-Methods', 'GET, POST, PATCH, DELETE, OPTIONS');
      res.setHeader('Access-Control-Allow-Headers', ALLOWED_HEADERS);
      res.setHeader('Access-Control-Max-Age', '600');
      res.status(204).end();
      return;
    }
    next();
  };

  // gzip or br for JSON and CSV only: never for event streams or binary media. A client that accepts no
  // encoding skips the middleware (it would wrap the response's write and end for nothing).
  const compress = compression({
    filter: (_req, res) => /^(application\/json|text\/csv)/.test(String(res.getHeader('Content-Type') ?? '')),
  });
  const compressible: RequestHandler = (req, res, next) =>
    req.headers['accept-encoding'] ? compress(req, res, next) : next();

  // The routes outside the contract (the operations surface, pre-signed media links): one router that a
  // request under the base path never enters (its routes would be matched one by one on every API request).
  const outside = express.Router();
  mountOperationsSurface(outside, deps);
  deps.mountRoutes?.(outside);
  // Anything else outside the base path: the interface's 404, not Express's HTML page, saying where the API is
  // (an SDK given the origin as its base URL posts to `/chat/completions`).
  outside.use((req, _res, next) =>
    next(
      new ApiError(404, `Not found: ${req.method} ${req.originalUrl} (the API is under ${BASE_PATH})`, {
        code: 'NOT_FOUND',
      }),
    ),
  );

  // Authentication, from the operation's `security` in the spec.
  const authenticate = underBasePath((req, res, next) => {
    const op = contract.match(req.method, pathBelowBase(req.path));
    if (!op) return next();
    const locals = res.locals as Locals;
    locals.operationId = op.operationId;
    // A payment sent anywhere but the top-up would be silently ignored: refuse it instead.
    if (op.operationId !== 'topUpX402Balance' && PAYMENT_HEADERS.some((name) => req.headers[name])) {
      return next(
        new ApiError(
          400,
          'Payment headers are accepted only by POST /x402/top-up; sign in with SIGN-IN-WITH-X',
          {
            code: 'PAYMENT_HEADER_NOT_ACCEPTED',
          },
        ),
      );
    }
    const found = (principal: Principal | undefined) => {
      if (principal) locals.principal = principal;
      next();
    };
    // A cached key's request goes on at once; a refusal known at once throws (the sequence's next(error)).
    const resolved = resolvePrincipal(req, op, deps.auth);
    if (isPromise(resolved)) resolved.then(found, (error: unknown) => next(error));
    else found(resolved);
  });

  // Plain JSON bodies of known length read directly; the rest through body-parser (http/json-body.ts).
  const parseJson = jsonBody(
    config.jsonBodyLimitBytes,
    express.json({ limit: config.jsonBodyLimitBytes, type: ['application/json', 'application/*+json'] }),
  );

  // What the client wrote, before the validator fills in defaults (one level deep: the validator adds keys to
  // nested objects in place): chat tells a sent `service_parameters` option from a default with it.
  const recordSentBody: RequestHandler = (req, res, next) => {
    const body: unknown = req.body;
    if (body && typeof body === 'object' && !Array.isArray(body)) {
      // Object.fromEntries of the entries, without their arrays.
      const sent: Record<string, unknown> = {};
      for (const key of Object.keys(body)) {
        const v = (body as Record<string, unknown>)[key];
        setOwn(sent, key, v && typeof v === 'object' && !Array.isArray(v) ? { ...v } : v);
      }
      (res.locals as Locals).sentBody = sent;
    }
    next();
  };

  memoizeRouteRegexps();
  memoizeValidatorRequestWork();
  // A message checked against the one schema its `role` names, not against all five (http/discriminators.ts).
  const discriminators = planDiscriminators(contract.document);
  const validator = directValidator(
    OpenApiValidator.middleware({
      apiSpec: discriminators.document as unknown as string,
      validateApiSpec: false,
      validateRequests: { allErrors: true, discriminator: discriminators.option },
      validateResponses: config.validateResponses ? { allErrors: true } : false,
      validateSecurity: false,
      ignoreUndocumented: false,
      ignorePaths: (path: string) => !path.startsWith(`${BASE_PATH}/`),
      fileUploader: { limits: { fileSize: 25 * 1024 * 1024, files: 1 } },
      validateFormats: true,
    }),
    (OpenApiValidator.middleware as { _oav?: unknown })._oav,
  );
  // Multipart fields are text on the wire: typed before the request is validated.
  const requestValidation = validator.findIndex((m) => m.name === 'requestMiddleware');
  validator.splice(
    requestValidation < 0 ? validator.length : requestValidation,
    0,
    coerceMultipartFields(contract.document),
  );
  const multipart = validator.findIndex((m) => m.name === 'multipartMiddleware');
  const handleMultipart = validator[multipart];
  if (handleMultipart)
    validator[multipart] = multipartOnlyWhereDeclared(handleMultipart, contract.document) as RequestHandler;
  const metadata = validator.findIndex((m) => m.name === 'metadataMiddleware');
  const matchRoute = validator[metadata];
  if (matchRoute) validator[metadata] = rememberRouteMatches(matchRoute) as RequestHandler;

  // Dispatch to the operation's handler.
  const dispatch = underBasePath((req, res, next) => {
    const openapi = (
      req as Request & { openapi?: { schema?: { operationId?: string }; pathParams?: object } }
    ).openapi;
    const operationId = openapi?.schema?.operationId as OperationId | undefined;
    if (!operationId) return next(unmatched(req));
    const locals = res.locals as Locals;
    locals.operationId = operationId;
    const handler = deps.handlers[operationId] as Handler<OperationId>;
    const ctx = new OperationContext(req, res, operationId, openapi?.pathParams ?? {}, locals);
    res.on('close', () => {
      if (!res.writableFinished) ctx.abort();
    });
    const principal = locals.principal;
    /** Admission, with the caller's slot (released when the response is over) when it took one. */
    const admit = (release: (() => void) | undefined): ReplyHeaders | Promise<ReplyHeaders> => {
      if (release) res.on('close', release);
      return deps.admit && principal ? deps.admit({ operationId, principal, body: req.body }) : NO_HEADERS;
    };
    const enter = (): ReplyHeaders | Promise<ReplyHeaders> => {
      const slot = deps.acquireSlot && principal ? deps.acquireSlot({ operationId, principal }) : undefined;
      return slot ? slot.then(admit) : admit(undefined);
    };
    // The hooks that have nothing to wait for answer at once (no slot, admitted on counts in memory, the
    // balance known, no reply headers): a request then awaits only its handler and a streamed answer.
    const serve = async (admitted: ReplyHeaders | Promise<ReplyHeaders>): Promise<void> => {
      setHeaders(res, isPromise(admitted) ? await admitted : admitted);
      let reply: Reply<OperationId>;
      try {
        reply = await handler(ctx as unknown as HandlerContext<OperationId>);
      } finally {
        if (deps.answerHeaders && principal) {
          const answer = deps.answerHeaders({ operationId, principal });
          setHeaders(res, isPromise(answer) ? await answer : answer);
        }
      }
      const after =
        deps.replyHeaders && principal ? deps.replyHeaders({ operationId, principal }) : undefined;
      if (after) reply.headers = Object.assign({}, reply.headers, await after);
      const written = writeReply(res, reply, ctx, !config.validateResponses);
      if (written) await written;
    };
    const settled = principal ? deps.settled?.(principal.accountId) : undefined;
    serve(settled ? settled.then(enter) : enter()).catch(next);
  });

  // One Express layer for every request (see http/pipeline.ts): the same steps, in this order.
  const steps = sequence([
    identify,
    cors,
    compressible,
    outsideBasePath(outside),
    authenticate,
    parseJson,
    limitJsonDepth,
    recordSentBody,
    ...validator,
    refuseNonFiniteParameters,
    dispatch,
  ]);
  app.use(steps);

  // The one error handler: the interface's error body for anything a step or a handler failed with.
  const answerError = (error: unknown, req: Request, res: Response, _next: NextFunction) => {
    const locals = res.locals as Locals;
    const failure = toApiError(error, req);
    if (failure.status >= 500 && failure.status !== 501 && failure.status !== 503) {
      locals.log.error({ err: error, path: req.path }, 'request failed');
    }
    if (res.headersSent) {
      res.destroy();
      return;
    }
    res.setHeader('x-service-host-name', config.hostName);
    setHeaders(res, failure.headers);
    res.status(failure.status);
    // 501 is scaffolding that the contract does not declare: written raw, past response validation.
    if (failure.status === 501 || !(req as Request & { openapi?: unknown }).openapi) {
      res.type('application/json').send(JSON.stringify(failure.toBody()));
      return;
    }
    res.json(failure.toBody());
  };
  app.use(answerError);

  /**
   * The application without Express's dispatch around its one layer, for a server whose requests and responses
   * are born on its prototypes (http/server.ts); any other request goes through Express. For a request,
   * Express's `app.handle` makes a final handler (and binds its logger), reads the `x-powered-by` setting,
   * sets the prototypes already set and a `res.locals` that `identify` replaces, and its router parses the path,
   * makes the closures of its `next`, matches the one layer and enters it, and after an error matches the error
   * handler's layer: 8,000 to 10,000 instructions a request (bench/HISTORY.md, fifty-second round). Here
   * the steps and the error handler run as the router runs them, with what it leaves on the request set as it
   * sets it; the end of the steps without an answer, which Express's final handler would answer with its HTML
   * 404, is the interface's 404; and an error answer that itself fails (Express's final handler: an HTML 500) is
   * a bare 500 in the interface's shape, or the connection closed once the answer has begun. Should anything be
   * added to the application after this (`app.use`), its requests go through Express, which runs it.
   */
  const router = (app as unknown as { router: { stack: unknown[] } }).router;
  const layers = router.stack.length;
  const serve = (incoming: IncomingMessage, outgoing: ServerResponse): void => {
    const req = incoming as Request;
    const res = outgoing as Response;
    if (
      Object.getPrototypeOf(req) !== app.request ||
      Object.getPrototypeOf(res) !== app.response ||
      router.stack.length !== layers
    ) {
      app(req, res);
      return;
    }
    req.res = res;
    res.req = req;
    req.originalUrl = req.url;
    req.baseUrl = '';
    req.params = {};
    const done: NextFunction = (error?: unknown) => {
      try {
        answerError(
          // Express's `next('route')` and `next('router')` are not failures: nothing answered.
          error === undefined || error === null || error === 'route' || error === 'router'
            ? unmatched(req)
            : error,
          req,
          res,
          done,
        );
      } catch (failure) {
        logger.error({ err: failure, path: req.path }, 'error answer failed');
        if (res.headersSent) res.destroy();
        else {
          writeJsonText(res, 500, JSON.stringify(internalError().toBody()));
        }
      }
    };
    req.next = done;
    steps(req, res, done);
  };

  return Object.assign(app, {
    serve,
    warmRequestValidation: () => warmRequestValidation(validator, contract),
  });
}

/**
 * A handler's context (`HandlerContext`). A class, so that `signal` is a getter of its prototype: made only if
 * the handler reads it (request-abort.ts), where an object literal with a getter would be built by a runtime
 * call on every request.
 */
class OperationContext extends RequestAbort {
  readonly query: unknown;
  /** The names of the query parameters the client sent. */
  readonly sentQuery: ReadonlySet<string>;
  /** The validator fills in schema defaults; handlers that must know what the client wrote look here. */
  readonly body: unknown;
  readonly sentBody: Record<string, unknown> | undefined;
  readonly headers: Request['headers'];
  readonly principal: Principal | undefined;
  readonly requestId: string;
  readonly files: unknown;

  constructor(
    req: Request,
    private readonly res: ServerResponse,
    readonly operationId: OperationId,
    readonly path: object,
    private readonly locals: Locals,
  ) {
    super();
    this.query = req.query;
    this.sentQuery = sentQueryNames(req.originalUrl);
    this.body = req.body;
    this.sentBody = locals.sentBody;
    this.headers = req.headers;
    this.principal = locals.principal;
    this.requestId = locals.requestId;
    this.files = (req as Request & { files?: unknown }).files;
  }

  get cancellation(): AbortLike {
    return this;
  }

  /** The request's logger, made when first used (Locals). */
  get log(): Logger {
    return this.locals.log;
  }

  setHeader(name: string, value: string | number): void {
    this.res.setHeader(name, value);
  }
}

const NO_NAMES: ReadonlySet<string> = new Set();

/** The names of the query parameters the client sent (none without a `?`: no URL to parse). */
function sentQueryNames(url: string): ReadonlySet<string> {
  const at = url.indexOf('?');
  if (at < 0) return NO_NAMES;
  const hash = url.indexOf('#', at);
  return new Set(new URLSearchParams(url.slice(at + 1, hash < 0 ? undefined : hash)).keys());
}

/**
 * JSON of the bodies that are shared and frozen (the model lists): serialised once, not per request, and kept
 * as its UTF-8 bytes, which the socket takes as they are (a string is measured and encoded on every write).
 */
const serializedBodies = new WeakMap<object, Buffer>();

/** Headers given as an object, set on the response (by its own keys: no array of entries made). */
function setHeaders(res: ServerResponse, headers: ReplyHeaders | undefined): void {
  if (headers === undefined) return;
  for (const name of Object.keys(headers)) res.setHeader(name, headers[name] as string | number);
}

/** Writes the reply; a promise only for a streamed one (the others are written at once). */
function writeReply(
  res: ServerResponse & Response,
  reply: Reply<OperationId>,
  cancel: RequestAbort,
  reuseSerialized: boolean,
): Promise<void> | undefined {
  setHeaders(res, reply.headers);
  if ('stream' in reply) return reply.stream(res, cancel);
  if ('contentType' in reply) {
    const { status, contentType, body } = reply as { status: number; contentType: string; body: unknown };
    // JSON already serialised (the JSON-RPC proxy's answer, a replayed chat) is written as a JSON answer is
    // below: the same headers and bytes as Express's send, without its layers.
    if (
      contentType === 'application/json' &&
      (typeof body === 'string' || Buffer.isBuffer(body)) &&
      plainAnswer(res, status)
    ) {
      writeJsonText(res, status, body);
      return undefined;
    }
    res.status(status).type(contentType).send(body);
    return undefined;
  }
  const json = reply as { status: number; body: unknown };
  // Response validation hooks res.json: a validating server always goes through it.
  const { status, body } = json;
  if (!reuseSerialized || body === undefined || !plainAnswer(res, status)) {
    res.status(status).json(body);
    return undefined;
  }
  const shared = body && typeof body === 'object' && Object.isFrozen(body);
  writeJsonText(res, status, shared ? sharedJson(body) : JSON.stringify(body));
  return undefined;
}

/** The UTF-8 bytes of a shared frozen body's JSON, made by its first answer. */
function sharedJson(body: object): Buffer {
  let bytes = serializedBodies.get(body);
  if (bytes === undefined) {
    bytes = Buffer.from(JSON.stringify(body));
    serializedBodies.set(body, bytes);
  }
  return bytes;
}

/** Whether the answer is ours to write: not one Express shapes itself (HEAD, 204/304, a Content-Type set). */
function plainAnswer(res: ServerResponse & Response, status: number): boolean {
  return status !== 204 && status !== 304 && res.req.method !== 'HEAD' && !res.hasHeader('Content-Type');
}

/** What res.json then res.send write for a JSON text (no ETag: disabled), without their layers. */
function writeJsonText(res: ServerResponse, status: number, text: string | Buffer) {
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/json; charset=utf-8');
  res.setHeader('Content-Length', Buffer.byteLength(text));
  res.end(text);
}

type HttpErrorLike = {
  status?: number;
  statusCode?: number;
  type?: string;
  code?: string;
  message?: string;
  errors?: { path?: string; message?: string }[];
};

/** Maps anything thrown to the interface's error: validator and parser errors keep their meaning. */
export function toApiError(error: unknown, req: Request): ApiError {
  if (error instanceof ApiError) return error;
  const e = (error ?? {}) as HttpErrorLike;
  if (e.type === 'entity.parse.failed') {
    return new ApiError(400, 'Invalid JSON request body', { code: 'INVALID_JSON', cause: error });
  }
  if (e.type === 'entity.too.large' || e.code === 'LIMIT_FILE_SIZE') {
    return new ApiError(413, 'Request body exceeds the maximum allowed size', { code: 'PAYLOAD_TOO_LARGE' });
  }
  if (e.type === 'encoding.unsupported' || e.type === 'charset.unsupported') {
    return new ApiError(415, e.message ?? 'Unsupported content encoding', { code: 'INVALID_CONTENT_TYPE' });
  }
  const status = e.status ?? e.statusCode;
  switch (status) {
    case 400: {
      const message = e.message ?? 'Invalid request parameters';
      return new ApiError(400, message, {
        details: toValidationDetails(e.errors ?? [], message),
        cause: error,
      });
    }
    case 404:
      return new ApiError(404, `Not found: ${req.method} ${req.originalUrl.split('?')[0]}`, {
        code: 'NOT_FOUND',
      });
    case 405:
      return new ApiError(405, `Method ${req.method} is not allowed on ${req.originalUrl.split('?')[0]}`, {
        code: 'METHOD_NOT_ALLOWED',
      });
    case 413:
      return new ApiError(413, 'Request body exceeds the maximum allowed size', {
        code: 'PAYLOAD_TOO_LARGE',
      });
    case 415: {
      const type = req.headers['content-type'] ?? 'none';
      return new ApiError(415, `Unsupported Content-Type '${type}'`, { code: 'INVALID_CONTENT_TYPE' });
    }
    default:
      return internalError(error);
  }
}
