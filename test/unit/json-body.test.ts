/**
 * The direct JSON body reader (server/http/json-body.ts): the same bodies and errors as body-parser's strict
 * JSON parser for plain JSON of known length, and body-parser itself for everything else.
 */
import { createServer } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { Readable } from 'node:stream';
import express, { type Request, type RequestHandler, type Response } from 'express';
import { describe, expect, test } from 'vitest';
import { jsonBody, parseStrictJson } from '../../server/http/json-body.ts';

const LIMIT = 1024;
const bodyParser = express.json({ limit: LIMIT, type: ['application/json', 'application/*+json'] });

type Outcome = { body?: unknown; error?: { type?: string; status?: number }; general: boolean };

/** Whether a `data` listener was added to `stream` (the body read from the stream's events, not the buffer). */
function dataListened(stream: Readable): () => boolean {
  let listened = false;
  const on = stream.on.bind(stream);
  stream.on = ((event: string, listener: (...args: unknown[]) => void) => {
    if (event === 'data') listened = true;
    return on(event, listener);
  }) as typeof stream.on;
  return () => listened;
}

/**
 * A request stream with these headers and bytes, through `jsonBody` in front of body-parser. `buffered`: that
 * many bytes are in the request's buffer before the step runs (all of them: the body read with the request's
 * head), the rest arrive after; `sync` in the outcome says whether the step went on before returning.
 */
function read(
  headers: Record<string, string>,
  bytes: Buffer | string,
  options: { cut?: 'at once' | 'later'; buffered?: number; later?: boolean } = {},
) {
  const data = Buffer.from(bytes);
  const req = new Readable({ read() {} }) as unknown as Request & Readable;
  Object.assign(req, { headers: { ...headers }, method: 'POST', url: '/' });
  const listened = dataListened(req);
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
  return new Promise<Outcome & { sync: boolean; listened: boolean; req: Readable }>((resolve) => {
    jsonBody(LIMIT, counting)(req, {} as Response, (error?: unknown) =>
      resolve({
        body: req.body,
        error: error as Outcome['error'],
        general,
        sync: !returned,
        listened: listened(),
        req,
      }),
    );
    returned = true;
    if (options.cut) {
      // As Node's request is cut: `aborted` emitted as it is destroyed, in the read that brought the head
      // (`at once`, before the step has looked again) or in a later one.
      const cut = () => {
        req.push(data.subarray(0, 1));
        req.emit('aborted');
        req.destroy();
      };
      if (options.cut === 'at once') cut();
      else setImmediate(cut);
      return;
    }
    // The rest of the bytes: in the read that brought the head, pushed by Node's parser once the step (called
    // from the head's callback) has returned; or, `later`, in a read of their own.
    const rest = () => {
      if (data.length > early) req.push(data.subarray(early));
      req.push(null);
    };
    if (options.later) setImmediate(rest);
    else rest();
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
    for (const cut of ['at once', 'later'] as const) {
      const outcome = await read(plain('{"a":1}'), '{"a":1}', { cut });
      expect(outcome.general, cut).toBe(false);
      expect(outcome.body, cut).toBeUndefined();
      expect(outcome.error, cut).toMatchObject({ type: 'request.aborted', status: 400 });
    }
  });

  test('a body that came with the head is taken from the buffer once the parser has pushed it', async () => {
    const text = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'héllo ✓' }] });
    // Pushed just after the step returns, as Node's parser pushes a body read with the head: no stream events.
    const sameRead = await read(plain(text), text);
    expect(sameRead).toMatchObject({
      body: JSON.parse(text),
      error: undefined,
      sync: false,
      listened: false,
    });
    if (!sameRead.req.readableEnded) await new Promise<void>((resolve) => sameRead.req.once('end', resolve));
    // A body in a later read: its events, the same body; and the same errors either way.
    const laterRead = await read(plain(text), text, { later: true });
    expect(laterRead).toMatchObject({ body: JSON.parse(text), error: undefined, listened: true });
    for (const bad of ['nope', '42', '{"a":', '\ufeff[1]']) {
      const now = await read(plain(bad), bad);
      const later = await read(plain(bad), bad, { later: true });
      expect([now.listened, later.listened]).toEqual([false, true]);
      expect(now.body).toEqual(later.body);
      expect([now.error?.type, now.error?.status]).toEqual([later.error?.type, later.error?.status]);
    }
    // Part of it with the head, the rest later: read as it arrives.
    const part = await read(plain(text), text, { buffered: 3, later: true });
    expect(part).toMatchObject({ body: JSON.parse(text), error: undefined, listened: true });
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

  test("on Node's own server, a body sent with the head is taken without the stream's events", async () => {
    const seen: { body: unknown; listened: boolean }[] = [];
    const step = jsonBody(LIMIT, bodyParser);
    let headSeen: () => void = () => {};
    const server = createServer((req, res) => {
      headSeen();
      const listened = dataListened(req);
      // Called from the head's callback, as the application's steps are (http/server.ts).
      step(req as Request, res as unknown as Response, (error?: unknown) => {
        seen.push({ body: (req as Request).body, listened: listened() });
        res.writeHead(error ? 400 : 200).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const socket = connect(port, '127.0.0.1');
    try {
      await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
      const answered = () => new Promise<void>((resolve) => socket.once('data', () => resolve()));
      const body = '{"model":"m","messages":[{"role":"user","content":"hi"}]}';
      const head = `POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
      // Head and body in one write (one read on the server), then a head whose body follows in a later write.
      let answer = answered();
      socket.write(head + body);
      await answer;
      answer = answered();
      const seenHead = new Promise<void>((resolve) => {
        headSeen = resolve;
      });
      socket.write(head);
      await seenHead;
      socket.write(body);
      await answer;
      expect(seen).toEqual([
        { body: JSON.parse(body), listened: false },
        { body: JSON.parse(body), listened: true },
      ]);
    } finally {
      socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
