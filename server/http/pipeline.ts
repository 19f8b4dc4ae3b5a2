/**
 * The request pipeline of the contract's operations as one Express layer instead of one layer per step.
 *
 * Express 5's router matches every layer's mount path for every request, rewrites `req.url` in and out of
 * each mounted layer, and hops through its `next` machinery between them: about a dozen times per request
 * here (authentication, body parser, depth limit, the validator's six middlewares, dispatch). `sequence`
 * runs the same middleware functions in the same order, with Express's own contract for each of them (a
 * synchronous throw or a rejected returned promise becomes `next(error)`), and hands the request back to
 * the router only at the end: `done()` to go on, `done(error)` for the error handler.
 *
 * `underBasePath` keeps a step to the paths an `app.use(BASE_PATH, step)` would have given it, with the
 * same case-insensitive prefix rule; its step sees the full path (`req.path`), not one relative to the base.
 * `outsideBasePath` is its converse: the routes outside the contract, which an API request then never enters.
 *
 * `rememberRouteMatches` puts a bounded cache in front of express-openapi-validator's metadata middleware,
 * which otherwise compares the request's path with every route of the spec on every request: the match is
 * a pure function of the method and the path, so it is looked up once per (method, path) and copied.
 */
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { extend, innerMap } from '../objects.ts';
import { BASE_PATH, resolveLocalRef } from './spec.ts';

type Step = (req: Request, res: Response, next: NextFunction) => unknown;

/** Runs `steps` in order as one middleware, each getting a `next` to the following one. */
export function sequence(steps: readonly Step[]): RequestHandler {
  return (req, res, done) => {
    let index = 0;
    const next = (error?: unknown) => {
      if (error !== undefined && error !== null) {
        done(error);
        return;
      }
      const step = steps[index++];
      if (!step) {
        done();
        return;
      }
      try {
        const result = step(req, res, next as NextFunction);
        if (result && typeof (result as Promise<unknown>).then === 'function') {
          (result as Promise<unknown>).then(undefined, (failure: unknown) => {
            next(failure ?? new Error('Rejected promise'));
          });
        }
      } catch (failure) {
        next(failure);
      }
    };
    next();
  };
}

const BASE_LENGTH = BASE_PATH.length;

/** Whether Express would mount `app.use(BASE_PATH, …)` on this path: the prefix, case-insensitive, then `/` or the end. */
export function isUnderBasePath(path: string): boolean {
  if (path.length > BASE_LENGTH && path.charCodeAt(BASE_LENGTH) !== 47 /* '/' */) return false;
  return path.length >= BASE_LENGTH && path.slice(0, BASE_LENGTH).toLowerCase() === BASE_PATH;
}

/** The path below the base path, as a step mounted on it would see it (`/` for the base itself). */
export function pathBelowBase(path: string): string {
  return path.length === BASE_LENGTH ? '/' : path.slice(BASE_LENGTH);
}

/** `step` for the paths under the base path; the others go straight on. */
export function underBasePath(step: Step): Step {
  return (req, res, next) => (isUnderBasePath(req.path) ? step(req, res, next) : next());
}

/** `step` for the paths outside the base path; the others go straight on. */
export function outsideBasePath(step: Step): Step {
  return (req, res, next) => (isUnderBasePath(req.path) ? next() : step(req, res, next));
}

type OpenApiMatch = { pathParams?: Record<string, string> } & Record<string, unknown>;
type WithOpenApi = Request & { openapi?: OpenApiMatch };

const MAX_REMEMBERED = 2_000;

/**
 * The validator's metadata middleware with its route matches remembered by method and path. A request whose
 * path matched before gets a fresh copy of that match (its path parameters are its own object: the
 * validator coerces them in place); the rest (unmatched, ignored, 404, 405) go through the original every
 * time. The cache is emptied when it is full, so a client cannot grow it without bound.
 */
export function rememberRouteMatches(metadata: Step): Step {
  // By method, then by path: no key is concatenated per request (a new string, which V8 would flatten and
  // hash before every lookup; the method's string is the parser's own, hashed once).
  const remembered = new Map<string, Map<string, OpenApiMatch>>();
  let size = 0;
  return (req, res, next) => {
    const request = req as WithOpenApi;
    const url = req.originalUrl;
    const query = url.indexOf('?');
    const path = query < 0 ? url : url.slice(0, query);
    const method = req.method;
    const match = remembered.get(method)?.get(path);
    if (match) {
      const pathParams = { ...match.pathParams };
      request.openapi = extend(match, { pathParams });
      req.params = pathParams;
      next();
      return;
    }
    return metadata(req, res, (error?: unknown) => {
      const found = request.openapi;
      if ((error === undefined || error === null) && found) {
        if (size >= MAX_REMEMBERED) {
          remembered.clear();
          size = 0;
        }
        const paths = innerMap(remembered, method);
        if (!paths.has(path)) size++;
        paths.set(path, extend(found, { pathParams: { ...found.pathParams } }));
      }
      next(error as Error);
    });
  };
}

type MediaType = { schema?: { $ref?: unknown; format?: unknown } } | undefined;
type Operation = { $ref?: unknown; requestBody?: { $ref?: unknown; content?: unknown } };

/**
 * The validator's multipart middleware only for the operations it can handle. It is an `async` function: on
 * every request, a JSON one too, it looks through the operation's request body (its media types' entries, a
 * schema looked up by its reference) and answers a promise, which the sequence chains onto: two promises a
 * chat or a JSON-RPC call for nothing. It handles a request only when the operation declares a
 * `multipart/form-data` body, or a request media type whose schema is a binary string; every other operation
 * (its answer kept per operation object) goes straight on. What cannot be told for sure (a reference the
 * document does not resolve, an operation or a request body given by reference) keeps the middleware.
 */
export function multipartOnlyWhereDeclared(multipart: Step, document: unknown): Step {
  const skips = new WeakMap<object, boolean>();
  return (req, res, next) => {
    const operation = (req as Request & { openapi?: { schema?: Operation } }).openapi?.schema;
    if (operation !== undefined && operation !== null && typeof operation === 'object') {
      let skip = skips.get(operation);
      if (skip === undefined) {
        skip = neverMultipart(operation, document);
        skips.set(operation, skip);
      }
      if (skip) return next();
    }
    return multipart(req, res, next);
  };
}

/** Whether the library's multipart middleware could never handle a request of this operation. */
function neverMultipart(operation: Operation, document: unknown): boolean {
  if (operation.$ref !== undefined) return false;
  const body = operation.requestBody;
  if (body === undefined) return true;
  if (body === null || typeof body !== 'object' || body.$ref !== undefined) return false;
  const content = body.content;
  if (content === undefined) return true;
  if (content === null || typeof content !== 'object') return false;
  for (const [type, media] of Object.entries(content as Record<string, MediaType>)) {
    if (type.includes('multipart/')) return false;
    let schema = media?.schema;
    if (schema?.$ref !== undefined) {
      schema = typeof schema.$ref === 'string' ? referenced(document, schema.$ref) : undefined;
      if (schema === undefined) return false;
    }
    if (schema?.format === 'binary') return false;
  }
  return true;
}

/** The schema a local reference names in the document; undefined when it names none. */
function referenced(document: unknown, ref: string): { format?: unknown; $ref?: unknown } | undefined {
  const node = resolveLocalRef(document, ref);
  if (node === null || typeof node !== 'object') return undefined;
  const schema = node as { format?: unknown; $ref?: unknown };
  // A reference to a reference: not followed further, so not known.
  return schema.$ref === undefined ? schema : undefined;
}
