import { describe, expect, test } from 'vitest';
import {
  SEARCH_DOCUMENTS_TOOL,
  searchDocumentsToolCall,
  webSearchCitations,
} from '../../server/domains/chat/web/documents.ts';
import type { Scraper } from '../../server/domains/chat/web/scrape.ts';
import { scrapeContext, scrapedPages, scrapeMessage } from '../../server/domains/chat/web/scraping.ts';
import type { SearchResult } from '../../server/providers/search/types.ts';

const results: SearchResult[] = [
  { title: 'One', url: 'https://one.example/', content: 'first', publishedDate: '2025-03-01T10:00:00' },
  { title: 'Two', url: 'https://two.example/', content: '' },
  {
    title: 'Three',
    url: 'https://three.example/',
    content: 'third',
    publishedDate: 'March 5, 2024 12:00 UTC',
  },
  { title: 'Four', url: 'https://four.example/', content: 'x', publishedDate: 'sometime' },
];

describe('webSearchCitations', () => {
  test('behavior: one citation per result in order; empty content and unknown dates omitted, dates as YYYY-MM-DD', () => {
    expect(webSearchCitations(results)).toEqual([
      { title: 'One', url: 'https://one.example/', content: 'first', date: '2025-03-01' },
      { title: 'Two', url: 'https://two.example/' },
      { title: 'Three', url: 'https://three.example/', content: 'third', date: '2024-03-05' },
      { title: 'Four', url: 'https://four.example/', content: 'x', date: 'sometime' },
    ]);
  });
});

describe('searchDocumentsToolCall', () => {
  test('behavior: a function call named service_web_search_documents whose arguments are the documents', () => {
    const call = searchDocumentsToolCall(results.slice(0, 2));
    expect(call).toMatchObject({
      id: 'web_search_call',
      type: 'function',
      function: { name: SEARCH_DOCUMENTS_TOOL },
    });
    expect(SEARCH_DOCUMENTS_TOOL).toBe('service_web_search_documents');
    expect(JSON.parse(call.function.arguments)).toEqual({
      documents: [
        { id: '1', title: 'One', url: 'https://one.example/', snippet: 'first', published_at: '2025-03-01' },
        { id: '2', title: 'Two', url: 'https://two.example/' },
      ],
    });
  });
});

describe('scrapeMessage', () => {
  /** A scraper that answers from a table, and records what it was asked. */
  function tableScraper(pages: Record<string, string | Error>) {
    const asked: string[] = [];
    const scraper: Scraper = {
      async scrape(url) {
        asked.push(url);
        const page = pages[url];
        if (page === undefined || page instanceof Error)
          return { url, ok: false, error: page?.message ?? 'HTTP 404' };
        return { url, ok: true, title: `Title of ${url}`, text: page };
      },
    };
    return { scraper, asked };
  }

  test('behavior: scrapes the URLs of the message (at most 5), in order, keeping failures', async () => {
    const { scraper, asked } = tableScraper({
      'https://a.example/': 'page a',
      'https://c.example/': 'page c',
    });
    const text = `compare https://a.example/ with https://b.example/ and https://c.example/, ${Array.from(
      { length: 5 },
      (_, i) => `https://more${i}.example/`,
    ).join(' ')}`;
    const scraped = await scrapeMessage(scraper, text);
    expect(asked).toEqual([
      'https://a.example/',
      'https://b.example/',
      'https://c.example/',
      'https://more0.example/',
      'https://more1.example/',
    ]);
    expect(scraped.map((r) => r.ok)).toEqual([true, false, true, false, false]);
    expect(scrapedPages(scraped).map((p) => p.url)).toEqual(['https://a.example/', 'https://c.example/']);
  });

  test('behavior: no URL, no scrape', async () => {
    const { scraper, asked } = tableScraper({});
    expect(await scrapeMessage(scraper, 'no links here')).toEqual([]);
    expect(asked).toEqual([]);
  });
});

describe('scrapeContext', () => {
  test('behavior: successful pages only, with title and URL, marked as data; long pages cut', () => {
    const text = scrapeContext(
      [
        { url: 'https://a.example/', ok: true, title: 'Page  A', text: 'alpha '.repeat(100) },
        { url: 'https://b.example/', ok: false, error: 'HTTP 500' },
        { url: 'https://c.example/', ok: true, text: 'gamma' },
      ],
      { maxPageChars: 50 },
    );
    expect(text).toContain('<page>\nPage A\nURL: https://a.example/\n\nalpha alpha');
    expect(text).toContain('[page text cut at 50 characters]');
    expect(text).toContain('<page>\nURL: https://c.example/\n\ngamma\n</page>');
    expect(text).not.toContain('b.example');
    expect(text).toMatch(/not instructions/);
  });

  test('behavior: nothing scraped, no message', () => {
    expect(scrapeContext([{ url: 'https://b.example/', ok: false, error: 'refused' }])).toBeUndefined();
    expect(scrapeContext([])).toBeUndefined();
  });
});
