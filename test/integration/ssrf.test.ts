/**
 * The scraping SSRF suite, beyond what test/integration/chat-web-scrape.test.ts covers (literal private IPv4
 * and IPv6, numeric spellings of loopback, DNS answers of loopback / link-local / 10.x / mapped loopback,
 * redirects to those): DNS answers in every other refused range (CGNAT, unspecified, broadcast, multicast,
 * benchmarking, reserved, NAT64, 6to4, Teredo, IPv4-compatible, ULA, link-local), DNS rebinding (a name that
 * answers public when vetted and private afterwards), URL confusion (userinfo, fragments, case, trailing dot,
 * full-width digits, `0`), redirects in those forms and through a chain of allowed hops, and end to end through
 * POST /chat/completions on the real server, whose default configuration refuses private networks.
 *
 * DNS cannot be reached here, so names resolve through the scraper's resolver port; 127.0.0.2 stands in for a
 * public host (`allowAddress`), and `beforeConnect` records every address contacted and refuses anything but
 * loopback, so a regression could never reach a real network.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { createScraper, type Resolver, type ScrapeResult } from '../../server/domains/chat/web/scrape.ts';
import { type StartedServer, startServer, TEST_ADMIN_KEY } from '../support/server.ts';

type Hit = { site: string; path: string };
const hits: Hit[] = [];
const connects: string[] = [];
const resolverCalls: string[] = [];

function site(name: string) {
  return (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? '/', 'http://x');
    hits.push({ site: name, path: url.pathname });
    if (url.pathname === '/redirect') {
      // Non-ASCII (full-width digits) travels percent-encoded, as servers send it.
      const to = url.searchParams.get('to') ?? '/';
      res.writeHead(302, { location: to.replace(/[^\x20-\x7e]/g, (c) => encodeURIComponent(c)) }).end();
      return;
    }
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`page of ${name}`);
  };
}

let local: { server: Server; port: number };
let pub: { server: Server; port: number };

async function listen(name: string, host: string) {
  const server = createServer(site(name));
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return { server, port: (server.address() as AddressInfo).port };
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
  resolverCalls.length = 0;
});

/** DNS answers in every refused range, one name each. */
const REFUSED_ANSWERS: Record<string, string> = {
  'cgnat.test': '100.64.1.1',
  'unspecified.test': '0.0.0.0',
  'broadcast.test': '255.255.255.255',
  'multicast.test': '224.0.0.251',
  'benchmark.test': '198.18.0.1',
  'reserved.test': '240.0.0.1',
  'private172.test': '172.31.255.254',
  'private192.test': '192.168.1.1',
  'nat64.test': '64:ff9b::7f00:1',
  'sixtofour.test': '2002:a9fe:a9fe::1',
  'teredo.test': '2001::1',
  'compatible.test': '::127.0.0.1',
  'ula.test': 'fd00::1',
  'linklocal6.test': 'fe80::1',
  'multicast6.test': 'ff02::1',
  'unspecified6.test': '::',
  'mapped-metadata.test': '::ffff:a9fe:a9fe',
};

let rebindCount = 0;
const resolve: Resolver = async (hostname) => {
  resolverCalls.push(hostname);
  const one = (address: string) => [{ address, family: (address.includes(':') ? 6 : 4) as 4 | 6 }];
  if (hostname === 'public.test') return one('127.0.0.2');
  if (hostname === 'internal.test') return one('127.0.0.1');
  // DNS rebinding: public when first asked (the vetting), loopback on every later question.
  if (hostname === 'rebind.test') return one(rebindCount++ === 0 ? '127.0.0.2' : '127.0.0.1');
  const answer = REFUSED_ANSWERS[hostname];
  if (answer) return one(answer);
  throw new Error(`ENOTFOUND ${hostname}`);
};

const guarded = createScraper({
  allowPrivateNetworks: false,
  maxBytes: 100_000,
  timeoutMs: 10_000,
  maxRedirects: 5,
  resolve,
  allowAddress: (address) => address === '127.0.0.2',
  beforeConnect: ({ address }) => {
    connects.push(address);
    if (!address.startsWith('127.')) throw new Error(`test safety: refusing to contact ${address}`);
  },
});

function expectRefused(result: ScrapeResult, pattern: RegExp = /^refused: |cannot resolve/) {
  expect(result.ok, JSON.stringify(result)).toBe(false);
  if (!result.ok) expect(result.error).toMatch(pattern);
}

describe('SSRF: DNS answers', () => {
  test('behavior: a name answering any refused range (IPv4 and IPv6, embedded IPv4 forms) is refused before connecting', async () => {
    for (const name of Object.keys(REFUSED_ANSWERS)) {
      expectRefused(await guarded.scrape(`http://${name}:${local.port}/`), /^refused: /);
    }
    expect(resolverCalls).toEqual(Object.keys(REFUSED_ANSWERS));
    expect(connects).toEqual([]);
    expect(hits).toEqual([]);
  });

  test('behavior: DNS rebinding: the connection goes to the address that was vetted, never to a later answer', async () => {
    rebindCount = 0;
    const result = await guarded.scrape(`http://rebind.test:${pub.port}/page`);
    expect(result.ok).toBe(true);
    expect(connects).toEqual(['127.0.0.2']);
    expect(hits).toEqual([{ site: 'public', path: '/page' }]);
    // A redirect back to the same name asks DNS again, and the new (private) answer is vetted and refused.
    hits.length = 0;
    connects.length = 0;
    rebindCount = 0;
    const again = await guarded.scrape(
      `http://rebind.test:${pub.port}/redirect?to=${encodeURIComponent(`http://rebind.test:${pub.port}/page`)}`,
    );
    expectRefused(again, /^refused: .*loopback/);
    expect(connects).toEqual(['127.0.0.2']);
    expect(hits).toEqual([{ site: 'public', path: '/redirect' }]);
  });
});

