import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { createScraper, type Resolver, type ScrapeResult } from '../../server/domains/chat/web/scrape.ts';

/**
 * Two loopback sites serve the same pages: `local` on 127.0.0.1 (a private address, as an internal service would
 * be), and `public` on 127.0.0.2, which the scrapers with private networks off are told to treat as a public
 * host (`allowAddress`), so redirects from an allowed host to a private one can be tested without leaving the
 * machine. Every request is recorded, so a test can show that a refused address was never contacted.
 */
type Hit = { site: string; path: string; host: string | undefined };
const hits: Hit[] = [];
let local: { server: Server; origin: string; port: number };
let pub: { server: Server; origin: string; port: number };

const PAGE = `<!doctype html><html><head><title>The  Test &amp; Page</title>
<style>body { color: red; }</style><script>window.secret = "do not show";</script></head>
<body><nav><a href="/elsewhere">Home</a></nav>
<h1>Main heading</h1><p>First paragraph with &lt;entities&gt; &amp; caf&eacute; &#8212; done.</p>
<p>Second paragraph with a <a href="https://example.com/x">link</a>.</p>
<h2>Sub heading</h2><ul><li>item one</li><li>item two</li></ul>
<noscript>enable javascript</noscript><img src="a.png" alt="picture"></body></html>`;

function handler(site: string) {
  return (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? '/', 'http://x');
    hits.push({ site, path: url.pathname, host: req.headers.host });
    const send = (status: number, type: string | undefined, body: string | Buffer, headers = {}) => {
      res.writeHead(status, { ...(type ? { 'content-type': type } : {}), ...headers });
      res.end(body);
    };
    switch (url.pathname) {
      case '/page.html':
        return send(200, 'text/html; charset=utf-8', PAGE);
      case '/plain.txt':
        return send(200, 'text/plain', 'plain text\n\nkept as is');
      case '/latin1.txt':
        return send(200, 'text/plain; charset=iso-8859-1', Buffer.from('caf\xe9', 'latin1'));
      case '/meta-charset.html':
        return send(
          200,
          'text/html',
          Buffer.from(
            '<html><head><meta charset="windows-1252"><title>Caf\xe9</title></head><body>na\xefve</body></html>',
            'latin1',
          ),
        );
      case '/gzip.html':
        return send(200, 'text/html', gzipSync(PAGE), { 'content-encoding': 'gzip' });
      case '/image.png':
        return send(200, 'image/png', Buffer.from([0x89, 0x50, 0x4e, 0x47]));
      case '/data.json':
        return send(200, 'application/json', '{"a":1}');
      case '/untyped':
        return send(200, undefined, 'no content type');
      case '/missing':
        return send(404, 'text/html', '<p>not here</p>');
      case '/redirect':
        return send(302, 'text/plain', '', { location: url.searchParams.get('to') ?? '/page.html' });
      case '/bad-location':
        return send(302, 'text/plain', '', { location: 'http://[::1' });
      case '/no-location':
        return send(302, 'text/plain', '');
      case '/loop':
        return send(301, 'text/plain', '', { location: '/loop' });
      case '/chain': {
        const left = Number(url.searchParams.get('n') ?? 0);
        return send(307, 'text/plain', '', { location: left > 0 ? `/chain?n=${left - 1}` : '/plain.txt' });
      }
      case '/endless': {
        // Never ends on its own: only a client that stops reading at its cap gets an answer.
        res.writeHead(200, { 'content-type': 'text/plain' });
        const chunk = Buffer.alloc(16 * 1024, 'a');
        let sent = 0;
        const pump = (): void => {
          while (!res.destroyed && sent < 256 * 1024 * 1024) {
            sent += chunk.length;
            if (!res.write(chunk)) {
              res.once('drain', pump);
              return;
            }
          }
          res.end();
        };
        res.on('close', () => res.removeAllListeners('drain'));
        return pump();
      }
      case '/stall':
        // Headers, then nothing: the scrape's own time cap must end it.
        res.writeHead(200, { 'content-type': 'text/plain' });
        return res.write('partial');
      default:
        return send(404, 'text/plain', 'unknown');
    }
  };
}

