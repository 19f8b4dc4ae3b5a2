/**
 * Query and path parameters that became ±Infinity. express-openapi-validator coerces `?limit=1e309` or
 * `?limit=Infinity` to a number and lets it through an integer schema with `maximum: 100`; a handler then passes
 * it on and storage refuses it, a 500. Refused here as the validation error it is (JSON bodies need no check:
 * the validator refuses a non-finite number there).
 */
import type { NextFunction, Request, Response } from 'express';
import { ApiError, toValidationDetails } from './errors.ts';

const nonFinite = (value: unknown): boolean =>
  Array.isArray(value) ? value.some(nonFinite) : typeof value === 'number' && !Number.isFinite(value);

export function refuseNonFiniteParameters(req: Request, _res: Response, next: NextFunction): void {
  const path = (req as Request & { openapi?: { pathParams?: Record<string, unknown> } }).openapi?.pathParams;
  const errors: { path: string; message: string }[] = [];
  for (const [location, values] of [
    ['query', req.query],
    ['path', path],
  ] as const) {
    for (const [name, value] of Object.entries(values ?? {})) {
      if (nonFinite(value)) errors.push({ path: `/${location}/${name}`, message: 'must be a finite number' });
    }
  }
  if (errors.length === 0) {
    next();
    return;
  }
  const message = errors.map((e) => `request${e.path} ${e.message}`).join(', ');
  next(new ApiError(400, message, { details: toValidationDetails(errors, message) }));
}
