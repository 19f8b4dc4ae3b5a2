/**
 * Web scraping for chat (`enable_web_scraping`): finds up to five URLs in the user's message and fetches each
 * as text, with the SSRF rule of `address.ts` enforced on every hop. Names are resolved here, every answer is
 * vetted, and the socket connects to the vetted address through a pinned `lookup`, so a second DNS answer cannot
 * swap in a private address between check and connect; literal IPs (in any spelling, which the WHATWG URL parser
 * canonicalises: `2130706433`, `0x7f.1`, `[::ffff:7f00:1]`) and every redirect target are vetted the same way.
 * Only http(s); a time cap over the whole scrape, a redirect cap, and reading stops at `maxBytes` (after
 * decompression). HTML becomes text through `html-to-text`; text/plain passes through; other types are refused.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { isIP, type LookupFunction } from 'node:net';
import { pipeline, type Readable } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import { compile, type HtmlToTextOptions } from 'html-to-text';
import { refusedAddressReason } from './address.ts';

/** How many URLs one message may have scraped (the interface's limit). */
export const MAX_SCRAPE_URLS = 5;

export type ScrapeResult =
  | { url: string; ok: true; title?: string; text: string }
  | { url: string; ok: false; error: string };

export type Scraper = { scrape(url: string, signal?: AbortSignal): Promise<ScrapeResult> };

/** A resolved address, as `dns.lookup(name, {all: true})` gives it. */
export type ResolvedAddress = { address: string; family: 4 | 6 };
/** Name resolution; injectable so tests can make a name point anywhere without a DNS server. */
export type Resolver = (hostname: string) => Promise<ResolvedAddress[]>;

export type ScraperOptions = {
  /** Lets URLs reach private, loopback and link-local addresses (configuration; off in production). */
  allowPrivateNetworks: boolean;
  /** Bytes read from one page (after decompression); reading stops there and the text is cut. */
  maxBytes: number;
  /** The whole scrape: DNS, every redirect, headers and body. */
  timeoutMs: number;
  maxRedirects: number;
  resolve?: Resolver;
  /**
   * Addresses let through although the rule refuses them: an operator's allow-list of internal hosts, and how
   * tests stand a loopback server in for a public host.
   */
  allowAddress?: (address: string) => boolean;
  /**
   * Called with the address about to be connected to, after every check; throwing stops the scrape. A seam for
   * tests, which use it to guarantee that nothing but loopback is ever contacted even if a check regressed.
   */
  beforeConnect?: (target: ResolvedAddress) => void;
  userAgent?: string;
};

/**
 * The http(s) URLs in a text, in order of appearance, de-duplicated, at most `max`. Trailing sentence
 * punctuation and unbalanced closing brackets (as in `(see https://x.example)` or a markdown link) are not part
 * of the URL.
 */