async function listen(site: string, host: string) {
  const server = createServer(handler(site));
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  return { server, origin: `http://${host}:${port}`, port };
}

beforeAll(async () => {
  local = await listen('local', '127.0.0.1');
  pub = await listen('public', '127.0.0.2');
});

afterAll(async () => {
  for (const { server } of [local, pub]) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

beforeEach(() => {
  hits.length = 0;
  connects.length = 0;
});

const CAPS = { maxBytes: 1_000_000, timeoutMs: 10_000, maxRedirects: 5 };
/** Private networks allowed: how tests (and closed deployments) reach a loopback server. */
const open = createScraper({ ...CAPS, allowPrivateNetworks: true });

/** Names that only exist in this test. */
const names: Record<string, string[]> = {
  'public.test': ['127.0.0.2'],
  'internal.test': ['127.0.0.1'],
  'metadata.test': ['169.254.169.254'],
  'mixed.test': ['127.0.0.2', '10.1.2.3'],
  'v6-loopback.test': ['::1'],
  'mapped.test': ['::ffff:127.0.0.1'],
};
const resolverCalls: string[] = [];
const resolve: Resolver = async (hostname) => {
  resolverCalls.push(hostname);
  const answers = names[hostname];
  if (!answers) throw new Error(`ENOTFOUND ${hostname}`);
  return answers.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
};
/** Every address the guarded scraper connected to; anything but loopback would be a bug, and is stopped. */
const connects: string[] = [];
/** Private networks refused, with 127.0.0.2 standing in for a public address. */
const guarded = createScraper({
  ...CAPS,
  allowPrivateNetworks: false,
  resolve,
  allowAddress: (address) => address === '127.0.0.2',
  beforeConnect: ({ address }) => {
    connects.push(address);
    if (!address.startsWith('127.')) throw new Error(`test safety: refusing to contact ${address}`);
  },
});

function expectOk(result: ScrapeResult): asserts result is Extract<ScrapeResult, { ok: true }> {
  if (!result.ok) throw new Error(`scrape failed: ${result.error}`);
}
function expectRefused(result: ScrapeResult, pattern: RegExp) {
  expect(result.ok).toBe(false);
  if (!result.ok) expect(result.error).toMatch(pattern);
}

describe('scrape: content', () => {
  test('behavior: HTML becomes text: title taken, script/style/images dropped, entities decoded, structure kept', async () => {
    const result = await open.scrape(`${local.origin}/page.html`);
    expectOk(result);
    expect(result.url).toBe(`${local.origin}/page.html`);
    expect(result.title).toBe('The Test & Page');
    expect(result.text).toContain('Main heading\n\nFirst paragraph with <entities> & café — done.');
    expect(result.text).toContain('Second paragraph with a link.\n\nSub heading');
    expect(result.text).toMatch(/item one\n.*item two/);
    for (const hidden of ['do not show', 'color: red', 'picture', 'https://example.com/x', 'The Test']) {
      expect(result.text).not.toContain(hidden);
    }
  });

  test('behavior: text/plain passes through; its charset is honoured', async () => {
    const plain = await open.scrape(`${local.origin}/plain.txt`);
    expectOk(plain);
    expect(plain).toEqual({ url: `${local.origin}/plain.txt`, ok: true, text: 'plain text\n\nkept as is' });
    const latin1 = await open.scrape(`${local.origin}/latin1.txt`);
    expectOk(latin1);
    expect(latin1.text).toBe('café');
  });

  test('behavior: an HTML page without a header charset is decoded by its <meta charset>', async () => {
    const result = await open.scrape(`${local.origin}/meta-charset.html`);
    expectOk(result);
    expect(result).toMatchObject({ title: 'Café', text: 'naïve' });
  });

  test('behavior: a gzip-encoded page is decompressed', async () => {
    const result = await open.scrape(`${local.origin}/gzip.html`);
    expectOk(result);
    expect(result.title).toBe('The Test & Page');
    expect(result.text).toContain('Main heading');
  });

  test('behavior: other content types, a missing type and HTTP errors are failures', async () => {
    expectRefused(await open.scrape(`${local.origin}/image.png`), /unsupported content type image\/png/);
    expectRefused(
      await open.scrape(`${local.origin}/data.json`),
      /unsupported content type application\/json/,
    );
    expectRefused(await open.scrape(`${local.origin}/untyped`), /unsupported content type/);
    expectRefused(await open.scrape(`${local.origin}/missing`), /HTTP 404/);
  });

  test('behavior: only http and https URLs', async () => {
    for (const url of ['ftp://127.0.0.1/x', 'file:///etc/passwd', 'javascript:alert(1)', 'not a url']) {
      expectRefused(await open.scrape(url), /only http and https/);
    }
    expect(hits).toEqual([]);
  });
});

describe('scrape: caps', () => {
  test('behavior: reading stops at maxBytes (an endless body still gives an answer)', async () => {
    const capped = createScraper({ ...CAPS, maxBytes: 100_000, allowPrivateNetworks: true });
    const result = await capped.scrape(`${local.origin}/endless`);
    expectOk(result);
    expect(result.text).toHaveLength(100_000);
    expect(result.text).toMatch(/^a+$/);
  });

  test('behavior: maxBytes applies to the decompressed body', async () => {
    const capped = createScraper({ ...CAPS, maxBytes: 200, allowPrivateNetworks: true });
    const result = await capped.scrape(`${local.origin}/gzip.html`);
    expectOk(result);
    expect(result.text).not.toContain('Second paragraph');
  });

  test('behavior: a stalled body fails at the time cap', async () => {
    const quick = createScraper({ ...CAPS, timeoutMs: 300, allowPrivateNetworks: true });
    expectRefused(await quick.scrape(`${local.origin}/stall`), /timed out after 300 ms/);
  });

  test('behavior: a caller abort ends the scrape', async () => {
    const controller = new AbortController();
    const pending = open.scrape(`${local.origin}/stall`, controller.signal);
    controller.abort();
    expectRefused(await pending, /^aborted$/);
  });

  test('behavior: redirects are followed up to maxRedirects, then refused', async () => {
    const followed = await open.scrape(`${local.origin}/chain?n=4`);
    expectOk(followed);
    expect(followed.text).toContain('plain text');
    expect(hits.map((h) => h.path)).toEqual(['/chain', '/chain', '/chain', '/chain', '/chain', '/plain.txt']);
    expectRefused(await open.scrape(`${local.origin}/chain?n=5`), /more than 5 redirects/);
    expectRefused(await open.scrape(`${local.origin}/loop`), /more than 5 redirects/);
    const none = createScraper({ ...CAPS, maxRedirects: 0, allowPrivateNetworks: true });
    expectRefused(await none.scrape(`${local.origin}/redirect`), /more than 0 redirects/);
    expectRefused(await open.scrape(`${local.origin}/no-location`), /without a Location/);
    expectRefused(await open.scrape(`${local.origin}/bad-location`), /invalid Location/);
  });

  test('behavior: a redirect to another scheme is refused', async () => {
    const to = encodeURIComponent('file:///etc/passwd');
    expectRefused(await open.scrape(`${local.origin}/redirect?to=${to}`), /only http and https/);
  });
});

describe('scrape: SSRF protection (private networks off)', () => {
  test('behavior: literal private, loopback, link-local and unspecified IPv4 are refused without a request', async () => {
    for (const url of [
      `${local.origin}/page.html`,
      'http://127.0.0.1/',
      'http://10.0.0.1/',
      'http://172.16.0.1/',
      'http://192.168.0.1/',
      'http://100.64.0.1/',
      'http://169.254.169.254/latest/meta-data/',
      'http://0.0.0.0/',
      'http://224.0.0.1/',
    ]) {
      expectRefused(await guarded.scrape(url), /^refused: /);
    }
    expect(hits).toEqual([]);
    expect(connects).toEqual([]);
    expect(resolverCalls).toEqual([]);
  });

  test('behavior: decimal, hex, octal and short IPv4 spellings of loopback are refused', async () => {
    for (const spelling of ['2130706433', '0x7f.1', '0x7f000001', '0177.0.0.1', '127.1', '017700000001']) {
      expectRefused(await guarded.scrape(`http://${spelling}:${local.port}/page.html`), /loopback/);
    }
    expect(hits).toEqual([]);
    expect(connects).toEqual([]);
  });

  test('behavior: IPv6 loopback, ULA, link-local and IPv4-mapped forms are refused', async () => {
    for (const host of [
      '[::1]',
      '[0:0:0:0:0:0:0:1]',
      '[::]',
      '[fd00::1]',
      '[fe80::1]',
      '[::ffff:127.0.0.1]',
      '[::ffff:7f00:1]',
      '[::ffff:10.0.0.1]',
      '[::ffff:169.254.169.254]',
    ]) {
      expectRefused(await guarded.scrape(`http://${host}:${local.port}/page.html`), /^refused: /);
    }
    expect(hits).toEqual([]);
    expect(connects).toEqual([]);
  });

  test('behavior: DNS answers are checked: a name that resolves to a private address is refused', async () => {
    resolverCalls.length = 0;
    expectRefused(
      await guarded.scrape(`http://internal.test:${local.port}/page.html`),
      /loopback address \(127/,
    );
    expectRefused(await guarded.scrape('http://metadata.test/latest/'), /linkLocal/);
    expectRefused(await guarded.scrape(`http://v6-loopback.test:${local.port}/`), /loopback/);
    expectRefused(await guarded.scrape(`http://mapped.test:${local.port}/`), /loopback/);
    // One private answer among public ones refuses the name.
    expectRefused(
      await guarded.scrape(`http://mixed.test:${pub.port}/page.html`),
      /private address \(10\.1\.2\.3\)/,
    );
    expectRefused(await guarded.scrape('http://unknown.test/'), /cannot resolve unknown\.test/);
    expect(resolverCalls).toEqual([
      'internal.test',
      'metadata.test',
      'v6-loopback.test',
      'mapped.test',
      'mixed.test',
      'unknown.test',
    ]);
    expect(hits).toEqual([]);
    expect(connects).toEqual([]);
  });

  test('behavior: the system resolver is vetted too: localhost is refused', async () => {
    const system = createScraper({ ...CAPS, allowPrivateNetworks: false });
    expectRefused(
      await system.scrape(`http://localhost:${local.port}/page.html`),
      /^refused: localhost is a loopback/,
    );
    expect(hits).toEqual([]);
  });

  test('behavior: a public name is fetched at its vetted address, with its own Host header', async () => {
    resolverCalls.length = 0;
    const result = await guarded.scrape(`http://public.test:${pub.port}/page.html`);
    expectOk(result);
    expect(result.title).toBe('The Test & Page');
    // `.test` names exist nowhere else: the connection used the answer the scraper vetted, resolved once.
    expect(resolverCalls).toEqual(['public.test']);
    expect(connects).toEqual(['127.0.0.2']);
    expect(hits).toEqual([{ site: 'public', path: '/page.html', host: `public.test:${pub.port}` }]);
  });

  test('behavior: a redirect from an allowed host to a private address is refused, in every form', async () => {
    const targets = [
      `${local.origin}/page.html`,
      `http://2130706433:${local.port}/page.html`,
      `http://[::1]:${local.port}/page.html`,
      `http://internal.test:${local.port}/page.html`,
      'http://169.254.169.254/latest/meta-data/',
    ];
    for (const target of targets) {
      hits.length = 0;
      connects.length = 0;
      const result = await guarded.scrape(`${pub.origin}/redirect?to=${encodeURIComponent(target)}`);
      expectRefused(result, /^refused: /);
      expect(hits.map((h) => h.site)).toEqual(['public']);
      expect(connects).toEqual(['127.0.0.2']);
    }
  });

  test('behavior: a relative redirect on an allowed host is followed', async () => {
    const result = await guarded.scrape(`${pub.origin}/redirect?to=/plain.txt`);
    expectOk(result);
    expect(result.text).toContain('plain text');
  });
});
