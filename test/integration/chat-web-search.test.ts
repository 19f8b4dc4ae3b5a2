import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { createSearxngSearch } from '../../server/providers/search/searxng.ts';
import { SearchError } from '../../server/providers/search/types.ts';

/**
 * A loopback stand-in for a SearXNG instance (mounted under `/searx`, as behind a reverse proxy) that answers
 * like the real JSON API, and, by query, with garbage, errors, oversized and stalled replies.
 */
type Seen = {
  authorization: string | undefined;
  path: string;
  q: string | null;
  format: string | null;
  accept: string | undefined;
  params: URLSearchParams;
};
const seen: Seen[] = [];
let server: Server;
let base: string;

/** The shape of a real SearXNG reply (fields we do not use included). */
const reply = {
  query: 'ignored',
  number_of_results: 0,
  results: [
    {
      url: 'https://first.example/a',
      title: 'First result',
      content: 'First  snippet\nwith a line break',
      engine: 'duckduckgo',
      parsed_url: ['https', 'first.example', '/a', '', '', ''],
      template: 'default.html',
      engines: ['duckduckgo', 'brave'],
      positions: [1, 2],
      score: 4,
      category: 'general',
      publishedDate: '2025-03-01T00:00:00',
    },
    { url: 'javascript:alert(1)', title: 'bad scheme', content: 'dropped' },
    { title: 'no url at all', content: 'dropped' },
    { url: 'https://second.example/b', title: null, content: null, publishedDate: null },
    { url: 'https://first.example/a', title: 'duplicate', content: 'dropped' },
    {
      url: 'https://third.example/c',
      title: `T\u0000itle\u0007 ${'x'.repeat(500)}`,
      content: 'y'.repeat(5_000),
    },
    { url: 'https://fourth.example/d', title: 'Fourth', content: 'four' },
  ],
  answers: [],
  corrections: [],
  infoboxes: [],
  suggestions: ['more'],
  unresponsive_engines: [['google', 'timeout']],
};

function handle(req: IncomingMessage, res: ServerResponse) {
  const url = new URL(req.url ?? '/', 'http://x');
  const q = url.searchParams.get('q');
  seen.push({
    path: url.pathname,
    q,
    format: url.searchParams.get('format'),
    accept: req.headers.accept,
    authorization: req.headers.authorization,
    params: url.searchParams,
  });
  const json = (status: number, body: unknown) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
  if (url.pathname !== '/searx/search') return json(404, { error: 'not found' });
  switch (q) {
    case 'garbage':
      res.writeHead(200, { 'content-type': 'text/html' });
      return res.end('<html><body>Too many requests</body></html>');
    case 'wrong shape':
      return json(200, { results: 'none' });
    case 'no results key':
      return json(200, { query: 'x', answers: [] });
    case 'server error':
      return json(500, { error: 'boom' });
    case 'json disabled':
      res.writeHead(403, { 'content-type': 'text/html' });
      return res.end('Forbidden');
    case 'huge declared': {
      const body = JSON.stringify({ results: [{ url: 'https://a.example', content: 'z'.repeat(20_000) }] });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      return res.end(body);
    }
    case 'huge streamed': {
      res.writeHead(200, { 'content-type': 'application/json' }); // chunked, no length to check up front
      res.write('{"results":[');
      for (let i = 0; i < 200; i++)
        res.write(`${i ? ',' : ''}{"url":"https://a.example/${i}","content":"${'z'.repeat(200)}"}`);
      return res.end(']}');
    }
    case 'stall':
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.write('{"results":[');
    case 'no headers':
      return; // never answers
    case 'empty':
      return json(200, { results: [] });
    default:
      return json(200, reply);
  }
}

