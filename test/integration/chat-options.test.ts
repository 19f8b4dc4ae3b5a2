/**
 * The request options of chat completions, one test per option, each of which would fail if the option did
 * nothing: service_parameters and model suffixes, system prompts, personas, reasoning controls, bounds,
 * sampling, logprobs, content parts, prompt caching, Pro-only models, deprecation headers, concurrency caps.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import type { ChatCompletion } from '../../generated/api.d.ts';
import { DEFAULT_SYSTEM_PROMPT } from '../../server/domains/chat/prompt.ts';
import { countMessageTokens } from '../../server/providers/chat/tokenizer.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

let server: ChatServer;
let key: string;
beforeAll(async () => {
  server = await startChatServer();
  key = (await server.account('50')).key;
});
afterAll(async () => {
  await server?.close();
});

const USER = [{ role: 'user' as const, content: 'Tell me about rivers and mountains.' }];

type Answer = ChatCompletion & { error?: string; details?: unknown };

async function chat(body: Record<string, unknown>, options: { key?: string; base?: string } = {}) {
  const response = await fetch(`${options.base ?? server.base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${options.key ?? key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'llama-3.3-70b', messages: USER, ...body }),
  });
  return { response, json: (await response.json()) as Answer };
}

const content = (a: Answer, i = 0) =>
  (a.choices?.[i]?.message as { content?: string | null } | undefined)?.content ?? '';
const message = (a: Answer, i = 0) =>
  a.choices?.[i]?.message as { content: string | null; reasoning_content?: string | null };

describe('service_parameters and model suffixes', () => {
  test('behavior: the echo carries every required option with its default', async () => {
    const { json } = await chat({});
    expect(json.service_parameters).toEqual({
      enable_e2ee: false,
      enable_web_search: 'off',
      enable_web_citations: false,
      enable_web_scraping: false,
      include_service_system_prompt: true,
      include_search_results_in_stream: false,
      return_search_results_as_documents: false,
      strip_thinking_response: false,
      disable_thinking: false,
    });
  });

  test('behavior: suffix options apply, several joined by &; the body wins over the suffix', async () => {
    const { json } = await chat({
      model:
        'llama-3.3-70b:enable_web_citations=true&include_search_results_in_stream=true&strip_thinking_response=true',
      service_parameters: { strip_thinking_response: false },
    });
    expect(json.model).toBe('llama-3.3-70b');
    expect(json.service_parameters).toMatchObject({
      enable_web_citations: true,
      include_search_results_in_stream: true,
      strip_thinking_response: false,
    });
  });

  test('behavior: an unknown suffix option or a bad value is a 400 naming it', async () => {
    const unknown = await chat({ model: 'llama-3.3-70b:enable_magic=true' });
    expect(unknown.response.status).toBe(400);
    expect(unknown.json.error).toContain('enable_magic');
    const bad = await chat({ model: 'llama-3.3-70b:enable_web_search=sometimes' });
    expect(bad.response.status).toBe(400);
    expect(bad.json.error).toContain('enable_web_search');
  });

  test('behavior: enable_x_search and enable_e2ee on a model without them are a clear 400', async () => {
    const x = await chat({ service_parameters: { enable_x_search: true } });
    expect(x.response.status).toBe(400);
    expect(x.json.error).toContain('enable_x_search');
    const e2ee = await chat({ model: 'llama-3.3-70b:enable_e2ee=true' });
    expect(e2ee.response.status).toBe(400);
    expect(e2ee.json.error).toContain('enable_e2ee');
  });

  test('behavior: include_service_system_prompt false drops exactly the default system prompt', async () => {
    const kept = await chat({ seed: 1 });
    const dropped = await chat({ seed: 1, service_parameters: { include_service_system_prompt: false } });
    expect(dropped.json.service_parameters?.include_service_system_prompt).toBe(false);
    expect(kept.json.usage.prompt_tokens - dropped.json.usage.prompt_tokens).toBe(
      countMessageTokens({ role: 'system', content: DEFAULT_SYSTEM_PROMPT }),
    );
  });

  test('behavior: character_slug adds the persona; an unknown slug is 404', async () => {
    const plain = await chat({ seed: 1 });
    const persona = await chat({ seed: 1, service_parameters: { character_slug: 'the-archivist' } });
    expect(persona.response.status).toBe(200);
    expect(persona.json.service_parameters?.character_slug).toBe('the-archivist');
    const systemPrompt = server.services.catalog.getCharacterPersona('the-archivist')?.systemPrompt ?? '';
    expect(persona.json.usage.prompt_tokens - plain.json.usage.prompt_tokens).toBe(
      countMessageTokens({ role: 'system', content: systemPrompt }),
    );
    const missing = await chat({ service_parameters: { character_slug: 'nobody-at-all' } });
    expect(missing.response.status).toBe(404);
    expect(missing.json.error).toBe('No character could be found from the provided character_slug');
  });
});

describe('reasoning', () => {
  test('behavior: a tag-format model thinks in <think>; strip_thinking_response removes the block, not the charge', async () => {
    const raw = await chat({ model: 'deepseek-r1-671b', seed: 5 });
    expect(content(raw.json)).toMatch(/^<think>\n[\s\S]+\n<\/think>\n\n\[local engine\]/);
    const stripped = await chat({ model: 'deepseek-r1-671b:strip_thinking_response=true', seed: 5 });
    expect(content(stripped.json)).toBe(content(raw.json).replace(/^<think>[\s\S]*<\/think>\s*/, ''));
    expect(stripped.json.usage).toEqual(raw.json.usage);
    // Streams strip too, across chunk boundaries.
    const response = await fetch(`${server.base}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'deepseek-r1-671b:strip_thinking_response=true',
        seed: 5,
        messages: USER,
        stream: true,
      }),
    });
    let text = '';
    for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>)) {
      if (event.data === '[DONE]') continue;
      for (const c of (JSON.parse(event.data) as { choices: { delta: { content?: string } }[] }).choices)
        text += c.delta.content ?? '';
    }
    expect(text).toBe(content(stripped.json));
  });

  test('behavior: a field-format model returns reasoning_content; disable_thinking turns thinking off', async () => {
    const thinking = await chat({ model: 'qwen3-235b', seed: 2 });
    expect(message(thinking.json).reasoning_content?.length).toBeGreaterThan(0);
    expect(thinking.json.usage.completion_tokens_details?.reasoning_tokens).toBeGreaterThan(0);
    const off = await chat({ model: 'qwen3-235b', seed: 2, service_parameters: { disable_thinking: true } });
    expect(message(off.json).reasoning_content ?? null).toBeNull();
    expect(off.json.usage.completion_tokens_details?.reasoning_tokens).toBe(0);
    expect(off.json.service_parameters?.disable_thinking).toBe(true);
  });

  test('behavior: reasoning_effort scales the reasoning', async () => {
    const low = await chat({ model: 'qwen3-235b', seed: 2, reasoning_effort: 'low' });
    const high = await chat({ model: 'qwen3-235b', seed: 2, reasoning_effort: 'high' });
    expect(high.json.usage.completion_tokens_details?.reasoning_tokens ?? 0).toBeGreaterThan(
      low.json.usage.completion_tokens_details?.reasoning_tokens ?? 0,
    );
  });

  test('behavior: max_completion_tokens bounds visible plus reasoning tokens', async () => {
    const { json } = await chat({ model: 'qwen3-235b', seed: 2, max_completion_tokens: 10 });
    expect(json.choices?.[0]?.finish_reason).toBe('length');
    expect(json.usage.completion_tokens).toBe(10);
    expect(json.usage.completion_tokens_details?.reasoning_tokens).toBe(10);
  });
});

describe('bounds and sampling', () => {
  test('behavior: max_tokens bounds the answer; 0 or less is ignored', async () => {
    const bounded = await chat({ seed: 4, max_tokens: 5 });
    expect(bounded.json.choices?.[0]?.finish_reason).toBe('length');
    expect(bounded.json.usage.completion_tokens).toBe(5);
    const ignored = await chat({ seed: 4, max_tokens: 0 });
    expect(ignored.json.choices?.[0]?.finish_reason).toBe('stop');
    expect(ignored.json.usage.completion_tokens).toBeGreaterThan(5);
    const negative = await chat({ seed: 4, max_tokens: -3 });
    expect(negative.json.usage).toEqual(ignored.json.usage);
  });

  test('behavior: the same seed gives the same answer; temperature 0 ignores the seed', async () => {
    const a = await chat({ seed: 10 });
    const b = await chat({ seed: 10 });
    const c = await chat({ seed: 11 });
    expect(content(a.json)).toBe(content(b.json));
    expect(content(a.json)).not.toBe(content(c.json));
    const cold1 = await chat({ seed: 10, temperature: 0 });
    const cold2 = await chat({ seed: 11, temperature: 0 });
    expect(content(cold1.json)).toBe(content(cold2.json));
  });

  test('behavior: max_temp caps dynamic temperature (0 makes the draw greedy)', async () => {
    const hot1 = await chat({ seed: 20, temperature: 1.5 });
    const hot2 = await chat({ seed: 21, temperature: 1.5 });
    expect(content(hot1.json)).not.toBe(content(hot2.json));
    const capped1 = await chat({ seed: 20, temperature: 1.5, max_temp: 0 });
    const capped2 = await chat({ seed: 21, temperature: 1.5, max_temp: 0 });
    expect(content(capped1.json)).toBe(content(capped2.json));
  });

  test('behavior: top_k 1 is greedy; top_p and min_p narrow the draw', async () => {
    for (const narrow of [{ top_k: 1 }, { top_p: 0.01 }, { min_p: 1 }]) {
      const x = await chat({ seed: 30, temperature: 1.5, ...narrow });
      const y = await chat({ seed: 31, temperature: 1.5, ...narrow });
      expect(content(x.json)).toBe(content(y.json));
    }
  });

  test('behavior: frequency_penalty and presence_penalty change repetition', async () => {
    const words = (a: Answer) =>
      content(a)
        .toLowerCase()
        .match(/[a-z]+/g) ?? [];
    const repeats = (a: Answer) => words(a).length - new Set(words(a)).size;
    const ask = [{ role: 'user', content: 'Write 120 words about rivers.' }];
    const repetitive = await chat({ messages: ask, seed: 8, temperature: 0, frequency_penalty: -2 });
    const varied = await chat({ messages: ask, seed: 8, temperature: 0, frequency_penalty: 2 });
    expect(repeats(varied.json)).toBeLessThan(repeats(repetitive.json));
    const present = await chat({ messages: ask, seed: 8, temperature: 0, presence_penalty: 2 });
    expect(repeats(present.json)).toBeLessThan(repeats(repetitive.json));
    const repetition = await chat({ messages: ask, seed: 8, temperature: 0, repetition_penalty: 3 });
    const plain = await chat({ messages: ask, seed: 8, temperature: 0 });
    expect(content(repetition.json)).not.toBe(content(plain.json));
  });

  test('behavior: stop ends the answer before the stop sequence', async () => {
    const full = await chat({ seed: 12 });
    const text = content(full.json);
    const stopAt = text.split(' ')[4] as string;
    const stopped = await chat({ seed: 12, stop: [` ${stopAt}`] });
    expect(stopped.json.choices?.[0]?.finish_reason).toBe('stop');
    expect(content(stopped.json)).toBe(text.slice(0, text.indexOf(` ${stopAt}`)));
    expect(stopped.json.usage.completion_tokens).toBeLessThan(full.json.usage.completion_tokens);
  });
});

describe('logprobs', () => {
  test('behavior: logprobs and top_logprobs on a model that supports them; 400 elsewhere', async () => {
    const { json } = await chat({ seed: 3, logprobs: true, top_logprobs: 3 });
    const lp = json.choices?.[0]?.logprobs;
    expect(lp?.content?.length).toBe(json.usage.completion_tokens);
    expect(lp?.content?.map((t) => t.token).join('')).toBe(content(json));
    expect(lp?.content?.every((t) => t.logprob <= 0 && t.top_logprobs.length <= 3)).toBe(true);
    expect(lp?.content?.some((t) => t.top_logprobs.length === 3)).toBe(true);
    const without = await chat({ seed: 3 });
    expect(without.json.choices?.[0]?.logprobs).toBeNull();
    const refused = await chat({ model: 'mistral-31-24b', logprobs: true });
    expect(refused.response.status).toBe(400);
    expect(refused.json.error).toContain('logprobs');
  });
});

describe('content parts and prompt caching', () => {
  const image = { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } };

  test('behavior: image, audio and video parts need the capability (400 otherwise)', async () => {
    const parts = [{ type: 'text', text: 'What is in this picture?' }, image];
    const refused = await chat({ messages: [{ role: 'user', content: parts }] });
    expect(refused.response.status).toBe(400);
    expect(refused.json.error).toContain('images');
    const vision = await chat({ model: 'mistral-31-24b', messages: [{ role: 'user', content: parts }] });
    expect(vision.response.status).toBe(200);
    const audio = await chat({
      model: 'mistral-31-24b',
      messages: [
        {
          role: 'user',
          content: [{ type: 'input_audio', input_audio: { data: 'UklGRiQAAABXQVZF', format: 'wav' } }],
        },
      ],
    });
    expect(audio.response.status).toBe(400);
    const video = await chat({
      model: 'mistral-31-24b',
      messages: [
        { role: 'user', content: [{ type: 'video_url', video_url: { url: 'https://example.org/a.mp4' } }] },
      ],
    });
    expect(video.response.status).toBe(400);
  });

  test('behavior: text parts with cache_control are written to the cache, then read from it and priced lower', async () => {
    const long = `Reference notes: ${'rivers carve valleys through mountains over long periods of time. '.repeat(40)}`;
    const messages = [
      { role: 'system', content: [{ type: 'text', text: long, cache_control: { type: 'ephemeral' } }] },
      { role: 'user', content: 'Summarise the notes.' },
    ];
    const first = await chat({ messages, seed: 9 });
    const details1 = first.json.usage.prompt_tokens_details;
    expect(details1?.cache_creation_input_tokens).toBeGreaterThan(100);
    expect(details1?.cached_tokens).toBe(0);
    const second = await chat({ messages, seed: 9 });
    const details2 = second.json.usage.prompt_tokens_details;
    expect(details2?.cached_tokens).toBe(details1?.cache_creation_input_tokens);
    expect(details2?.cache_creation_input_tokens).toBe(0);
    // llama-3.3-70b: input 0.7, cache reads 0.35 USD per million tokens; output the same in both.
    const saved = (details2?.cached_tokens ?? 0) * 350;
    expect(
      Math.round((first.json.cost?.usd ?? 0) * 1e9) - Math.round((second.json.cost?.usd ?? 0) * 1e9),
    ).toBe(saved);
  });
});

describe('model access', () => {
  test('behavior: a Pro-only model answers 401 with the interface message to others, 200 to Pro accounts', async () => {
    const refused = await chat({ model: 'qwen3-coder-480b' });
    expect(refused.response.status).toBe(401);
    expect(refused.json.error).toBe('This model is only available to Pro users');
    const pro = await server.account('5', { pro: true });
    const ok = await chat({ model: 'qwen3-coder-480b' }, { key: pro.key });
    expect(ok.response.status).toBe(200);
  });

  test('behavior: a deprecated model carries the deprecation headers; others do not', async () => {
    const old = await chat({ model: 'deepseek-r1-671b' });
    expect(old.response.headers.get('x-service-model-deprecation-date')).toBe('2027-03-01');
    expect(old.response.headers.get('x-service-model-deprecation-warning')).toContain('qwen3-235b');
    const current = await chat({});
    expect(current.response.headers.get('x-service-model-deprecation-date')).toBeNull();
    expect(current.response.headers.get('x-service-model-id')).toBe('llama-3.3-70b');
    expect(current.response.headers.get('x-service-model-router')).toBe('local');
  });

  test('behavior: tools on a model without function calling are a 400', async () => {
    const { response } = await chat({
      model: 'deepseek-r1-671b',
      tools: [{ type: 'function', function: { name: 'f' } }],
    });
    expect(response.status).toBe(400);
  });
});
