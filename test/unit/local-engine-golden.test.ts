/**
 * The local engine's outputs, pinned: 360 requests (prompts, max_tokens, seeds, temperatures, n, stop
 * sequences, tools, log probabilities, reasoning, cached prefixes) run in order on one engine (so the prompt
 * cache's reads and writes are part of the record), each reduced to the SHA-256 of its whole event list plus
 * its usage and finish reasons, compared with `fixtures/local-engine-golden.json`. Performance work on the
 * engine or the tokenizer must leave every event identical. The fixture was written by the code before that
 * work; `GOLDEN_UPDATE=1 npx vitest run --project unit test/unit/local-engine-golden.test.ts` rewrites it
 * (only when an output change is intended).
 */
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { describe, expect, test } from 'vitest';
import { createLocalChatEngine } from '../../server/providers/chat/local.ts';
import type {
  ChatEvent,
  ChatProviderRequest,
  ProviderMessage,
  ProviderTool,
} from '../../server/providers/chat/types.ts';

const FIXTURE = new URL('./fixtures/local-engine-golden.json', import.meta.url);

const SYSTEM = 'You are a helpful assistant. Answer accurately and concisely.';

const PROMPTS: Record<string, ProviderMessage[]> = {
  hello: [{ role: 'user', content: 'Say hello to the benchmark.' }],
  rivers: [
    { role: 'system', content: SYSTEM },
    { role: 'user', content: 'Tell me about rivers and mountains.' },
  ],
  words: [{ role: 'user', content: 'Write 120 words about the history of engineering and design.' }],
  unicode: [{ role: 'user', content: 'Résumé: naïve café — 東京 and emoji 🎉🚀 please explain, ünïcödé.' }],
  multiturn: [
    { role: 'system', content: SYSTEM },
    { role: 'user', content: 'What is a careful approach to testing ideas?' },
    { role: 'assistant', content: 'Measure results early and adjust plans.' },
    { role: 'user', content: 'Give examples about measuring results.', name: 'alice' },
  ],
  parts: [
    {
      role: 'system',
      content: [
        {
          type: 'text',
          text: `${SYSTEM} Long policy text. `.repeat(8),
          cache_control: { type: 'ephemeral' },
        },
      ],
    },
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Compare options about science and numbers.' },
        { type: 'image_url', image_url: { url: 'https://example.com/a.png' } },
      ],
    },
  ],
  sources: [
    {
      role: 'system',
      content: '<sources>\n[1] Rivers of the world\n[2] Mountain ranges\n[3] Lakes\n</sources>\nCite them.',
    },
    { role: 'user', content: 'What are the longest rivers?' },
  ],
  toolResult: [
    { role: 'user', content: 'What is the weather in Paris?' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
      ],
    },
    { role: 'tool', content: '{"temperature": 18, "sky": "clear"}', tool_call_id: 'call_1' },
  ],
  empty: [{ role: 'user', content: '' }],
};

const TOOLS: ProviderTool[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string' },
          days: { type: 'integer' },
          units: { type: 'string', enum: ['c', 'f'] },
          detail: { type: 'object', properties: { hourly: { type: 'boolean' }, score: { type: 'number' } } },
          tags: { type: 'array', items: { type: 'string' } },
        },
        required: ['city', 'days', 'units', 'detail', 'tags'],
      },
    },
  },
  { type: 'function', function: { name: 'lookup_price', parameters: { type: 'object', properties: {} } } },
];

type Variant = { name: string; request: Partial<ChatProviderRequest> };

const VARIANTS: Variant[] = [
  { name: 'default', request: {} },
  { name: 'max1', request: { maxTokens: 1 } },
  { name: 'max7', request: { maxTokens: 7 } },
  { name: 'max16', request: { maxTokens: 16 } },
  { name: 'greedy', request: { sampling: { temperature: 0 } } },
  { name: 'n2', request: { n: 2, maxTokens: 40 } },
  { name: 'stop', request: { sampling: { stop: ['the', '.'] } } },
  { name: 'stopMax', request: { maxTokens: 12, sampling: { stop: ['ing '] } } },
  { name: 'samplers', request: { sampling: { top_k: 4, top_p: 0.8, min_p: 0.05, temperature: 1.3 } } },
  {
    name: 'penalties',
    request: { sampling: { frequency_penalty: 0.7, presence_penalty: 0.4, repetition_penalty: 1.3 } },
  },
  { name: 'dynTemp', request: { sampling: { min_temp: 0.2, max_temp: 1.5 } } },
  { name: 'logprobs0', request: { logprobs: { top: 0 }, maxTokens: 30 } },
  { name: 'logprobs3', request: { logprobs: { top: 3 }, maxTokens: 30 } },
  { name: 'tools', request: { tools: TOOLS } },
  {
    name: 'toolsNamed',
    request: { tools: TOOLS, toolChoice: { type: 'function', function: { name: 'lookup_price' } } },
  },
  { name: 'toolsMax', request: { tools: TOOLS, toolChoice: 'required', maxTokens: 9 } },
  { name: 'toolsNone', request: { tools: TOOLS, toolChoice: 'none', maxTokens: 20 } },
  { name: 'reasoning', request: { reasoning: { enabled: true, tags: false, effort: 'low' } } },
  { name: 'reasoningTags', request: { reasoning: { enabled: true, tags: true }, maxTokens: 70 } },
  {
    name: 'reasoningLogprobs',
    request: { reasoning: { enabled: true, tags: false, effort: 'minimal' }, logprobs: { top: 2 }, n: 2 },
  },
];

