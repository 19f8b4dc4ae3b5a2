/**
 * Web search, scraping and file parts wired into chat completions, against loopback servers: a SearXNG-shaped
 * search engine and a small web site. Each option has a test that would fail if it did nothing.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import type { ChatCompletion, ChatCompletionChunk } from '../../generated/api.d.ts';
import { buildDocx } from '../fixtures/files/build.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { ContractValidator, loadBundle } from '../support/contract.ts';

const validator = new ContractValidator(loadBundle());
const eventSchema = validator.schema('ChatCompletionStreamEvent');

let engine: Server;
let site: Server;
let searches: string[] = [];
let siteBase = '';
let server: ChatServer;
let key = '';
let accountId = '';

const RESULTS = [
  {
    title: 'Burj Khalifa - Wikipedia',
    url: 'https://en.wikipedia.org/wiki/Burj_Khalifa',
    content: 'The Burj Khalifa is 828 m tall.',
    publishedDate: '2026-10-02',
  },
  { title: 'Facts & Figures', url: 'https://www.burjkhalifa.ae/en/facts/', content: 'Height: 828 metres.' },
];

async function listen(s: Server): Promise<string> {
  s.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => s.once('listening', () => resolve()));
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

beforeAll(async () => {
  engine = createServer((req, res) => {
    const query = new URL(req.url ?? '/', 'http://x').searchParams.get('q') ?? '';
    searches.push(query);
    if (query.includes('failing')) {
      res.writeHead(500).end('down');
      return;
    }
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ query, results: RESULTS }));
  });
  const engineBase = await listen(engine);
  site = createServer((req, res) => {
    if (req.url === '/article') {
      res
        .writeHead(200, { 'content-type': 'text/html' })
        .end(
          `<html><head><title>Glaciers</title></head><body><p>${'Glaciers move slowly across valleys. '.repeat(30)}</p></body></html>`,
        );
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' }).end('missing');
  });
  siteBase = await listen(site);
  server = await startChatServer({ env: { SEARXNG_URL: engineBase, SCRAPE_ALLOW_PRIVATE_NETWORKS: 'true' } });
  ({ key, accountId } = await server.account('10'));
});

afterAll(async () => {
  await server?.close();
  for (const s of [engine, site]) {
    s?.closeAllConnections();
    await new Promise<void>((resolve) => (s ? s.close(() => resolve()) : resolve()));
  }
});

const ASK = [{ role: 'user', content: 'How tall is the Burj Khalifa?' }];

async function chat(body: Record<string, unknown>) {
  const response = await fetch(`${server.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'llama-3.3-70b', messages: ASK, seed: 5, ...body }),
  });
  return { response, json: (await response.json()) as ChatCompletion & { error?: string } };
}

async function stream(body: Record<string, unknown>) {
  const response = await fetch(`${server.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'llama-3.3-70b', messages: ASK, seed: 5, stream: true, ...body }),
  });
  const chunks: ChatCompletionChunk[] = [];
  for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>)) {
    if (event.data === '[DONE]') continue;
    const json = JSON.parse(event.data) as ChatCompletionChunk;
    expect(validator.validate(eventSchema, json)).toEqual([]);
    chunks.push(json);
  }
  return chunks;
}

const text = (a: ChatCompletion) =>
  (a.choices?.[0]?.message as { content?: string } | undefined)?.content ?? '';
/** The skus charged for a request, once the captures the answers did not wait for are in. */
async function skus(requestId: string | null) {
  await server.services.charges.idle();
  return (await server.services.ledger.listEntries(accountId, { limit: 1000 }))
    .filter((e) => e.type === 'CHARGE' && e.requestId === requestId)
    .map((e) => e.sku);
}

