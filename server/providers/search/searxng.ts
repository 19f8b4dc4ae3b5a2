/**
 * The search port over SearXNG's JSON API (`GET {base}/search?q=…&format=json`; the instance must list `json`
 * under `search.formats` in its settings). The reply is distrusted: a time cap, a size cap while reading, a
 * schema check, and every string cleaned and capped before it can reach a prompt.
 */
import { z } from 'zod';
import { readBodyCapped, redactUrl } from '../http.ts';
import { SearchError, type SearchProvider, type SearchResult } from './types.ts';

export type SearxngSearchOptions = {
  /** The instance's base URL, e.g. `http://127.0.0.1:8888` (a path prefix is kept). */
  baseUrl: string;
  /** Whole request, headers and body included. */
  timeoutMs: number;
  /** Largest reply read, in bytes (default 2 MiB). */
  maxBytes?: number;
  /** Longest `content` kept per result, in characters (default 2,000). */
  maxContentChars?: number;
  /** Extra query parameters (`language`, `safesearch`, `categories`, …). */
  params?: Record<string, string>;
  fetch?: typeof fetch;
};

const DEFAULT_MAX_BYTES = 2 * 1024 * 1024;
const DEFAULT_MAX_CONTENT_CHARS = 2_000;
const MAX_TITLE_CHARS = 300;

/** The part of a SearXNG reply we use. Items are checked one by one so one odd engine cannot sink the rest. */
const replySchema = z.object({ results: z.array(z.unknown()) });
const itemSchema = z.object({
  url: z.string().min(1).max(4_096),
  title: z.string().nullish(),
  content: z.string().nullish(),
  publishedDate: z.string().nullish(),
});

export function createSearxngSearch(options: SearxngSearchOptions): SearchProvider {
  const base = new URL(options.baseUrl);
  if (base.protocol !== 'http:' && base.protocol !== 'https:') {
    throw new TypeError('SearXNG base URL must be http or https');
  }
  const endpoint = new URL(`${base.pathname.replace(/\/+$/, '')}/search`, base);
  // Credentials in the URL (an instance behind a password-protected proxy) travel as Basic auth instead.
  const headers: Record<string, string> = { accept: 'application/json' };
  if (endpoint.username || endpoint.password) {
    const user = decodeURIComponent(endpoint.username);
    const password = decodeURIComponent(endpoint.password);
    headers.authorization = `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
    endpoint.username = '';
    endpoint.password = '';
  }
  const shown = redactUrl(endpoint);
  const doFetch = options.fetch ?? fetch;
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
  const maxContentChars = options.maxContentChars ?? DEFAULT_MAX_CONTENT_CHARS;

  return {
    async search(query, { limit, signal }) {
      if (limit <= 0 || query.trim() === '') return [];
      const url = new URL(endpoint);
      url.searchParams.set('q', query);
      url.searchParams.set('format', 'json');
      for (const [key, value] of Object.entries(options.params ?? {})) url.searchParams.set(key, value);

      const timeout = AbortSignal.timeout(options.timeoutMs);
      const combined = signal ? AbortSignal.any([signal, timeout]) : timeout;
      const failure = (error: unknown): SearchError => {
        if (error instanceof SearchError) return error;
        if (signal?.aborted)
          return new SearchError('aborted', 'search aborted by the caller', { cause: error });
        if (timeout.aborted) {
          return new SearchError('timeout', `search timed out after ${options.timeoutMs} ms (${shown})`, {
            cause: error,
          });
        }
        return new SearchError('network', `search request to ${shown} failed`, { cause: error });
      };

      let body: string;
      try {
        const response = await doFetch(url, {
          headers,
          signal: combined,
          redirect: 'error',
        });
        if (!response.ok) {
          await response.body?.cancel().catch(() => {});
          const hint = response.status === 403 ? ' (is `json` enabled in search.formats?)' : '';
          throw new SearchError('http_status', `search engine answered HTTP ${response.status}${hint}`, {
            status: response.status,
          });
        }
        body = await readCapped(response, maxBytes);
      } catch (error) {
        throw failure(error);
      }

      let json: unknown;
      try {
        json = JSON.parse(body);
      } catch (error) {
        throw new SearchError('invalid_response', 'search engine reply is not JSON', { cause: error });
      }
      const reply = replySchema.safeParse(json);
      if (!reply.success) {
        throw new SearchError('invalid_response', 'search engine reply has no results array', {
          cause: reply.error,
        });
      }

      const results: SearchResult[] = [];
      const seen = new Set<string>();
      for (const raw of reply.data.results) {
        if (results.length >= limit) break;
        const item = itemSchema.safeParse(raw);
        if (!item.success) continue;
        const link = httpUrl(item.data.url);
        if (!link || seen.has(link)) continue;
        seen.add(link);
        const title = clean(item.data.title ?? '', MAX_TITLE_CHARS) || link;
        const result: SearchResult = {
          title,
          url: link,
          content: clean(item.data.content ?? '', maxContentChars),
        };
        const date = item.data.publishedDate ? clean(item.data.publishedDate, 40) : '';
        if (date) result.publishedDate = date;
        results.push(result);
      }
      return results;
    },
  };
}

/** The URL in canonical form when it is http(s), else undefined (no `javascript:` links reach a client). */
function httpUrl(value: string): string | undefined {
  try {
    const url = new URL(value);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : undefined;
  } catch {
    return undefined;
  }
}

/** Control characters removed, whitespace collapsed, length capped (on a code-point boundary). */
function clean(value: string, max: number): string {
  const text = value
    .replace(/\p{Cc}+/gu, ' ')
    .replace(/\s+/g, ' ')
    .trim();
  if (text.length <= max) return text;
  let cut = text.slice(0, max);
  if (/[\ud800-\udbff]$/.test(cut)) cut = cut.slice(0, -1);
  return `${cut.trimEnd()}…`;
}

/** The body as UTF-8 within `maxBytes`, or the `too_large` search failure. */
async function readCapped(response: Response, maxBytes: number): Promise<string> {
  const bytes = await readBodyCapped(response, maxBytes);
  if (!bytes) throw new SearchError('too_large', `search engine reply is larger than ${maxBytes} bytes`);
  return bytes.toString('utf8');
}