const SEEDS = [1, 42];

type Case = { name: string; request: ChatProviderRequest };

function cases(): Case[] {
  const out: Case[] = [];
  for (const [prompt, messages] of Object.entries(PROMPTS))
    for (const variant of VARIANTS)
      for (const seed of SEEDS) {
        const request: ChatProviderRequest = {
          model: seed === 1 ? 'llama-3.3-70b' : 'qwen3-coder-480b',
          messages,
          maxTokens: 4096,
          n: 1,
          ...variant.request,
          sampling: { ...variant.request.sampling, seed },
        };
        out.push({ name: `${prompt}/${variant.name}/seed${seed}`, request });
      }
  return out;
}

type Record_ = { name: string; sha256: string; usage: unknown; finish: string };

async function record(): Promise<Record_[]> {
  const engine = createLocalChatEngine();
  const out: Record_[] = [];
  for (const c of cases()) {
    const events: ChatEvent[] = [];
    for await (const event of engine.stream(c.request)) events.push(event);
    const usage = events.find((e) => e.type === 'usage');
    out.push({
      name: c.name,
      sha256: createHash('sha256').update(JSON.stringify(events)).digest('hex'),
      usage: usage?.type === 'usage' ? usage.usage : null,
      finish: events.flatMap((e) => (e.type === 'finish' ? [e.reason] : [])).join(','),
    });
  }
  return out;
}

/** What a caller that reads the answer whole puts together from the events (as the chat handler does). */
function fold(events: ChatEvent[]) {
  const choices: {
    content: string;
    reasoning: string;
    calls: { id?: string; name: string; arguments: string }[];
    logprobs: unknown[];
    finish?: string;
  }[] = [];
  let usage: unknown;
  for (const event of events) {
    if (event.type === 'usage') {
      usage = event.usage;
      continue;
    }
    choices[event.index] ??= { content: '', reasoning: '', calls: [], logprobs: [] };
    const choice = choices[event.index] as (typeof choices)[number];
    if (event.type === 'finish') {
      choice.finish = event.reason;
      continue;
    }
    choice.content += event.content ?? '';
    choice.reasoning += event.reasoning ?? '';
    choice.logprobs.push(...(event.logprobs ?? []));
    for (const call of event.toolCalls ?? []) {
      choice.calls[call.index] ??= { name: '', arguments: '' };
      const into = choice.calls[call.index] as (typeof choice.calls)[number];
      if (call.id) into.id = call.id;
      into.name += call.function?.name ?? '';
      into.arguments += call.function?.arguments ?? '';
    }
  }
  return { choices, usage };
}

describe('local engine golden outputs', () => {
  test('read whole (a request that is not streamed): the same answers, in one delta a turn instead of one a token', async () => {
    const streamed = createLocalChatEngine();
    const whole = createLocalChatEngine();
    let tokenEvents = 0;
    let wholeEvents = 0;
    for (const c of cases()) {
      const perToken: ChatEvent[] = [];
      for await (const event of streamed.stream(c.request)) perToken.push(event);
      const gathered: ChatEvent[] = [];
      for await (const event of whole.stream({ ...c.request, whole: true })) gathered.push(event);
      expect(fold(gathered), c.name).toEqual(fold(perToken));
      tokenEvents += perToken.length;
      wholeEvents += gathered.length;
      // A turn holds 16 tokens: at most one delta per field per 16 tokens, plus the opening one of each choice.
      const usage = perToken.find((e) => e.type === 'usage');
      const tokens = usage?.type === 'usage' ? usage.usage.completionTokens : 0;
      const deltas = gathered.filter((e) => e.type === 'delta').length;
      expect(deltas, c.name).toBeLessThanOrEqual(c.request.n * 4 + Math.ceil(tokens / 16) * 2);
      // Read whole, no delta carries nothing (a stream's opening chunk is a stream's alone).
      const empty = gathered.filter(
        (e) =>
          e.type === 'delta' && !e.content && !e.reasoning && !e.toolCalls?.length && !e.logprobs?.length,
      );
      expect(empty, c.name).toEqual([]);
    }
    expect(wholeEvents).toBeLessThan(tokenEvents / 4);
  });

  test('360 requests give exactly the recorded events', async () => {
    const actual = await record();
    expect(actual.length).toBe(360);
    if (process.env.GOLDEN_UPDATE === '1') writeFileSync(FIXTURE, `${JSON.stringify(actual, null, 2)}\n`);
    const expected = JSON.parse(readFileSync(FIXTURE, 'utf8')) as Record_[];
    expect(actual).toEqual(expected);
  });
});
