/**
 * The `/docs` page of the real server in headless Chromium (test/support/browser.ts): every operation of
 * `generated/openapi.yaml` is listed and a documented example renders, with every asset served by the server
 * itself (no CDN). Seeded faults (the page given a contract without an operation, or without the example)
 * show the check fails when the page drifts from the contract.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import { type StartedBrowser, startBrowser } from '../support/browser.ts';
import { loadBundle, type OpenApiDoc } from '../support/contract.ts';
import { checkDocsPage } from '../support/docs-page.ts';
import { type StartedServer, startServer } from '../support/server.ts';

const scratch = mkdtempSync(join(tmpdir(), 'docs-browser-'));
const doc = loadBundle();
let server: StartedServer;
let browser: StartedBrowser;

beforeAll(async () => {
  server = await startServer(`sqlite:${join(scratch, 'docs.db')}`, {}, { proxy: false });
  browser = await startBrowser();
});

afterAll(async () => {
  await browser?.close();
  await server?.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** A fresh browser context; `served` replaces the contract the page loads (a seeded fault). */
async function context(served?: OpenApiDoc): Promise<BrowserContext> {
  const ctx = await browser.browser.newContext();
  if (served) {
    await ctx.route(`${server.origin}/openapi.yaml`, (route) =>
      route.fulfill({ status: 200, contentType: 'application/yaml', body: stringify(served) }),
    );
  }
  return ctx;
}

function copy(): OpenApiDoc {
  return structuredClone(doc);
}

describe('/docs in a real browser', { timeout: 120_000 }, () => {
  test('behavior: lists every operation and renders the documented example, from local assets only', async () => {
    const ctx = await context();
    try {
      const page = await ctx.newPage();
      const elsewhere: string[] = [];
      page.on('request', (request) => {
        if (!request.url().startsWith(`${server.origin}/`)) elsewhere.push(request.url());
      });
      expect(await checkDocsPage(page, `${server.origin}/docs`, doc)).toEqual([]);
      expect(elsewhere).toEqual([]);
    } finally {
      await ctx.close();
    }
  });

  test('fault: a docs page missing an operation fails the check', async () => {
    const served = copy();
    delete (served.paths['/image/styles'] as Record<string, unknown>).get;
    const ctx = await context(served);
    try {
      const problems = await checkDocsPage(await ctx.newPage(), `${server.origin}/docs`, doc);
      expect(problems).toEqual(['listImageStyles (GET /image/styles) is not listed']);
    } finally {
      await ctx.close();
    }
  });

  test('fault: a contract whose example was dropped renders something else, and the check fails', async () => {
    const served = copy();
    const listModels = (served.paths['/models'] as Record<string, Record<string, unknown>>).get as {
      responses: Record<string, { content: Record<string, Record<string, unknown>> }>;
    };
    const media = listModels.responses['200']?.content['application/json'];
    expect(media?.examples).toBeDefined();
    delete media?.examples;
    const ctx = await context(served);
    try {
      const problems = await checkDocsPage(await ctx.newPage(), `${server.origin}/docs`, doc);
      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^listModels 200: the page renders .* instead of the example/);
    } finally {
      await ctx.close();
    }
  });
});
