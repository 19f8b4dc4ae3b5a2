/**
 * The local engine's draws worked out once per start (`drawTables` in server/providers/chat/local.ts) against
 * the draw worked out every time. A request that asks for top log probabilities takes the second way (each
 * draw's alternatives are reported), one that asks for log probabilities without alternatives (`top: 0`) the
 * first; neither changes which words are drawn or their probabilities. So both must give the same tokens with
 * the same log probabilities, for every sampling setting a table depends on: temperatures (0 takes the first
 * allowed word and draws no random number), top_k (a fraction below 1 allows nothing: the answer is `the`),
 * top_p, min_p (above 1 allows nothing), pools whose 16 candidates can repeat (the lexicon alone has 91 words,
 * and 7 x 13 = 91) and pools whose cannot, the reasoning lexicon's sampler too, and the same tables met again
 * by later requests.
 */
import { describe, expect, test } from 'vitest';
import { createLocalChatEngine } from '../../server/providers/chat/local.ts';
import type {
  ChatEvent,
  ChatProviderRequest,
  ProviderMessage,
  ProviderTool,
  SamplingOptions,
} from '../../server/providers/chat/types.ts';

const PROMPTS: Record<string, ProviderMessage[]> = {
  // No word of four letters or more: the pool is the lexicon's 91 words, whose candidates can repeat.
  lexiconOnly: [{ role: 'user', content: 'Go on, do it.' }],
  hello: [{ role: 'user', content: 'Say hello to the benchmark.' }],
  // Fourteen new words: 105 = 7 x 15, candidates that can repeat again.
  fourteenNew: [
    {
      role: 'user',
      content:
        'alpha bravo charlie delta echoes foxtrot golfer hotel india juliet kilos limas mikes novembers',
    },
  ],
};

/**
 * A function called after the text: its arguments and its id are drawn with the same random numbers as the
 * words, after them, so they tell whether every draw took its number (one that allows nothing included).
 */
const TOOLS: ProviderTool[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' }, score: { type: 'number' } },
        required: ['city', 'days', 'score'],
      },
    },
  },
];

const TEMPERATURES = [undefined, 0, 0.3, 1.7];
const TOP_K = [undefined, 0.5, 1, 3];
const TOP_P = [undefined, 0.05, 0.6];
const MIN_P = [undefined, 0.3, 2];
const SEEDS = [7, 1234];

type Token = { token: string; logprob: number };
type Call = { id?: string; name: string; arguments: string };

/** The answer's text, its reasoning, and every token of both with its log probability, in order. */
async function answer(engine: ReturnType<typeof createLocalChatEngine>, request: ChatProviderRequest) {
  let content = '';
  let reasoning = '';
  const tokens: Token[] = [];
  const calls: Call[] = [];
  for await (const event of engine.stream(request) as AsyncIterable<ChatEvent>) {
    if (event.type !== 'delta') continue;
    content += event.content ?? '';
    reasoning += event.reasoning ?? '';
    for (const lp of event.logprobs ?? []) tokens.push({ token: lp.token, logprob: lp.logprob });
    for (const call of event.toolCalls ?? []) {
      calls[call.index] ??= { name: '', arguments: '' };
      const into = calls[call.index] as Call;
      if (call.id) into.id = call.id;
      into.name += call.function?.name ?? '';
      into.arguments += call.function?.arguments ?? '';
    }
  }
  return { content, reasoning, tokens, calls };
}

describe('local engine: draws worked out once per start', () => {
  test('give the tokens and log probabilities the draw worked out every time gives, for every setting', async () => {
    const engine = createLocalChatEngine();
    let compared = 0;
    let nothingAllowed = 0;
    // Twice over: the second pass meets tables the first one filled.
    for (let pass = 0; pass < 2; pass++)
      for (const [name, messages] of Object.entries(PROMPTS))
        for (const temperature of TEMPERATURES)
          for (const top_k of TOP_K)
            for (const top_p of TOP_P)
              for (const min_p of MIN_P)
                for (const seed of SEEDS)
                  for (const tools of [undefined, TOOLS]) {
                    const sampling: SamplingOptions = { seed };
                    if (temperature !== undefined) sampling.temperature = temperature;
                    if (top_k !== undefined) sampling.top_k = top_k;
                    if (top_p !== undefined) sampling.top_p = top_p;
                    if (min_p !== undefined) sampling.min_p = min_p;
                    const base: ChatProviderRequest = {
                      model: 'llama-3.3-70b',
                      messages,
                      maxTokens: tools ? 400 : 40,
                      n: 1,
                      sampling,
                      ...(tools ? { tools, toolChoice: 'required' as const } : {}),
                      reasoning: { enabled: true, tags: false, effort: 'minimal' },
                      whole: true,
                    };
                    const label = `${name} ${JSON.stringify(sampling)} tools ${Boolean(tools)} pass ${pass}`;
                    const tabled = await answer(engine, { ...base, logprobs: { top: 0 } });
                    const worked = await answer(engine, { ...base, logprobs: { top: 2 } });
                    expect(tabled, label).toEqual(worked);
                    expect(tabled.tokens.length, label).toBeGreaterThan(0);
                    if (/(^|\] )The the the/.test(tabled.content)) nothingAllowed++;
                    if (tools) expect(tabled.calls.length, label).toBe(1);
                    compared++;
                  }
    expect(compared).toBe(2 * 3 * 4 * 4 * 3 * 3 * 2 * 2);
    // The settings that allow no candidate were met (each draw then answers `the`).
    expect(nothingAllowed).toBeGreaterThan(0);
  });
});