describe('web search', () => {
  test('behavior: on searches, gives the model the sources, echoes them and charges the search; off does not', async () => {
    searches = [];
    const off = await chat({});
    expect(searches).toEqual([]);
    expect(off.json.service_parameters?.web_search_citations).toBeUndefined();
    const on = await chat({ service_parameters: { enable_web_search: 'on' } });
    expect(searches).toEqual(['How tall is the Burj Khalifa?']);
    expect(on.json.service_parameters?.web_search_citations).toEqual([
      { title: RESULTS[0]?.title, url: RESULTS[0]?.url, content: RESULTS[0]?.content, date: '2026-10-02' },
      { title: RESULTS[1]?.title, url: RESULTS[1]?.url, content: RESULTS[1]?.content },
    ]);
    expect(on.json.usage.prompt_tokens).toBeGreaterThan(off.json.usage.prompt_tokens + 50);
    expect(await skus(on.response.headers.get('cf-ray'))).toContain('chat.web_search');
    expect(await skus(off.response.headers.get('cf-ray'))).not.toContain('chat.web_search');
  });

  test('behavior: auto searches for a question, not for an instruction', async () => {
    searches = [];
    await chat({ service_parameters: { enable_web_search: 'auto' } });
    expect(searches.length).toBe(1);
    await chat({
      messages: [{ role: 'user', content: 'Write a poem about rain.' }],
      model: 'llama-3.3-70b:enable_web_search=auto',
    });
    expect(searches.length).toBe(1);
  });

  test('behavior: enable_web_citations rewrites bracket citations to ^1^ and ^1,2^', async () => {
    const plain = await chat({ service_parameters: { enable_web_search: 'on' } });
    expect(text(plain.json)).toContain(' [1].');
    const cited = await chat({ service_parameters: { enable_web_search: 'on', enable_web_citations: true } });
    expect(text(cited.json)).toContain(' ^1^.');
    expect(text(cited.json)).toContain(' ^1,2^.');
    expect(text(cited.json)).not.toMatch(/\[\d\]/);
    // The stream is rewritten the same way.
    const chunks = await stream({
      service_parameters: { enable_web_search: 'on', enable_web_citations: true },
    });
    const streamed = chunks.flatMap((c) => c.choices.map((x) => x.delta.content ?? '')).join('');
    expect(streamed).toBe(text(cited.json));
  });

  test('behavior: include_search_results_in_stream sends the sources as the first chunk', async () => {
    const without = await stream({ service_parameters: { enable_web_search: 'on' } });
    expect(without[0]?.choices.length).toBe(1);
    const chunks = await stream({
      service_parameters: { enable_web_search: 'on', include_search_results_in_stream: true },
    });
    expect(chunks[0]?.choices).toEqual([]);
    expect(chunks[0]?.service_parameters?.web_search_citations?.map((c) => c.url)).toEqual(
      RESULTS.map((r) => r.url),
    );
  });

  test('behavior: return_search_results_as_documents adds the service_web_search_documents tool call', async () => {
    const plain = await chat({ service_parameters: { enable_web_search: 'on' } });
    expect(plain.json.choices?.[0]?.message).toMatchObject({ tool_calls: null });
    const { json } = await chat({
      service_parameters: { enable_web_search: 'on', return_search_results_as_documents: true },
    });
    const call = (
      json.choices?.[0]?.message as
        | { tool_calls: { function: { name: string; arguments: string } }[] }
        | undefined
    )?.tool_calls[0];
    expect(call?.function.name).toBe('service_web_search_documents');
    expect(JSON.parse(call?.function.arguments ?? '{}').documents.map((d: { url: string }) => d.url)).toEqual(
      RESULTS.map((r) => r.url),
    );
    const chunks = await stream({
      service_parameters: { enable_web_search: 'on', return_search_results_as_documents: true },
    });
    const names = chunks.flatMap((c) =>
      c.choices.flatMap((x) => x.delta.tool_calls ?? []).map((t) => t.function?.name),
    );
    expect(names).toContain('service_web_search_documents');
  });

  test('behavior: a failed search degrades to an answer without sources and is not charged', async () => {
    const { response, json } = await chat({
      messages: [{ role: 'user', content: 'Is the failing engine up?' }],
      service_parameters: { enable_web_search: 'on' },
    });
    expect(response.status).toBe(200);
    expect(json.service_parameters?.web_search_citations).toEqual([]);
    expect(await skus(response.headers.get('cf-ray'))).not.toContain('chat.web_search');
  });
});

describe('web scraping', () => {
  test('behavior: URLs of the message are scraped, bypassing search; only successful pages are charged', async () => {
    searches = [];
    const messages = [
      { role: 'user', content: `Summarise ${siteBase}/article and ${siteBase}/missing please.` },
    ];
    const plain = await chat({ messages });
    const scraped = await chat({
      messages,
      service_parameters: { enable_web_scraping: true, enable_web_search: 'on' },
    });
    expect(scraped.response.status).toBe(200);
    expect(searches).toEqual([]);
    expect(scraped.json.service_parameters?.enable_web_scraping).toBe(true);
    expect(scraped.json.usage.prompt_tokens).toBeGreaterThan(plain.json.usage.prompt_tokens + 100);
    await server.services.charges.idle();
    const entries = (await server.services.ledger.listEntries(accountId, { limit: 1000 })).filter(
      (e) => e.requestId === scraped.response.headers.get('cf-ray') && e.sku === 'chat.web_scraping',
    );
    expect(entries.map((e) => e.units)).toEqual(['1']);
  });
});

describe('file parts', () => {
  test('behavior: TXT and DOCX files are converted to text for the model; an unreadable file is a 400', async () => {
    const txt = `data:text/plain;base64,${Buffer.from('Quarterly revenue rose twelve percent. '.repeat(20)).toString('base64')}`;
    const without = await chat({
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Summarise the file.' }] }],
    });
    const withTxt = await chat({
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Summarise the file.' },
            { type: 'file', file: { file_data: txt, filename: 'notes.txt' } },
          ],
        },
      ],
    });
    expect(withTxt.response.status).toBe(200);
    expect(withTxt.json.usage.prompt_tokens).toBeGreaterThan(without.json.usage.prompt_tokens + 100);
    const docx = Buffer.from(buildDocx(['Glaciers carve valleys.', 'Rivers follow them.'])).toString(
      'base64',
    );
    const withDocx = await chat({
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Summarise.' },
            { type: 'file', file: { file_data: docx, filename: 'report.docx' } },
          ],
        },
      ],
    });
    expect(withDocx.response.status).toBe(200);
    expect(withDocx.json.usage.prompt_tokens).toBeGreaterThan(without.json.usage.prompt_tokens + 8);
    const bad = await chat({
      messages: [
        {
          role: 'user',
          content: [
            { type: 'file', file: { file_data: 'data:application/pdf;base64,AAAA', filename: 'x.pdf' } },
          ],
        },
      ],
    });
    expect(bad.response.status).toBe(400);
    expect(bad.json.error).toContain('Cannot read the attached file');
  });
});
