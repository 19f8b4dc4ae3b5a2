/**
 * The JSON-RPC upstream over HTTP(S): POSTs the request bytes to each configured node in order, with a
 * keep-alive agent per node, a per-attempt timeout and a response size cap. Everything per node (parsed URL,
 * agent, request options, the header lines) is built once at start; a call allocates only the request itself.
 */
import http from 'node:http';
import https from 'node:https';
import type { UpstreamEndpoint } from '../../domains/rpc/networks.ts';
import { wholeBody } from '../../http/whole-body.ts';
import { extend } from '../../objects.ts';
import { type ForwardInput, type ForwardResult, type RpcUpstream, UpstreamError } from './port.ts';

export type HttpRpcUpstreamOptions = {
  endpoints: readonly UpstreamEndpoint[];
  /** Largest answer accepted, in bytes. */
  maxResponseBytes: number;
};

type Node = {
  /** Host only: never the path or credentials, which may hold an API key. */
  label: string;
  timeoutMs: number;
  request: typeof http.request;
  options: http.RequestOptions;
  /** Every request header but the length, as a flat name/value list (Host and credentials included). */
  headers: readonly string[];
  agent: http.Agent;
};

type Attempt =
  | { ok: true; status: number; body: Buffer }
  | { ok: false; kind: 'timeout' | 'unreachable' | 'too_large' | 'aborted'; cause?: unknown };

function toNode(endpoint: UpstreamEndpoint): Node {
  const url = new URL(endpoint.url);
  const secure = url.protocol === 'https:';
  const agent = secure
    ? new https.Agent({ keepAlive: true, maxSockets: 256 })
    : new http.Agent({ keepAlive: true, maxSockets: 256 });
  const auth =
    url.username || url.password
      ? `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`
      : undefined;
  return {
    label: url.host,
    timeoutMs: endpoint.timeoutMs,
    request: secure ? https.request : http.request,
    agent,
    options: {
      method: 'POST',
      protocol: url.protocol,
      hostname: url.hostname.replace(/^\[|\]$/g, ''),
      port: url.port || (secure ? 443 : 80),
      path: `${url.pathname}${url.search}`,
      agent,
    },
    // A list is written as it is (no per-header checks), but then Node adds neither Host nor the URL's
    // credentials: both are here, as Node would have written them (`url.host` omits a default port).
    headers: [
      'host',
      url.host,
      'content-type',
      'application/json',
      'accept',
      'application/json',
      ...(auth ? ['authorization', `Basic ${Buffer.from(auth).toString('base64')}`] : []),
    ],
  };
}

function attempt(node: Node, payload: Buffer, maxBytes: number, signal?: AbortSignal): Promise<Attempt> {
  return new Promise((resolve) => {
    let settled = false;
    const finish = (result: Attempt) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(result);
    };
    const req = node.request(
      extend(node.options, { headers: [...node.headers, 'content-length', String(payload.length)] }),
    );
    const fail = (kind: 'timeout' | 'unreachable' | 'too_large' | 'aborted', cause?: unknown) => {
      finish({ ok: false, kind, cause });
      req.destroy();
    };
    const onAbort = () => fail('aborted');
    const timer = setTimeout(() => fail('timeout'), node.timeoutMs);
    signal?.addEventListener('abort', onAbort, { once: true });
    req.on('error', (error) => fail('unreachable', error));
    req.on('response', (res) => {
      const declared = Number(res.headers['content-length']);
      if (declared > maxBytes) return fail('too_large');
      res.on('error', (error) => fail('unreachable', error));
      // A microtask later, a small answer is usually whole in the buffer (whole-body.ts).
      queueMicrotask(() => {
        if (settled) return;
        const whole = wholeBody(res, declared);
        if (whole) {
          finish({ ok: true, status: res.statusCode ?? 0, body: whole });
          return;
        }
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > maxBytes) return fail('too_large');
          chunks.push(chunk);
        });
        res.on('end', () => {
          const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size);
          finish({ ok: true, status: res.statusCode ?? 0, body });
        });
      });
    });
    if (signal?.aborted) return fail('aborted');
    req.end(payload);
  });
}

/** A JSON-RPC upstream over HTTP with failover across `endpoints`, in order. */
export function createHttpRpcUpstream(options: HttpRpcUpstreamOptions): RpcUpstream {
  const nodes = options.endpoints.map(toNode);
  return {
    async forward<T>(input: ForwardInput<T>): Promise<ForwardResult<T>> {
      let last: UpstreamError | undefined;
      for (let i = 0; i < nodes.length; i++) {
        const node = nodes[i] as Node;
        const attempts = i + 1;
        const result = await attempt(node, input.payload, options.maxResponseBytes, input.signal);
        if (!result.ok) {
          const error = new UpstreamError(result.kind, `upstream ${node.label}: ${result.kind}`, {
            attempts,
            cause: result.cause,
          });
          if (result.kind === 'aborted' || result.kind === 'too_large') throw error;
          last = error;
          continue;
        }
        if (result.status >= 500 || result.status === 429) {
          last = new UpstreamError('bad_status', `upstream ${node.label}: HTTP ${result.status}`, {
            attempts,
          });
          continue;
        }
        const parsed = input.parse(result.status, result.body);
        if (parsed === undefined) {
          last = new UpstreamError('bad_body', `upstream ${node.label}: not a JSON-RPC answer`, { attempts });
          continue;
        }
        return { body: result.body, parsed, attempts };
      }
      throw last ?? new UpstreamError('unreachable', 'no upstream configured', { attempts: 0 });
    },
    close() {
      for (const node of nodes) node.agent.destroy();
    },
  };
}
