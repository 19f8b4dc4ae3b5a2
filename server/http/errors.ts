/**
 * One error type for every failure a handler or service reports, and the mapping of everything else
 * (validator, body parser, unexpected throws) to the interface's bodies: `{error, code?}` or, for validation,
 * `{error, details}` with the `_errors` tree.
 */
import type { ValidationErrorDetails } from '../../generated/api.d.ts';

export type ApiErrorOptions = {
  /** Stable machine-readable code (`INSUFFICIENT_BALANCE`, `MODEL_NOT_FOUND`, …). */
  code?: string;
  /** The validation tree, for 400s that locate problems in the request. */
  details?: ValidationErrorDetails;
  /** A whole body that replaces `{error, code}` (the 402 variants). Must still carry `error` when it can. */
  body?: Record<string, unknown>;
  headers?: Record<string, string>;
  cause?: unknown;
};

/** A failure with its HTTP status. Services throw it; the error handler writes it. */
export class ApiError extends Error {
  override readonly name = 'ApiError';
  readonly status: number;
  readonly code: string | undefined;
  readonly details: ValidationErrorDetails | undefined;
  readonly body: Record<string, unknown> | undefined;
  readonly headers: Record<string, string>;

  constructor(status: number, message: string, options: ApiErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.status = status;
    this.code = options.code;
    this.details = options.details;
    this.body = options.body;
    this.headers = options.headers ?? {};
  }

  /** The JSON body of the response. */
  toBody(): Record<string, unknown> {
    if (this.body) return this.body;
    if (this.details) return { error: this.message, details: this.details };
    return this.code ? { error: this.message, code: this.code } : { error: this.message };
  }
}

export const badRequest = (message: string, code = 'INVALID_REQUEST', details?: ValidationErrorDetails) =>
  new ApiError(400, message, { code, ...(details ? { details } : {}) });
export const unauthorized = (message = 'Authentication failed', code = 'AUTHENTICATION_FAILED') =>
  new ApiError(401, message, { code });
export const adminKeyRequired = () => new ApiError(401, 'Admin API key required');
export const notFound = (message: string, code = 'NOT_FOUND') => new ApiError(404, message, { code });
export const notImplemented = () => new ApiError(501, 'Not implemented');
/** What answers a failure the interface does not name (its cause kept for the log). */
export const internalError = (cause?: unknown) =>
  new ApiError(500, 'Internal server error', { code: 'INTERNAL_ERROR', cause });

const LOCATIONS = new Set(['body', 'query', 'params', 'path', 'headers', 'cookies']);

type ValidatorError = { path?: string; message?: string };

/**
 * Turns express-openapi-validator's error list into the `_errors` tree: `/body/messages/0/role` becomes
 * `details.messages["0"].role._errors`. Errors that do not point into the request go to the root.
 */
export function toValidationDetails(
  errors: readonly ValidatorError[],
  fallback: string,
): ValidationErrorDetails {
  const root: ValidationErrorDetails = { _errors: [] };
  const add = (node: ValidationErrorDetails, message: string) => {
    if (!node._errors.includes(message)) node._errors.push(message);
  };
  for (const error of errors) {
    const message = error.message ?? 'is invalid';
    const segments = String(error.path ?? '')
      .split('/')
      .filter(Boolean);
    if (segments.length < 2 || !LOCATIONS.has(segments[0] ?? '')) {
      add(root, message);
      continue;
    }
    let node = root;
    for (const segment of segments.slice(1)) {
      // Own keys only: a field named `valueOf` or `__proto__` is a field, not the prototype's.
      const existing = Object.hasOwn(node, segment) ? node[segment] : undefined;
      const child: ValidationErrorDetails =
        existing && !Array.isArray(existing) ? (existing as ValidationErrorDetails) : { _errors: [] };
      Object.defineProperty(node, segment, {
        value: child,
        enumerable: true,
        writable: true,
        configurable: true,
      });
      node = child;
    }
    add(node, message);
  }
  if (errors.length === 0) add(root, fallback);
  return root;
}
