/**
 * A raw HTTP/1.1 client for hostile-input tests: sends exactly the method, path, header list (duplicates and
 * odd values included) and body bytes given, which `fetch` refuses to do (bodies on GET, CR/LF in values,
 * invalid percent-encoding, bytes that are not UTF-8), and reads the whole answer, decompressed.
 */
import { request } from 'node:http';
import { connect } from 'node:net';
import { brotliDecompressSync, gunzipSync, inflateSync } from 'node:zlib';
import type { GeneratedRequest, MultipartField } from './spec-arbitraries.ts';

export type RawResponse = {
  status: number;
  headers: Headers;
  /** The body, decompressed. */
  bytes: Buffer;
  text: string;
  /** The parsed body when it is JSON, else undefined. */
  json: unknown;
};

export type RawRequest = {
  method: string;
  /** Origin-relative request target, sent as is (`/api/v1/models?x=%zz`). */
  target: string;
  headers?: [string, string][];
  body?: Buffer | string;
};

function toResponse(status: number, rawHeaders: [string, string][], body: Buffer): RawResponse {
  const headers = new Headers();
  for (const [name, value] of rawHeaders) headers.append(name, value);
  const encoding = headers.get('content-encoding');
  const bytes =
    encoding === 'gzip'
      ? gunzipSync(body)
      : encoding === 'br'
        ? brotliDecompressSync(body)
        : encoding === 'deflate'
          ? inflateSync(body)
          : body;
  const text = bytes.toString('utf8');
  let json: unknown;
  if ((headers.get('content-type') ?? '').includes('json')) {
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
  }
  return { status, headers, bytes, text, json };
}

/** Sends one request through node:http (header values are still checked by Node: no CR/LF). */
export function send(origin: string, req: RawRequest): Promise<RawResponse> {
  const url = new URL(origin);
  return new Promise((resolve, reject) => {
    // A raw header list gets no automatic Host header: add one unless the test sends its own.
    const headers: string[] = (req.headers ?? []).some(([n]) => n.toLowerCase() === 'host')
      ? []
      : ['host', url.host];
    for (const [name, value] of req.headers ?? []) headers.push(name, value);
    const body = req.body === undefined ? undefined : Buffer.from(req.body);
    if (body && !(req.headers ?? []).some(([n]) => n.toLowerCase() === 'content-length')) {
      headers.push('content-length', String(body.length));
    }
    const outgoing = request(
      {
        host: url.hostname,
        port: url.port,
        method: req.method,
        path: req.target,
        headers,
        agent: false,
        insecureHTTPParser: false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const pairs: [string, string][] = [];
          for (let i = 0; i < res.rawHeaders.length; i += 2) {
            pairs.push([res.rawHeaders[i] as string, res.rawHeaders[i + 1] as string]);
          }
          try {
            resolve(toResponse(res.statusCode ?? 0, pairs, Buffer.concat(chunks)));
          } catch (error) {
            reject(error);
          }
        });
        res.on('error', reject);
      },
    );
    outgoing.on('error', reject);
    outgoing.end(body);
  });
}

/**
 * Writes bytes straight to a socket and returns what comes back (status line and all), for requests Node's
 * client refuses to build: CR/LF inside header values, malformed request lines.
 */
export function sendBytes(origin: string, bytes: Buffer | string): Promise<string> {
  const url = new URL(origin);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('end', () => resolve(Buffer.concat(chunks).toString('latin1')));
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    socket.on('error', (error: NodeJS.ErrnoException) => {
      // The server may reset the connection after answering 400: what was read is the answer.
      if (error.code === 'ECONNRESET' || error.code === 'EPIPE')
        resolve(Buffer.concat(chunks).toString('latin1'));
      else reject(error);
    });
    socket.setTimeout(20_000, () => {
      socket.destroy();
      resolve(Buffer.concat(chunks).toString('latin1'));
    });
    socket.write(bytes);
  });
}

/** A multipart/form-data body from fields. */
export function multipart(fields: Record<string, MultipartField>): { contentType: string; body: Buffer } {
  const boundary = `----hostile${Math.random().toString(16).slice(2)}`;
  const parts: Buffer[] = [];
  for (const [name, value] of Object.entries(fields)) {
    if (typeof value === 'string') {
      parts.push(
        Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`),
      );
    } else {
      parts.push(
        Buffer.from(
          `--${boundary}\r\nContent-Disposition: form-data; name="${name}"; filename="${value.filename}"\r\n` +
            `Content-Type: ${value.contentType}\r\n\r\n`,
        ),
        Buffer.from(value.bytes),
        Buffer.from('\r\n'),
      );
    }
  }
  parts.push(Buffer.from(`--${boundary}--\r\n`));
  return { contentType: `multipart/form-data; boundary=${boundary}`, body: Buffer.concat(parts) };
}

/** Sends a generated request under `base` (`…/api/v1`) with the extra (credential) headers given. */
export function sendGenerated(
  base: string,
  req: GeneratedRequest,
  extraHeaders: [string, string][] = [],
): Promise<RawResponse> {
  const url = new URL(base);
  const headers: [string, string][] = [...Object.entries(req.headers), ...extraHeaders];
  let body: Buffer | undefined;
  if (req.body?.kind === 'json') {
    headers.push(['content-type', 'application/json']);
    body = Buffer.from(req.body.text);
  } else if (req.body?.kind === 'raw') {
    if (req.body.contentType !== null) headers.push(['content-type', req.body.contentType]);
    body = Buffer.from(req.body.text);
  } else if (req.body?.kind === 'multipart') {
    const built = multipart(req.body.fields);
    headers.push(['content-type', built.contentType]);
    body = built.body;
  }
  return send(url.origin, {
    method: req.method,
    target: `${url.pathname}${req.path}${req.query}`,
    headers,
    ...(body ? { body } : {}),
  });
}
