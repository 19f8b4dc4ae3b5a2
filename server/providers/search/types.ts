/**
 * The web-search port: what chat completions ask of a search engine. One implementation talks to a
 * self-hosted SearXNG (`searxng.ts`); tests and other engines implement the same two types.
 */

/** One hit, already cleaned: plain strings, an http(s) URL, text capped by the adapter. */
export type SearchResult = { title: string; url: string; content: string; publishedDate?: string };

export type SearchProvider = {
  /** At most `limit` results, best first. Rejects with a {@link SearchError} when the engine fails. */
  search(query: string, options: { limit: number; signal?: AbortSignal }): Promise<SearchResult[]>;
};

/** Why a search failed; the chat service maps every kind to the same degraded answer (no sources). */
export type SearchErrorKind =
  | 'timeout'
  | 'aborted'
  | 'network'
  | 'http_status'
  | 'too_large'
  | 'invalid_response';

/** A failed search. The message never contains the engine's credentials (URLs are redacted). */
export class SearchError extends Error {
  override readonly name = 'SearchError';
  readonly kind: SearchErrorKind;
  readonly status: number | undefined;

  constructor(kind: SearchErrorKind, message: string, options: { status?: number; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.kind = kind;
    this.status = options.status;
  }
}
