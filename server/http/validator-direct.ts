/**
 * express-openapi-validator's middlewares without their promise hop once the spec is loaded.
 *
 * Each middleware of `OpenApiValidator.middleware` runs its work in `pContext.then(...).catch(next)`: the
 * loaded spec's promise, already settled after the first request, but still a `then`, a `catch`, the
 * promise the sequence chains onto the returned one, and a microtask before the step runs, for each of the
 * five (path parameters, metadata, security, multipart, request validation): fifteen promises a request
 * (bench/HISTORY.md, forty-eighth round). Inside the `then`, a middleware builds its inner middleware once
 * (`metamw = metamw || self.metadataMiddleware(...)`) with a factory method of the validator's instance
 * and calls it; two (path parameters, and security when it is not validated) only call `next()` once
 * the spec has loaded.
 *
 * `directValidator` wraps each of them: until its inner middleware exists, the library's own runs; the
 * factory's result, caught as the library builds it, is called directly afterwards, and a middleware that let
 * a request through without building one (path parameters; security, not validated here) becomes `next()`.
 * The same functions run on the same request in the same order, and a failure is `next(error)` as before (the
 * sequence turns a synchronous throw or a rejected promise into it, as the library's `catch(next)` did). The validator's instance is the
 * one its `middleware()` leaves on `middleware._oav`; should a release of the validator no longer do so, or
 * rename the middlewares or their factories, the library's middlewares are kept unchanged
 * (`validatorDirect()` says which, and a unit test fails).
 */
import type { NextFunction, Request, Response } from 'express';

type Step = (req: Request, res: Response, next: NextFunction) => unknown;
type Factory = (...args: unknown[]) => Step;
type Instance = Record<string, unknown>;

/** The factory each middleware builds its inner middleware with (none: it only calls `next()`). */
const FACTORIES: Readonly<Record<string, string | undefined>> = {
  pathParamsMiddleware: undefined,
  metadataMiddleware: 'metadataMiddleware',
  securityMiddleware: 'securityMiddleware',
  multipartMiddleware: 'multipartMiddleware',
  requestMiddleware: 'requestValidationMiddleware',
  responseMiddleware: 'responseValidationMiddleware',
};

let lastDirect = false;

/** Whether the last `directValidator` call could wrap every middleware (false: they were kept as they are). */
export function validatorDirect(): boolean {
  return lastDirect;
}

/**
 * The validator's `middlewares` (as `OpenApiValidator.middleware` returned them, `instance` its
 * `middleware._oav`), each calling its inner middleware directly once it is built.
 */
export function directValidator<T extends Step>(middlewares: T[], instance: unknown): T[] {
  const oav = instance as Instance | undefined;
  const known =
    oav !== undefined &&
    middlewares.every((m) => {
      if (!Object.hasOwn(FACTORIES, m.name)) return false;
      const factory = FACTORIES[m.name];
      return factory === undefined || typeof oav[factory] === 'function';
    });
  lastDirect = known;
  if (!known) return middlewares;
  return middlewares.map((middleware) => {
    const factory = FACTORIES[middleware.name];
    let inner: Step | undefined;
    let passed = false;
    if (factory !== undefined) {
      const build = oav[factory] as Factory;
      oav[factory] = (...args: unknown[]) => {
        const built = build.apply(oav, args);
        inner = built;
        return built;
      };
    }
    const direct: Step = (req, res, next) => {
      if (inner) return inner(req, res, next);
      if (passed) return next();
      return middleware(req, res, (error?: unknown) => {
        // Through without building an inner middleware: it never will (its conditions are the options').
        if (!inner && (error === undefined || error === null)) passed = true;
        next(error as Error);
      });
    };
    Object.defineProperty(direct, 'name', { value: middleware.name });
    return direct as T;
  });
}
