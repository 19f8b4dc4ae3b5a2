/**
 * The shapes in which search results leave the service: `service_parameters.web_search_citations` (numbered
 * like the `^n^` markers, 1-based in the given order) and the `service_web_search_documents` tool call of
 * `return_search_results_as_documents`, so OpenAI clients can read the sources without knowing our fields.
 */
import type { ChatToolCall, ChatWebSearchCitation } from '../../../../generated/api.d.ts';
import type { SearchResult } from '../../../providers/search/types.ts';

/** The tool name the interface gives the synthetic documents call. */
export const SEARCH_DOCUMENTS_TOOL = 'service_web_search_documents';
/** Its call id (also the `tool_call_id` of a tool message carrying the same documents). */
export const SEARCH_DOCUMENTS_CALL_ID = 'web_search_call';

/** `web_search_citations`: one entry per result, in the order the model saw them as [1]..[n]. */
export function webSearchCitations(results: SearchResult[]): ChatWebSearchCitation[] {
  return results.map((result) => {
    const citation: ChatWebSearchCitation = { title: result.title, url: result.url };
    if (result.content) citation.content = result.content;
    const date = result.publishedDate ? isoDate(result.publishedDate) : undefined;
    if (date) citation.date = date;
    return citation;
  });
}

export type SearchDocument = {
  id: string;
  title: string;
  url: string;
  snippet?: string;
  published_at?: string;
};

/** The documents of the tool call; `id` is the 1-based citation number as a string. */
export function searchDocuments(results: SearchResult[]): SearchDocument[] {
  return results.map((result, i) => {
    const document: SearchDocument = { id: String(i + 1), title: result.title, url: result.url };
    if (result.content) document.snippet = result.content;
    const date = result.publishedDate ? isoDate(result.publishedDate) : undefined;
    if (date) document.published_at = date;
    return document;
  });
}

/** The `service_web_search_documents` tool call, its `arguments` being `{"documents": [...]}` as JSON text. */
export function searchDocumentsToolCall(results: SearchResult[]): ChatToolCall {
  return {
    id: SEARCH_DOCUMENTS_CALL_ID,
    type: 'function',
    function: {
      name: SEARCH_DOCUMENTS_TOOL,
      arguments: JSON.stringify({ documents: searchDocuments(results) }),
    },
  };
}

/** `YYYY-MM-DD` when the engine's date parses, else the engine's text as given (it is only informative). */
function isoDate(value: string): string {
  // A leading calendar date is taken as written: parsing `2025-03-01T00:00:00` would apply the local zone.
  const leading = value.match(/^\d{4}-\d{2}-\d{2}/)?.[0];
  if (leading) return leading;
  const time = Date.parse(value);
  return Number.isNaN(time) ? value : new Date(time).toISOString().slice(0, 10);
}
