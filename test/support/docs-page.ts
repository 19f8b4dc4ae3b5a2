/**
 * Checks the `/docs` page as a reader sees it, in a real browser: every operation of the contract is listed
 * (method and path), and an operation's documented response example is what the page renders (Swagger UI
 * falls back to a sample generated from the schema when the example is missing, so a dropped example shows
 * up as a different value). Returns the problems found; empty means the page is in step with the contract.
 */
import { isDeepStrictEqual } from 'node:util';
import type { Page } from 'playwright-core';
import { deref, listOperations, mediaExamples, type OpenApiDoc } from './contract.ts';

export type DocsCheckOptions = {
  /** The operation whose rendered response example is compared with the contract (default `listModels`). */
  exampleOperation?: string;
  /** Upper bound for the page to render, in ms (a hang fails instead of waiting for the test timeout). */
  renderTimeoutMs?: number;
};

export async function checkDocsPage(
  page: Page,
  docsUrl: string,
  doc: OpenApiDoc,
  options: DocsCheckOptions = {},
): Promise<string[]> {
  const timeout = options.renderTimeoutMs ?? 30_000;
  const problems: string[] = [];
  await page.goto(docsUrl);
  await page.waitForSelector('.opblock .opblock-summary-path', { timeout });

  const listed = new Set(
    await page.$$eval('.opblock', (blocks) =>
      blocks.map((block) => {
        const method = block.querySelector('.opblock-summary-method')?.textContent?.trim().toLowerCase();
        const path = block.querySelector('.opblock-summary-path')?.getAttribute('data-path');
        return `${method} ${path}`;
      }),
    ),
  );
  const operations = listOperations(doc);
  for (const op of operations) {
    if (!listed.has(`${op.method} ${op.path}`))
      problems.push(`${op.operationId} (${op.method.toUpperCase()} ${op.path}) is not listed`);
  }

  const target = operations.find((op) => op.operationId === (options.exampleOperation ?? 'listModels'));
  if (!target) return [...problems, `no operation ${options.exampleOperation} in the contract`];
  const [status, rawResponse] = Object.entries(target.responses).find(([code]) => code.startsWith('2')) ?? [];
  const media = (deref(doc, rawResponse).content as Record<string, Record<string, unknown>> | undefined)?.[
    'application/json'
  ];
  const expected = mediaExamples(doc, media)[0];
  if (!expected) return [...problems, `${target.operationId} ${status} documents no JSON example`];

  const block = page.locator('.opblock').filter({
    has: page.locator(`.opblock-summary-path[data-path="${target.path}"]`),
  });
  const opblock = block.filter({
    has: page.locator(`.opblock-summary-method:text-is("${target.method.toUpperCase()}")`),
  });
  if ((await opblock.count()) !== 1)
    return [...problems, `${target.operationId} has no single block to open`];
  await opblock.locator('.opblock-summary').first().click();
  const code = opblock.locator(`tr.response[data-code="${status}"] .highlight-code`).first();
  await code.waitFor({ timeout });
  const text = await code.innerText();
  let rendered: unknown;
  try {
    rendered = JSON.parse(text);
  } catch {
    return [
      ...problems,
      `${target.operationId} ${status}: the rendered example is not JSON: ${text.slice(0, 200)}`,
    ];
  }
  if (!isDeepStrictEqual(rendered, expected.value)) {
    problems.push(
      `${target.operationId} ${status}: the page renders ${text.replace(/\s+/g, ' ').slice(0, 120)}… instead of the example "${expected.name}"`,
    );
  }
  return problems;
}
