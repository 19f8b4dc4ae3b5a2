import { describe, expect, test } from 'vitest';
import { ConfigError, loadConfig } from '../../server/config.ts';

describe('loadConfig: web search and scraping', () => {
  test('behavior: defaults: no search engine, private networks refused, caps set', () => {
    const config = loadConfig({});
    expect(config.search).toEqual({ searxngUrl: undefined, timeoutMs: 10_000 });
    expect(config.scrape).toEqual({
      allowPrivateNetworks: false,
      maxBytes: 2_000_000,
      timeoutMs: 10_000,
      maxRedirects: 5,
    });
  });

  test('behavior: every variable is read', () => {
    const config = loadConfig({
      SEARXNG_URL: 'http://127.0.0.1:8888',
      SEARCH_TIMEOUT_MS: '2500',
      SCRAPE_ALLOW_PRIVATE_NETWORKS: 'true',
      SCRAPE_MAX_BYTES: '65536',
      SCRAPE_TIMEOUT_MS: '3000',
      SCRAPE_MAX_REDIRECTS: '0',
    });
    expect(config.search).toEqual({ searxngUrl: 'http://127.0.0.1:8888', timeoutMs: 2_500 });
    expect(config.scrape).toEqual({
      allowPrivateNetworks: true,
      maxBytes: 65_536,
      timeoutMs: 3_000,
      maxRedirects: 0,
    });
  });

  test('behavior: bad values are listed', () => {
    let error: unknown;
    try {
      loadConfig({
        SEARXNG_URL: 'ftp://search.example',
        SCRAPE_ALLOW_PRIVATE_NETWORKS: 'maybe',
        SCRAPE_MAX_BYTES: '10',
        SCRAPE_MAX_REDIRECTS: '-1',
      });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems.join('\n');
    for (const name of [
      'SEARXNG_URL',
      'SCRAPE_ALLOW_PRIVATE_NETWORKS',
      'SCRAPE_MAX_BYTES',
      'SCRAPE_MAX_REDIRECTS',
    ]) {
      expect(problems).toContain(name);
    }
  });
});
