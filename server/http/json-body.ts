/**
 * The JSON request body, read directly in the common case: `Content-Type: application/json` (with no charset
 * or `charset=utf-8`), a `Content-Length` within the limit, no `Content-Encoding`. That is what every client
 * of this API sends, and body-parser's general machinery (type matching, charset decoding through iconv,
 * inflation, raw-body's length accounting) is a noticeable share of a small request's CPU.
 *
 * A body already whole in the request's buffer when this step runs is taken at once (whole-body.ts);
 * otherwise it is read as it arrives.
 *
 * It gives the same result as `express.json({ strict: true })` for those requests: the UTF-8 text without a
 * byte-order mark, `{}` for an empty body, and a parse error of type `entity.parse.failed` (the error handler
 * answers 400 `INVALID_JSON`) for anything that is not a JSON object or array. Every other request (other
 * types, encodings, charsets, chunked bodies, too large) goes to body-parser, which reads nothing twice:
 * the fast path decides from the headers alone, before reading.
 */
import type { NextFunction, Request, RequestHandler } from 'express';
import { wholeBody } from './whole-body.ts';

/** An error of body-parser's kind (`type`, `status`, `expose`), so the error handler maps it alike. */
function bodyError(message: string, status: number, type: string, cause?: unknown): Error {
  return Object.assign(new Error(message, cause === undefined ? undefined : { cause }), {
    status,
    statusCode: status,
    expose: true,
    type,
  });
}

const PLAIN_JSON = new Set([
  'application/json',
  'application/json; charset=utf-8',
  'application/json;charset=utf-8',
]);
const DIGITS = /^\d{1,15}$/;
/** Space, tab, line feed, carriage return: the whitespace JSON allows before a value. */
const JSON_WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);

/** Parses a JSON body as body-parser's strict mode does; throws its `entity.parse.failed` error. */
export function parseStrictJson(text: string): unknown {
  const body = text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
  if (body.length === 0) return {};
  let at = 0;
  while (at < body.length && JSON_WHITESPACE.has(body.charCodeAt(at))) at++;
  const first = body.charAt(at);
  if (first !== '{' && first !== '[') {
    throw bodyError(`Unexpected token ${first || 'end of input'} in JSON`, 400, 'entity.parse.failed');
  }
  try {
    return JSON.parse(body);
  } catch (cause) {
    throw bodyError((cause as Error).message, 400, 'entity.parse.failed', cause);
  }
}

/** `general` (body-parser's JSON parser) behind a direct reader for plain JSON bodies of known length. */
export function jsonBody(limitBytes: number, general: RequestHandler): RequestHandler {
  return (req, res, next) => {
    const headers = req.headers;
    const type = headers['content-type'];
    const length = headers['content-length'];
    if (
      req.body !== undefined ||
      type === undefined ||
      length === undefined ||
      headers['content-encoding'] !== undefined ||
      headers['transfer-encoding'] !== undefined ||
      !PLAIN_JSON.has(type.toLowerCase()) ||
      !DIGITS.test(length) ||
      Number(length) > limitBytes ||
      req.readableEnded
    ) {
      general(req, res, next);
      return;
    }
    const expected = Number(length);
    // Whole in the buffer when a step before this one waited (an API key looked up in the database).
    if (takeWhole(req, expected, next)) return;
    // Otherwise Node's parser is most likely still inside the read that brought the request's head: it
    // emits the request from the head's callback, and pushes the body that came in the same read only once
    // this step has returned. One tick later it is in the buffer: taken at once, rather than through the
    // stream's `resume`, `data` and `end` (a turn each; about 30 µs of a lone chat's path, fifty-third round).
    process.nextTick(() => {
      if (takeWhole(req, expected, next)) return;
      // Gone already (Node's request emits `aborted` as it is destroyed): nothing more will come.
      if (req.destroyed) next(bodyError('request aborted', 400, 'request.aborted'));
      else readAsItArrives(req, expected, next);
    });
  };
}

/** Parses the body and goes on when all `expected` bytes of it are in `req`'s buffer; false otherwise. */
function takeWhole(req: Request, expected: number, next: NextFunction): boolean {
  const whole = wholeBody(req, expected);
  if (!whole) return false;
  try {
    req.body = parseStrictJson(whole.toString('utf8'));
  } catch (failure) {
    next(failure);
    return true;
  }
  next();
  return true;
}

/** The body read from the stream's events, for one that arrives in later reads (or is not there at all). */
function readAsItArrives(req: Request, expected: number, next: NextFunction): void {
  const chunks: Buffer[] = [];
  let received = 0;
  let settled = false;
  const finish = (error?: Error) => {
    if (settled) return;
    settled = true;
    req.off('data', onData);
    req.off('end', onEnd);
    req.off('error', onError);
    req.off('aborted', onAborted);
    if (error) {
      next(error);
      return;
    }
    try {
      const text = received === 0 ? '' : Buffer.concat(chunks, received).toString('utf8');
      req.body = parseStrictJson(text);
    } catch (failure) {
      next(failure);
      return;
    }
    next();
  };
  const onData = (chunk: Buffer) => {
    received += chunk.length;
    chunks.push(chunk);
  };
  const onEnd = () =>
    received === expected
      ? finish()
      : finish(bodyError('request size did not match content length', 400, 'request.size.invalid'));
  const onError = (error: Error) => finish(bodyError(error.message, 400, 'request.aborted', error));
  const onAborted = () => finish(bodyError('request aborted', 400, 'request.aborted'));
  req.on('data', onData);
  req.on('end', onEnd);
  req.on('error', onError);
  req.on('aborted', onAborted);
}