beforeAll(async () => {
  server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/searx/`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

beforeEach(() => {
  seen.length = 0;
});

async function failure(promise: Promise<unknown>): Promise<SearchError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(SearchError);
  return error as SearchError;
}

describe('createSearxngSearch', () => {
  let search: ReturnType<typeof createSearxngSearch>;
  beforeAll(() => {
    search = createSearxngSearch({ baseUrl: base, timeoutMs: 5_000 });
  });

  test('behavior: GET {base}/search?q=…&format=json, results cleaned, invalid and duplicate items dropped', async () => {
    const results = await search.search('what is new & "quoted"?', { limit: 10 });
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({
      path: '/searx/search',
      q: 'what is new & "quoted"?',
      format: 'json',
      accept: 'application/json',
    });
    expect(results.map((r) => r.url)).toEqual([
      'https://first.example/a',
      'https://second.example/b',
      'https://third.example/c',
      'https://fourth.example/d',
    ]);
    expect(results[0]).toEqual({
      title: 'First result',
      url: 'https://first.example/a',
      content: 'First snippet with a line break',
      publishedDate: '2025-03-01T00:00:00',
    });
    // No title: the URL stands in; null content and date: empty and absent.
    expect(results[1]).toEqual({
      title: 'https://second.example/b',
      url: 'https://second.example/b',
      content: '',
    });
    // Control characters stripped, title and content capped.
    const third = results[2];
    expect(third?.title.startsWith('T itle x')).toBe(true);
    expect(third?.title.length).toBeLessThanOrEqual(301);
    expect(third?.content.length).toBeLessThanOrEqual(2_001);
    expect(third?.content.endsWith('…')).toBe(true);
  });

  test('behavior: limit is honoured; 0 or an empty query makes no request', async () => {
    expect((await search.search('anything', { limit: 2 })).map((r) => r.url)).toEqual([
      'https://first.example/a',
      'https://second.example/b',
    ]);
    expect(await search.search('anything', { limit: 0 })).toEqual([]);
    expect(await search.search('   ', { limit: 5 })).toEqual([]);
    expect(seen).toHaveLength(1);
  });

  test('behavior: extra parameters and content cap are passed through', async () => {
    const tuned = createSearxngSearch({
      baseUrl: base,
      timeoutMs: 5_000,
      maxContentChars: 5,
      params: { language: 'de', safesearch: '2' },
    });
    const [first] = await tuned.search('x', { limit: 1 });
    expect(first?.content).toBe('First…');
    expect(seen[0]?.params.get('language')).toBe('de');
    expect(seen[0]?.params.get('safesearch')).toBe('2');
  });

  test('behavior: an empty result list is an empty answer, not an error', async () => {
    expect(await search.search('empty', { limit: 5 })).toEqual([]);
  });

  test('behavior: replies that are not SearXNG JSON are invalid_response', async () => {
    expect((await failure(search.search('garbage', { limit: 5 }))).kind).toBe('invalid_response');
    expect((await failure(search.search('wrong shape', { limit: 5 }))).kind).toBe('invalid_response');
    expect((await failure(search.search('no results key', { limit: 5 }))).kind).toBe('invalid_response');
  });

  test('behavior: HTTP errors are http_status with the status; 403 hints at the json format setting', async () => {
    const error = await failure(search.search('server error', { limit: 5 }));
    expect(error).toMatchObject({ kind: 'http_status', status: 500 });
    const forbidden = await failure(search.search('json disabled', { limit: 5 }));
    expect(forbidden).toMatchObject({ kind: 'http_status', status: 403 });
    expect(forbidden.message).toMatch(/search\.formats/);
  });

  test('behavior: replies over the size cap are too_large, declared or streamed', async () => {
    const small = createSearxngSearch({ baseUrl: base, timeoutMs: 5_000, maxBytes: 10_000 });
    expect((await failure(small.search('huge declared', { limit: 5 }))).kind).toBe('too_large');
    expect((await failure(small.search('huge streamed', { limit: 5 }))).kind).toBe('too_large');
    // The same replies pass under the default cap.
    expect(await search.search('huge streamed', { limit: 3 })).toHaveLength(3);
  });

  test('behavior: a slow engine is a timeout, headers or body', async () => {
    const quick = createSearxngSearch({ baseUrl: base, timeoutMs: 300 });
    const noHeaders = await failure(quick.search('no headers', { limit: 5 }));
    expect(noHeaders.kind).toBe('timeout');
    expect(noHeaders.message).toContain('300 ms');
    expect((await failure(quick.search('stall', { limit: 5 }))).kind).toBe('timeout');
  });

  test('behavior: the caller can abort', async () => {
    const controller = new AbortController();
    const pending = search.search('no headers', { limit: 5, signal: controller.signal });
    controller.abort();
    expect((await failure(pending)).kind).toBe('aborted');
  });

  test('behavior: an unreachable engine is a network error whose message hides credentials', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const down = createSearxngSearch({ baseUrl: `http://user:s3cret@127.0.0.1:${port}`, timeoutMs: 5_000 });
    const error = await failure(down.search('x', { limit: 5 }));
    expect(error.kind).toBe('network');
    expect(error.message).toContain(`127.0.0.1:${port}/search`);
    expect(error.message).not.toContain('s3cret');
  });

  test('behavior: credentials in the base URL are sent as Basic auth, not in the URL', async () => {
    const withAuth = createSearxngSearch({
      baseUrl: base.replace('http://', 'http://user:s3cret@'),
      timeoutMs: 5_000,
    });
    expect(await withAuth.search('x', { limit: 1 })).toHaveLength(1);
    expect(seen[0]?.authorization).toBe(`Basic ${Buffer.from('user:s3cret').toString('base64')}`);
  });

  test('behavior: a non-http base URL is refused at construction', () => {
    expect(() => createSearxngSearch({ baseUrl: 'file:///tmp/searx', timeoutMs: 1_000 })).toThrow(TypeError);
  });
});
