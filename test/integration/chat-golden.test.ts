/**
 * Chat answers on the wire, pinned: non-streamed bodies and streamed SSE text, byte for byte (only the
 * request id and `created` are normalised), with the status, content type and `x-service-model-*` headers,
 * for requests across models (plain, reasoning in a field, reasoning in `<think>` tags), sampling options,
 * bounds, `n`, stop sequences, log probabilities, tools, JSON mode and the thinking options, each streamed and
 * not, run in order on one server. The usage and cost in every answer are part of the bytes, so billing is
 * pinned too. Compared with `fixtures/chat-golden.json`, written by the code before the chat domain's
 * performance work (a stream is kept as its hash, frame count and usage frame);
 * `GOLDEN_UPDATE=1` rewrites it (only when an output change is intended).
 */
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

const FIXTURE = new URL('./fixtures/chat-golden.json', import.meta.url);

let server: ChatServer;
beforeAll(async () => {
  server = await startChatServer();
});
afterAll(async () => {
  await server?.close();
});

const USER = [{ role: 'user', content: 'Tell me about rivers and mountains.' }];
const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' } },
        required: ['city', 'days'],
      },
    },
  },
];

const BODIES: Record<string, Record<string, unknown>> = {
  plain: { model: 'llama-3.3-70b', messages: USER, seed: 7 },
  bounded: { model: 'llama-3.3-70b', messages: USER, seed: 7, max_tokens: 16 },
  n2: { model: 'llama-3.3-70b', messages: USER, seed: 3, n: 2, max_completion_tokens: 30 },
  stop: { model: 'llama-3.3-70b', messages: USER, seed: 7, stop: ['ing', '.'] },
  sampling: {
    model: 'llama-3.3-70b',
    messages: USER,
    seed: 11,
    temperature: 1.2,
    top_p: 0.9,
    top_k: 5,
    frequency_penalty: 0.5,
  },
  greedy: { model: 'llama-3.3-70b', messages: USER, temperature: 0, max_tokens: 24 },
  logprobs: {
    model: 'llama-3.3-70b',
    messages: USER,
    seed: 5,
    logprobs: true,
    top_logprobs: 2,
    max_tokens: 12,
  },
  tools: {
    model: 'llama-3.3-70b',
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    seed: 9,
    tools: TOOLS,
  },
  toolResult: {
    model: 'llama-3.3-70b',
    seed: 9,
    tools: TOOLS,
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          {
            id: 'call_1',
            type: 'function',
            function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
          },
        ],
      },
      { role: 'tool', content: '{"temperature": 18}', tool_call_id: 'call_1' },
    ],
  },
  json: { model: 'llama-3.3-70b', messages: USER, seed: 4, response_format: { type: 'json_object' } },
  multiturn: {
    model: 'llama-3.3-70b',
    seed: 2,
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Write 50 words about design.' },
      { role: 'assistant', content: 'Design offers clarity.' },
      { role: 'user', content: 'Write 70 words about engineering tools.' },
    ],
  },
  noServicePrompt: {
    model: 'llama-3.3-70b',
    messages: USER,
    seed: 8,
    service_parameters: { include_service_system_prompt: false },
  },
  reasoningField: { model: 'qwen3-235b', messages: USER, seed: 6, reasoning_effort: 'low' },
  reasoningOff: {
    model: 'qwen3-235b',
    messages: USER,
    seed: 6,
    service_parameters: { disable_thinking: true },
  },
  tags: { model: 'deepseek-r1-671b', messages: USER, seed: 10, max_tokens: 120 },
  tagsStripped: {
    model: 'deepseek-r1-671b',
    messages: USER,
    seed: 10,
    service_parameters: { strip_thinking_response: true },
  },
};

/** A JSON answer is kept whole; a stream as its SHA-256, its frame count and its last data frame (usage, cost). */
type Recorded = {
  name: string;
  status: number;
  headers: Record<string, string | null>;
  body?: string;
  sha256?: string;
  frames?: number;
  last?: string;
};

function normalise(text: string): string {
  return text.replace(/"id":"chatcmpl-[^"]+"/g, '"id":"chatcmpl-X"').replace(/"created":\d+/g, '"created":0');
}

async function recordAll(): Promise<Recorded[]> {
  const { key } = await server.account('1000');
  const out: Recorded[] = [];
  for (const [name, body] of Object.entries(BODIES))
    for (const stream of [false, true]) {
      const response = await fetch(`${server.base}/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, stream }),
      });
      const headers: Record<string, string | null> = {};
      for (const h of [
        'content-type',
        'x-service-model-id',
        'x-service-model-name',
        'x-service-model-router',
      ])
        headers[h] = response.headers.get(h);
      const text = normalise(await response.text());
      const frames = text.split('\n\n').filter(Boolean);
      out.push({
        name: `${name}/${stream ? 'stream' : 'json'}`,
        status: response.status,
        headers,
        ...(stream
          ? {
              sha256: createHash('sha256').update(text).digest('hex'),
              frames: frames.length,
              last: frames[frames.length - 2] ?? '',
            }
          : { body: text }),
      });
    }
  return out;
}

describe('chat answers on the wire', () => {
  test('every request gives exactly the recorded status, headers and bytes', async () => {
    const actual = await recordAll();
    expect(actual.length).toBe(Object.keys(BODIES).length * 2);
    if (process.env.GOLDEN_UPDATE === '1') writeFileSync(FIXTURE, `${JSON.stringify(actual, null, 2)}\n`);
    const expected = JSON.parse(readFileSync(FIXTURE, 'utf8')) as Recorded[];
    expect(actual.map((r) => r.name)).toEqual(expected.map((r) => r.name));
    for (const [i, r] of actual.entries()) expect(r, r.name).toEqual(expected[i]);
  });
});