describe('SSRF: URL confusion', () => {
  test('behavior: userinfo, fragments, case, trailing dots, full-width digits and `0` never reach a private host', async () => {
    for (const url of [
      `http://public.test@127.0.0.1:${local.port}/`,
      `http://public.test:${pub.port}@127.0.0.1:${local.port}/`,
      `http://127.0.0.1:${local.port}#@public.test/`,
      `http://LOCALHOST:${local.port}/`,
      `http://localhost.:${local.port}/`,
      `http://127.0.0.1.:${local.port}/`,
      `http://１２７.０.０.１:${local.port}/`,
      `http://0:${local.port}/`,
      `http://0x7f.0.0.1:${local.port}/`,
      `http://[::ffff:127.0.0.1]:${local.port}/`,
      `http://INTERNAL.test:${local.port}/`,
    ]) {
      expectRefused(await guarded.scrape(url));
    }
    expect(connects).toEqual([]);
    expect(hits).toEqual([]);
  });
});

describe('SSRF: redirects', () => {
  test('behavior: a redirect to a private host in any form, or through a chain of allowed hops, is refused', async () => {
    const targets = [
      `//internal.test:${local.port}/`,
      `//127.0.0.1:${local.port}/`,
      `http://0:${local.port}/`,
      `http://LOCALHOST:${local.port}/`,
      `http://１２７.０.０.１:${local.port}/`,
      `http://public.test@127.0.0.1:${local.port}/`,
      `http://nat64.test:${local.port}/`,
      `http://mapped-metadata.test/latest/meta-data/`,
      `http://[::ffff:7f00:1]:${local.port}/`,
      // Allowed, allowed, then private.
      `/redirect?to=${encodeURIComponent(`http://public.test:${pub.port}/redirect?to=${encodeURIComponent(`http://127.0.0.1:${local.port}/`)}`)}`,
    ];
    for (const target of targets) {
      hits.length = 0;
      connects.length = 0;
      const result = await guarded.scrape(
        `http://public.test:${pub.port}/redirect?to=${encodeURIComponent(target)}`,
      );
      expectRefused(result);
      expect(connects.every((a) => a === '127.0.0.2')).toBe(true);
      expect(hits.every((h) => h.site === 'public')).toBe(true);
      expect(hits.length).toBeGreaterThan(0);
    }
  });
});

describe('SSRF: end to end through POST /chat/completions', () => {
  const scratch = mkdtempSync(join(tmpdir(), 'ssrf-'));
  let server: StartedServer;

  beforeAll(async () => {
    // The default configuration: SCRAPE_ALLOW_PRIVATE_NETWORKS is off.
    server = await startServer(`sqlite:${join(scratch, 'ssrf.db')}`, { VIDEO_WORKER_ENABLED: 'false' });
  });

  afterAll(async () => {
    await server?.close();
    rmSync(scratch, { recursive: true, force: true });
  });

  const chatAbout = (target: StartedServer, urls: string[]) =>
    fetch(`${target.directBase}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_ADMIN_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'llama-3.3-70b',
        max_tokens: 8,
        messages: [{ role: 'user', content: `Summarise ${urls.join(' and ')}` }],
        service_parameters: { enable_web_scraping: true },
      }),
    });

  test('behavior: URLs of loopback, private and metadata hosts in a message are never fetched; the chat still answers', async () => {
    const urls = [
      `http://127.0.0.1:${local.port}/secret`,
      `http://2130706433:${local.port}/secret`,
      `http://[::ffff:127.0.0.1]:${local.port}/secret`,
      `http://localhost:${local.port}/secret`,
      'http://169.254.169.254/latest/meta-data/',
    ];
    const response = await chatAbout(server, urls);
    expect(response.status).toBe(200);
    const body = (await response.json()) as { service_parameters?: { enable_web_scraping?: boolean } };
    expect(body.service_parameters?.enable_web_scraping).toBe(true);
    expect(hits).toEqual([]);
    // The control: the same request to a server configured to allow private networks does fetch the page.
    const open = await startServer(`sqlite:${join(scratch, 'ssrf-open.db')}`, {
      VIDEO_WORKER_ENABLED: 'false',
      SCRAPE_ALLOW_PRIVATE_NETWORKS: 'true',
    });
    try {
      expect((await chatAbout(open, [`http://127.0.0.1:${local.port}/secret`])).status).toBe(200);
      expect(hits).toEqual([{ site: 'local', path: '/secret' }]);
    } finally {
      await open.close();
    }
  });
});
