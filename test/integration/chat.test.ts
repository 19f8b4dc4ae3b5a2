/**
 * Chat completions end to end on the embedded local engine: the official `openai` SDK against the server,
 * streaming semantics, exact billing, and the request options of the interface, each with a test that would
 * fail if the option did nothing. Response validation is on, so every JSON body was checked against the
 * contract; every stream chunk is checked here against `ChatCompletionStreamEvent`.
 */
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import type { ChatCompletion, ChatCompletionChunk } from '../../generated/api.d.ts';
import { formatNanoUsd, parseUsdToNano } from '../../server/money.ts';
import { type ChatServer, postWatchingWrites, startChatServer } from '../support/chat-server.ts';
import { ContractValidator, loadBundle } from '../support/contract.ts';
import { startPostgres } from '../support/postgres.ts';

const validator = new ContractValidator(loadBundle());
const eventSchema = validator.schema('ChatCompletionStreamEvent');

let server: ChatServer;
beforeAll(async () => {
  server = await startChatServer();
});
afterAll(async () => {
  await server?.close();
});

const USER = [{ role: 'user' as const, content: 'Tell me about rivers and mountains.' }];

async function post(key: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(`${server.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
}

async function complete(key: string, body: Record<string, unknown>) {
  const response = await post(key, { model: 'llama-3.3-70b', messages: USER, ...body });
  const json = (await response.json()) as ChatCompletion & { error?: string };
  return { response, json };
}

/** Reads a whole stream, validating every event against the contract. */
async function streamed(key: string, body: Record<string, unknown>) {
  const response = await post(key, { model: 'llama-3.3-70b', messages: USER, stream: true, ...body });
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const chunks: ChatCompletionChunk[] = [];
  const raw: string[] = [];
  for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>)) {
    raw.push(event.data);
    if (event.data === '[DONE]') continue;
    const parsed = JSON.parse(event.data) as ChatCompletionChunk;
    expect(validator.validate(eventSchema, parsed)).toEqual([]);
    chunks.push(parsed);
  }
  const text = (index = 0) =>
    chunks
      .flatMap((c) => c.choices.filter((x) => x.index === index).map((x) => x.delta.content ?? ''))
      .join('');
  return { response, chunks, raw, text };
}

const usdToNano = (usd: number) => parseUsdToNano(usd.toFixed(9).replace(/\.?0+$/, '') || '0');

/** The account's CHARGE entries, once the captures the answers did not wait for are in. */
async function charges(accountId: string) {
  await server.services.charges.idle();
  const entries = await server.services.ledger.listEntries(accountId, { limit: 1000 });
  return entries.filter((e) => e.type === 'CHARGE');
}

describe('the openai SDK against the server', () => {
  test('behavior: non-streamed and streamed completions, tools, n > 1', async () => {
    const { key } = await server.account('5');
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'llama-3.3-70b', messages: USER, seed: 7 });
    expect(answer.object).toBe('chat.completion');
    expect(answer.choices[0]?.message.content).toMatch(/^\[local engine\] /);
    expect(answer.usage?.prompt_tokens).toBeGreaterThan(0);

    const stream = await client.chat.completions.create({
      model: 'llama-3.3-70b',
      messages: USER,
      seed: 7,
      stream: true,
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(answer.choices[0]?.message.content);
    expect(usage).toEqual(answer.usage);

    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: 'function',
        function: {
          name: 'get_weather',
          parameters: {
            type: 'object',
            properties: {
              location: { type: 'string' },
              unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
            },
            required: ['location', 'unit'],
          },
        },
      },
    ];
    const call = await client.chat.completions.create({
      model: 'llama-3.3-70b',
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools,
    });
    const choice = call.choices[0];
    expect(choice?.finish_reason).toBe('tool_calls');
    const toolCall = choice?.message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(toolCall.function.name).toBe('get_weather');
    expect(JSON.parse(toolCall.function.arguments)).toMatchObject({
      unit: 'celsius',
      location: expect.any(String),
    });
    // The tool's answer goes back; the model answers in text.
    const after = await client.chat.completions.create({
      model: 'llama-3.3-70b',
      messages: [
        { role: 'user', content: 'What is the weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [toolCall] },
        { role: 'tool', tool_call_id: toolCall.id, content: '{"temperature": 21}' },
      ],
      tools,
    });
    expect(after.choices[0]?.finish_reason).toBe('stop');
    expect(after.choices[0]?.message.content).toContain('tool result');

    // Streamed tool calls rebuild into the same call.
    const toolStream = await client.chat.completions.create({
      model: 'llama-3.3-70b',
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools,
      stream: true,
    });
    let args = '';
    let name = '';
    let finish: string | null = null;
    for await (const chunk of toolStream) {
      for (const c of chunk.choices) {
        for (const t of c.delta.tool_calls ?? []) {
          name += t.function?.name ?? '';
          args += t.function?.arguments ?? '';
        }
        finish = c.finish_reason ?? finish;
      }
    }
    expect(name).toBe('get_weather');
    expect(JSON.parse(args)).toMatchObject({ unit: 'celsius' });
    expect(finish).toBe('tool_calls');

    const many = await client.chat.completions.create({
      model: 'llama-3.3-70b',
      messages: USER,
      n: 3,
      seed: 1,
    });
    expect(many.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(new Set(many.choices.map((c) => c.message.content)).size).toBe(3);
  });

  test('behavior: errors reach the SDK with the right classes', async () => {
    const { key } = await server.account('5');
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    await expect(
      client.chat.completions.create({ model: 'no-such-model', messages: USER }),
    ).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(
      client.chat.completions.create({ model: 'qwen3-235b', messages: USER, logprobs: true }),
    ).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    const stranger = new OpenAI({ apiKey: 'svc_inference_not_a_key', baseURL: server.base, maxRetries: 0 });
    await expect(
      stranger.chat.completions.create({ model: 'llama-3.3-70b', messages: USER }),
    ).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
    const { key: broke } = await server.account('0');
    const poor = new OpenAI({ apiKey: broke, baseURL: server.base, maxRetries: 0 });
    const error = await poor.chat.completions
      .create({ model: 'llama-3.3-70b', messages: USER })
      .catch((e) => e);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect((error as InstanceType<typeof OpenAI.APIError>).status).toBe(402);
    const pro = await client.chat.completions
      .create({ model: 'qwen3-coder-480b', messages: USER })
      .catch((e) => e);
    expect(pro).toBeInstanceOf(OpenAI.AuthenticationError);
    expect(String((pro as Error).message)).toContain('This model is only available to Pro users');
  });
});

describe('streaming', () => {
  test('behavior: chunks validate; the final chunk has choices [] with usage and cost, then [DONE]; usage equals the non-streamed usage', async () => {
    const { key } = await server.account('5');
    const { json } = await complete(key, { seed: 11, n: 2 });
    const { chunks, raw, text } = await streamed(key, { seed: 11, n: 2 });
    expect(raw.at(-1)).toBe('[DONE]');
    const last = chunks.at(-1) as ChatCompletionChunk;
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual(json.usage);
    expect(last.cost?.usd).toBeGreaterThan(0);
    expect(text(0)).toBe(json.choices?.[0]?.message.content);
    expect(text(1)).toBe(json.choices?.[1]?.message.content);
    // Every chunk of the stream shares id, created and model; usage appears only on the last one.
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(chunks.slice(0, -1).every((c) => c.usage === undefined)).toBe(true);
    const first = chunks.find((c) => c.choices[0]?.index === 0);
    expect(first?.choices[0]?.delta.role).toBe('assistant');
  });
});

describe('socket writes', () => {
  test("behavior: a stream's headers leave in the same socket write as its first frames", async () => {
    const { key } = await server.account('1');
    const { text, writes } = await postWatchingWrites(server, key, '/chat/completions', {
      model: 'llama-3.3-70b',
      messages: USER,
      stream: true,
      max_tokens: 8,
    });
    expect(text).toContain('data: [DONE]');
    expect(writes[0]).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(writes[0]).toContain('data: {');
  });
});

describe('billing', () => {
  test('behavior: the cost is captured as CHARGE entries with the request id and model id; the rest is released', async () => {
    const { key, accountId } = await server.account('2');
    const { response, json } = await complete(key, { seed: 3 });
    expect(response.status).toBe(200);
    const entries = await charges(accountId);
    expect(entries.length).toBeGreaterThan(0);
    expect(new Set(entries.map((e) => e.requestId))).toEqual(new Set([response.headers.get('cf-ray')]));
    expect(new Set(entries.map((e) => e.modelId))).toEqual(new Set(['llama-3.3-70b']));
    const charged = -entries.reduce((sum, e) => sum + e.amountNano, 0n);
    expect(formatNanoUsd(charged)).toBe(String(json.cost?.usd));
    // Prompt at 0.7 and output at 2.8 USD per million tokens: 700 and 2800 nano-USD per token.
    const usage = json.usage;
    const expected = BigInt(usage.prompt_tokens) * 700n + BigInt(usage.completion_tokens) * 2800n;
    expect(charged).toBe(expected);
    const balance = await server.services.ledger.getBalance(accountId);
    expect(balance.usdNano).toBe(parseUsdToNano('2') - charged);
    expect(balance.usdReservedNano).toBe(0n);
  });

  test('behavior: 50 parallel requests on a balance that covers 10 never overspend; the ledger equals the sum of the costs', {
    timeout: 60_000,
  }, async () => {
    // One request reserves at most prompt + 200 output tokens at 2.8 USD/M: about 0.00063 USD.
    const { key, accountId } = await server.account('0.0063');
    const results = await Promise.all(
      Array.from({ length: 50 }, (_, i) => complete(key, { seed: i + 1, max_completion_tokens: 200 })),
    );
    const ok = results.filter((r) => r.response.status === 200);
    // Refusals are 402 (balance) or 503 (more than the model's 32 concurrent requests in flight).
    const refused = results.filter((r) => r.response.status === 402 || r.response.status === 503);
    expect(ok.length + refused.length).toBe(50);
    expect(ok.length).toBeGreaterThanOrEqual(10);
    expect(refused.length).toBeGreaterThan(0);
    // The last answers may have been written while their captures commit: read the ledger once they are done.
    await server.services.charges.idle();
    const balance = await server.services.ledger.getBalance(accountId);
    expect(balance.usdNano).toBeGreaterThanOrEqual(0n);
    expect(balance.usdReservedNano).toBe(0n);
    const costs = ok.reduce((sum, r) => sum + usdToNano(r.json.cost?.usd ?? 0), 0n);
    const charged = -(await charges(accountId)).reduce((sum, e) => sum + e.amountNano, 0n);
    expect(charged).toBe(costs);
    expect(balance.usdNano).toBe(parseUsdToNano('0.0063') - charged);
  });
});

describe('idempotency', () => {
  test('behavior: the same key and body replay the stored answer without a new charge; another body is 400', async () => {
    const { key, accountId } = await server.account('2');
    const body = { model: 'llama-3.3-70b', messages: USER, seed: 4 };
    const first = await post(key, body, { 'idempotency-key': 'chat-retry-1' });
    const firstJson = (await first.json()) as ChatCompletion;
    expect(first.status).toBe(200);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    const again = await post(key, body, { 'idempotency-key': 'chat-retry-1' });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.json()).toEqual(firstJson);
    expect(new Set((await charges(accountId)).map((e) => e.requestId))).toEqual(
      new Set([first.headers.get('cf-ray')]),
    );
    const other = await post(key, { ...body, seed: 5 }, { 'idempotency-key': 'chat-retry-1' });
    expect(other.status).toBe(400);
    expect(((await other.json()) as { error: string }).error).toContain('Idempotency-Key');
    // Another key of the same body runs again (and is charged again).
    const fresh = await post(key, body, { 'idempotency-key': 'chat-retry-2' });
    expect(fresh.headers.get('idempotent-replayed')).toBeNull();
    expect(new Set((await charges(accountId)).map((e) => e.requestId)).size).toBe(2);
    // Streams ignore the key.
    const streamedAnswer = await post(key, { ...body, stream: true }, { 'idempotency-key': 'chat-retry-1' });
    expect(streamedAnswer.headers.get('content-type')).toMatch(/^text\/event-stream/);
    await streamedAnswer.text();
  });
});

describe('billing on PostgreSQL', () => {
  test('behavior: 50 parallel requests on a balance that covers 10 never overspend; the ledger equals the sum of the costs', {
    timeout: 180_000,
  }, async () => {
    const postgres = await startPostgres();
    const pg = await startChatServer({ databaseUrl: await postgres.createDatabase('chat_parallel') }).catch(
      async (error: unknown) => {
        await postgres.stop();
        throw error;
      },
    );
    try {
      const { key, accountId } = await pg.account('0.0063');
      const results = await Promise.all(
        Array.from({ length: 50 }, async (_, i) => {
          const response = await fetch(`${pg.base}/chat/completions`, {
            method: 'POST',
            headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
            body: JSON.stringify({
              model: 'llama-3.3-70b',
              messages: USER,
              seed: i + 1,
              max_completion_tokens: 200,
            }),
          });
          return { status: response.status, json: (await response.json()) as ChatCompletion };
        }),
      );
      const ok = results.filter((r) => r.status === 200);
      // Refusals are 402 (balance) or 503 (more than the model's 32 concurrent requests in flight).
      const odd = results.filter((r) => ![200, 402, 503].includes(r.status));
      expect(odd.map((r) => [r.status, JSON.stringify(r.json)])).toEqual([]);
      expect(ok.length).toBeGreaterThanOrEqual(10);
      // The last answers may have been written while their captures commit: read the ledger once they are done.
      await pg.services.charges.idle();
      const balance = await pg.services.ledger.getBalance(accountId);
      expect(balance.usdNano).toBeGreaterThanOrEqual(0n);
      expect(balance.usdReservedNano).toBe(0n);
      const entries = (await pg.services.ledger.listEntries(accountId, { limit: 1000 })).filter(
        (e) => e.type === 'CHARGE',
      );
      const charged = -entries.reduce((sum, e) => sum + e.amountNano, 0n);
      expect(charged).toBe(ok.reduce((sum, r) => sum + usdToNano(r.json.cost?.usd ?? 0), 0n));
      expect(balance.usdNano).toBe(parseUsdToNano('0.0063') - charged);
    } finally {
      await pg.close();
      await postgres.stop();
    }
  });
});