export function extractUrls(text: string, max = MAX_SCRAPE_URLS): string[] {
  const found: string[] = [];
  if (max <= 0) return found;
  for (const match of text.matchAll(/\bhttps?:\/\/[^\s<>"'`\p{Cc}]+/giu)) {
    const url = parseHttpUrl(trimUrl(match[0]));
    if (!url || found.includes(url.href)) continue;
    found.push(url.href);
    if (found.length >= max) break;
  }
  return found;
}

function trimUrl(candidate: string): string {
  let url = candidate;
  for (;;) {
    const last = url.at(-1);
    if (last && '.,;:!?\'"*_'.includes(last)) {
      url = url.slice(0, -1);
      continue;
    }
    const pair = last === ')' ? '(' : last === ']' ? '[' : last === '}' ? '{' : undefined;
    if (pair && last && count(url, last) > count(url, pair)) {
      url = url.slice(0, -1);
      continue;
    }
    return url;
  }
}

const count = (text: string, char: string) => text.split(char).length - 1;

function parseHttpUrl(value: string): URL | undefined {
  try {
    const url = new URL(value);
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.hostname !== '' ? url : undefined;
  } catch {
    return undefined;
  }
}

/** A scrape that cannot go on; its message becomes the `error` of the result. */
class ScrapeFailure extends Error {}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const HTML_TYPES = new Set(['text/html', 'application/xhtml+xml']);
const TEXT_TYPES = new Set(['text/plain']);

const HEADINGS = ['h1', 'h2', 'h3', 'h4', 'h5', 'h6'].map((selector) => ({
  selector,
  options: { uppercase: false },
}));
const SKIPPED = ['script', 'style', 'noscript', 'template', 'svg', 'iframe', 'object', 'img', 'button'].map(
  (selector) => ({ selector, format: 'skip' }),
);
const BODY_OPTIONS: HtmlToTextOptions = {
  wordwrap: false,
  selectors: [
    ...SKIPPED,
    ...HEADINGS,
    { selector: 'a', options: { ignoreHref: true } },
    { selector: 'table', format: 'dataTable' },
  ],
};
const TITLE_OPTIONS: HtmlToTextOptions = {
  wordwrap: false,
  baseElements: { selectors: ['title'], returnDomByDefault: false },
};
const bodyToText = compile(BODY_OPTIONS);
const titleToText = compile(TITLE_OPTIONS);

/** A scraper. `scrape` never throws: every failure is an `ok: false` result (only those are not charged). */
export function createScraper(options: ScraperOptions): Scraper {
  const resolve = options.resolve ?? defaultResolve;
  const userAgent = options.userAgent ?? 'Mozilla/5.0 (compatible; service-api-scraper/1.0)';

  return {
    async scrape(url, signal) {
      const deadline = AbortSignal.timeout(options.timeoutMs);
      const combined = signal ? AbortSignal.any([signal, deadline]) : deadline;
      try {
        const page = await fetchPage(url, combined);
        return { url, ok: true, ...page };
      } catch (error) {
        let message: string;
        if (signal?.aborted) message = 'aborted';
        else if (deadline.aborted) message = `timed out after ${options.timeoutMs} ms`;
        else if (error instanceof ScrapeFailure) message = error.message;
        else message = `fetch failed: ${error instanceof Error ? error.message : String(error)}`;
        return { url, ok: false, error: message };
      }
    },
  };

  async function fetchPage(start: string, signal: AbortSignal): Promise<{ title?: string; text: string }> {
    let current = start;
    for (let hop = 0; ; hop++) {
      const url = parseHttpUrl(current);
      if (!url) throw new ScrapeFailure('only http and https URLs can be scraped');
      const target = await vet(url, signal);
      options.beforeConnect?.(target);
      const response = await get(url, target, signal);
      const status = response.statusCode ?? 0;
      if (REDIRECTS.has(status)) {
        response.destroy();
        const location = response.headers.location;
        if (!location) throw new ScrapeFailure(`HTTP ${status} without a Location header`);
        if (hop >= options.maxRedirects)
          throw new ScrapeFailure(`more than ${options.maxRedirects} redirects`);
        const next = URL.canParse(location, url) ? new URL(location, url) : undefined;
        if (!next) throw new ScrapeFailure(`HTTP ${status} with an invalid Location header`);
        current = next.href;
        continue;
      }
      if (status < 200 || status > 299) {
        response.destroy();
        throw new ScrapeFailure(`HTTP ${status}`);
      }
      return read(response, signal);
    }
  }

  /** The address to connect to: the literal, or the resolver's first answer once every answer passed. */
  async function vet(url: URL, signal: AbortSignal): Promise<ResolvedAddress> {
    const host = url.hostname.replace(/^\[|\]$/g, '');
    const family = isIP(host);
    let answers: ResolvedAddress[];
    if (family === 4 || family === 6) {
      answers = [{ address: host, family }];
    } else {
      try {
        answers = await abortable(resolve(host), signal);
      } catch (error) {
        if (signal.aborted) throw error;
        throw new ScrapeFailure(`cannot resolve ${host}`);
      }
      if (answers.length === 0) throw new ScrapeFailure(`cannot resolve ${host}`);
    }
    if (!options.allowPrivateNetworks) {
      for (const answer of answers) {
        if (options.allowAddress?.(answer.address)) continue;
        const reason = refusedAddressReason(answer.address);
        // A name with one private answer is refused whole: which answer a connect would use is not ours to pick.
        if (reason) throw new ScrapeFailure(`refused: ${host} is a ${reason} (${answer.address})`);
      }
    }
    return answers[0] as ResolvedAddress;
  }

  function get(url: URL, target: ResolvedAddress, signal: AbortSignal): Promise<IncomingMessage> {
    // The connect goes to the vetted address whatever the name would resolve to now; Host, SNI and the
    // certificate check still use the name.
    const pinned: LookupFunction = (_hostname, lookupOptions, callback) => {
      if (lookupOptions.all) callback(null, [target]);
      else callback(null, target.address, target.family);
    };
    const request = url.protocol === 'https:' ? httpsRequest : httpRequest;
    return new Promise((resolveResponse, reject) => {
      const req = request(url, {
        method: 'GET',
        agent: false,
        lookup: pinned,
        signal,
        headers: {
          'user-agent': userAgent,
          accept: 'text/html,application/xhtml+xml,text/plain;q=0.9',
          'accept-encoding': 'gzip, deflate, br',
        },
      });
      req.once('response', resolveResponse);
      req.once('error', reject);
      req.end();
    });
  }

  async function read(
    response: IncomingMessage,
    signal: AbortSignal,
  ): Promise<{ title?: string; text: string }> {
    const { type, charset } = contentType(response.headers['content-type']);
    const html = HTML_TYPES.has(type);
    if (!html && !TEXT_TYPES.has(type)) {
      response.destroy();
      throw new ScrapeFailure(`unsupported content type ${type || '(none)'}`);
    }
    const body = decoded(response);
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of body as AsyncIterable<Buffer>) {
      if (signal.aborted) break;
      const room = options.maxBytes - size;
      chunks.push(chunk.byteLength > room ? chunk.subarray(0, room) : chunk);
      size += Math.min(chunk.byteLength, room);
      if (size >= options.maxBytes) break; // leaving the loop destroys the stream: reading stops here
    }
    body.destroy();
    response.destroy();
    if (signal.aborted) throw signal.reason;
    const bytes = Buffer.concat(chunks);
    // Without a charset in the header, an HTML page may declare one in a <meta> tag near its start.
    const declared = charset ?? (html ? metaCharset(bytes) : undefined);
    const raw = decode(bytes, declared);
    if (!html) return { text: tidy(raw) };
    const title = tidy(titleToText(raw)).replace(/\s+/g, ' ');
    const text = tidy(bodyToText(raw));
    return title ? { title, text } : { text };
  }
}

function decoded(response: IncomingMessage): Readable {
  const encoding = (response.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
  const noop = () => {};
  switch (encoding) {
    case 'identity':
    case '':
      return response;
    case 'gzip':
    case 'x-gzip':
      return pipeline(response, createGunzip(), noop);
    case 'deflate':
      return pipeline(response, createInflate(), noop);
    case 'br':
      return pipeline(response, createBrotliDecompress(), noop);
    default:
      response.destroy();
      throw new ScrapeFailure(`unsupported content encoding ${encoding}`);
  }
}

function contentType(header: string | undefined): { type: string; charset: string | undefined } {
  const [essence = '', ...params] = (header ?? '').split(';');
  const charset = params
    .map((p) => p.trim().match(/^charset\s*=\s*"?([^";]+)"?$/i)?.[1])
    .find((c) => c !== undefined);
  return { type: essence.trim().toLowerCase(), charset };
}

function metaCharset(bytes: Buffer): string | undefined {
  const head = bytes.subarray(0, 2_048).toString('latin1');
  return head.match(/<meta[^>]+charset\s*=\s*["']?\s*([\w-]+)/i)?.[1];
}

function decode(bytes: Buffer, charset: string | undefined): string {
  let decoder: TextDecoder;
  try {
    decoder = new TextDecoder(charset ?? 'utf-8');
  } catch {
    decoder = new TextDecoder('utf-8');
  }
  // A cut in the middle of a multi-byte character leaves one replacement character at the end.
  return decoder.decode(bytes).replace(/\ufffd$/, '');
}

/** Trailing spaces dropped, runs of blank lines kept to one, ends trimmed. */
function tidy(text: string): string {
  return text
    .replace(/[ \t]+$/gm, '')
    .replace(/\n{3,}/g, '\n\n')
    .trim();
}

function abortable<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

async function defaultResolve(hostname: string): Promise<ResolvedAddress[]> {
  const answers = await dnsLookup(hostname, { all: true, verbatim: true });
  return answers.map((a) => ({ address: a.address, family: a.family === 6 ? 6 : 4 }));
}
