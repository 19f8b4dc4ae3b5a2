/**
 * The direct JSON body reader (server/http/json-body.ts): the same bodies and errors as body-parser's strict
 * JSON parser for plain JSON of known length, and body-parser itself for everything else.
 */
import { Readable } from 'node:stream';
import express, { type Request, type RequestHandler, type Response } from 'express';
import { describe, expect, test } from 'vitest';
import { jsonBody, parseStrictJson } from '../../server/http/json-body.ts';

const LIMIT = 1024;
const bodyParser = express.json({ limit: LIMIT, type: ['application/json', 'application/*+json'] });

type Outcome = { body?: unknown; error?: { type?: string; status?: number }; general: boolean };

/**
 * A request stream with these headers and bytes, through `jsonBody` in front of body-parser. `buffered`: that
 * many bytes are in the request's buffer before the step runs (all of them: the body read with the request's
 * head), the rest arrive after; `sync` in the outcome says whether the step went on before returning.
 */
function read(
  headers: Record<string, string>,
  bytes: Buffer | string,
  options: { cut?: boolean; buffered?: number } = {},
) {
  const data = Buffer.from(bytes);
  const req = new Readable({ read() {} }) as unknown as Request & Readable;
  Object.assign(req, { headers: { ...headers }, method: 'POST', url: '/' });
  let general = false;
  const counting: RequestHandler = (q, s, n) => {
    general = true;
    return bodyParser(q, s, n);
  };
  const early = options.buffered ?? 0;
  // Two pushes when there is more than a byte: the buffer holds chunks, not one piece.
  if (early > 1) req.push(data.subarray(0, 1));
  if (early > 0) req.push(data.subarray(early > 1 ? 1 : 0, early));
  let returned = false;
  return new Promise<Outcome & { sync: boolean; req: Readable }>((resolve) => {
    jsonBody(LIMIT, counting)(req, {} as Response, (error?: unknown) =>
      resolve({ body: req.body, error: error as Outcome['error'], general, sync: !returned, req }),
    );
    returned = true;
    if (options.cut) {
      req.push(data.subarray(0, 1));
      req.emit('aborted');
      return;
    }
    if (data.length > early) req.push(data.subarray(early));
    req.push(null);
  });
}

const plain = (body: string, type = 'application/json') => ({
  'content-type': type,
  'content-length': String(Buffer.byteLength(body)),
});

describe('parseStrictJson', () => {
  test('objects and arrays, after whitespace or a byte-order mark; {} for nothing', () => {
    expect(parseStrictJson('{"a":1}')).toEqual({ a: 1 });
    expect(parseStrictJson(' \n\t[1,2]')).toEqual([1, 2]);
    expect(parseStrictJson('\ufeff{"b":"é"}')).toEqual({ b: 'é' });
    expect(parseStrictJson('')).toEqual({});
  });

  test('anything else is a parse error of body-parser kind', () => {
    for (const text of ['1', '"x"', 'null', 'true', '   ', '{"a":', '{a:1}']) {
      expect(() => parseStrictJson(text), text).toThrow(
        expect.objectContaining({ type: 'entity.parse.failed', status: 400 }),
      );
    }
  });
});

describe('jsonBody', () => {
  test('plain JSON of known length is read directly, with what body-parser gives', async () => {
    const text = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'héllo ✓' }] });
    for (const type of [
      'application/json',
      'Application/JSON; charset=UTF-8',
      'application/json;charset=utf-8',
    ]) {
      const direct = await read(plain(text, type), text);
      expect(direct).toMatchObject({ body: JSON.parse(text), error: undefined, general: false, sync: false });
    }
    expect(await read(plain(''), '')).toMatchObject({ body: {}, error: undefined, general: false });
  });

  test('the same answers as body-parser on the same bad bodies', async () => {
    for (const text of ['nope', '42', '{"a":', '\ufeff[1]']) {
      const direct = await read(plain(text), text);
      const viaParser = await read({ ...plain(text), 'content-type': 'application/vnd.x+json' }, text);
      expect(direct.general).toBe(false);
      expect(viaParser.general).toBe(true);
      expect(direct.body).toEqual(viaParser.body);
      expect(direct.error?.type).toBe(viaParser.error?.type);
      expect(direct.error?.status).toBe(viaParser.error?.status);
    }
  });

  test('other types, charsets, encodings, unknown or too large lengths go to body-parser', async () => {
    const text = '{"a":1}';
    const cases: Record<string, string>[] = [
      { 'content-type': 'application/merge-patch+json', 'content-length': '7' },
      { 'content-type': 'application/json; charset=utf-16', 'content-length': '7' },
      { 'content-type': 'application/json', 'content-length': '7', 'content-encoding': 'identity' },
      { 'content-type': 'application/json', 'transfer-encoding': 'chunked' },
      { 'content-type': 'application/json', 'content-length': String(LIMIT + 1) },
      { 'content-type': 'text/plain', 'content-length': '7' },
    ];
    for (const headers of cases)
      expect((await read(headers, text)).general, JSON.stringify(headers)).toBe(true);
    // Too large: body-parser's own 413 error.
    const large = await read(
      { 'content-type': 'application/json', 'content-length': String(LIMIT + 1) },
      'x',
    );
    expect(large.error).toMatchObject({ type: 'entity.too.large', status: 413 });
  });

  test('a body cut short is a 400, not a parse of half a body', async () => {
    const outcome = await read(plain('{"a":1}'), '{"a":1}', { cut: true });
    expect(outcome.general).toBe(false);
    expect(outcome.body).toBeUndefined();
    expect(outcome.error).toMatchObject({ type: 'request.aborted', status: 400 });
  });

  test('a body already whole in the buffer is taken at once, with the same body and errors', async () => {
    const text = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'héllo ✓' }] });
    const length = Buffer.byteLength(text);
    const whole = await read(plain(text), text, { buffered: length });
    expect(whole).toMatchObject({ body: JSON.parse(text), error: undefined, general: false, sync: true });
    // The request still ends, once its stream does (Node's server lets go of a request once it has ended).
    if (!whole.req.readableEnded) await new Promise<void>((resolve) => whole.req.once('end', resolve));
    expect(whole.req.readableEnded).toBe(true);
    // Part of it in the buffer: read as it arrives, the same body.
    const part = await read(plain(text), text, { buffered: length - 5 });
    expect(part).toMatchObject({ body: JSON.parse(text), error: undefined, general: false, sync: false });
    for (const bad of ['nope', '42', '{"a":', '\ufeff[1]']) {
      const atOnce = await read(plain(bad), bad, { buffered: Buffer.byteLength(bad) });
      const asItComes = await read(plain(bad), bad);
      expect(atOnce.sync).toBe(true);
      expect(atOnce.body).toEqual(asItComes.body);
      expect(atOnce.error?.type).toBe(asItComes.error?.type);
      expect(atOnce.error?.status).toBe(asItComes.error?.status);
    }
  });
});
