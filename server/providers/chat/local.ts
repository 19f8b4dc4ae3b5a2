/**
 * The embedded local chat engine: the default backend, needing nothing outside the process. It is not a
 * language model and says so (every answer starts with `[local engine]`), but it behaves like one where the
 * interface can observe it: a seeded sampler (same seed and parameters, same answer; temperature, top_p,
 * top_k, min_p, dynamic temperature and the penalties change the draw), real token counts from a BPE
 * tokenizer, token-by-token streaming, reasoning (in `<think>` tags or separately), function calls shaped by
 * the tools' JSON schemas, log probabilities, stop sequences, the `length` bound and `n` choices. Prompt
 * caching is real too: prefixes marked with `cache_control` are remembered, and a later request with the same
 * prefix reads them from the cache.
 */
import { createHash } from 'node:crypto';
import type { AbortLike } from '../../http/request-abort.ts';
import { extend } from '../../objects.ts';
import { mulberry32 } from '../random.ts';
import { countMessageTokens, countPromptTokens, countTokens, decodeToken, encodeText } from './tokenizer.ts';
import type {
  ChatEvent,
  ChatProvider,
  ChatProviderRequest,
  FinishReason,
  ProviderMessage,
  ProviderTool,
  TokenLogprob,
  TopLogprob,
} from './types.ts';

export type LocalChatEngineOptions = {
  /** Pause between streamed tokens, for a realistic pace (0: as fast as the event loop allows). */
  tokenDelayMs?: number;
  /** How many cached prompt prefixes the engine remembers. */
  cacheEntries?: number;
};

export const LOCAL_PREFIX = '[local engine]';

const LEXICON = (
  'the answer depends on context and a careful reading of your question suggests several points worth ' +
  'considering first data shows clear patterns while other sources disagree about details we can compare ' +
  'options weigh costs and benefits then choose carefully because every choice has tradeoffs simple ' +
  'approaches often work well yet complex problems need more structure good practice means testing ideas ' +
  'early measuring results and adjusting plans people usually prefer clear explanations short examples help ' +
  'memory and understanding improves with practice over time history offers lessons science offers methods ' +
  'engineering offers tools design offers clarity language offers nuance numbers offer precision'
).split(' ');

const REASONING_LEXICON = (
  'first consider what is asked then recall relevant facts check assumptions compare alternatives estimate ' +
  'the result verify each step look for mistakes and finally decide how to phrase a concise answer'
).split(' ');

const EFFORT_WORDS: Record<string, number> = {
  none: 0,
  minimal: 8,
  low: 16,
  medium: 40,
  high: 80,
  xhigh: 120,
  max: 160,
};

const hashes = new Map<string, number>();

/** The first 32 bits of the text's SHA-256; the words' hashes are remembered (a bounded memo: same values). */
function hash32(text: string): number {
  const known = hashes.get(text);
  if (known !== undefined) return known;
  const value = createHash('sha256').update(text).digest().readUInt32BE(0);
  if (text.length <= 64) {
    if (hashes.size >= 4096) hashes.clear();
    hashes.set(text, value);
  }
  return value;
}

const expTables = new Map<number, Float64Array>();

/**
 * The softmax's exps for one divisor (the temperature, at least 1e-6), by the kinds of the largest candidate
 * and of the one taken (slot `top * 32 + kind`), NaN until first computed: a draw of a request without
 * penalties takes each from here once it is known, the same double as Math.exp gives (a bounded memo).
 */
function expTableOf(divisor: number): Float64Array {
  return remembered(expTables, 16, divisor, newExpTable);
}

const newExpTable = () => new Float64Array(32 * 32).fill(Number.NaN);

/**
 * `memo`'s value of `key`, made by `make` the first time it is asked for: a bounded memo, emptied whole once it
 * holds `bound` keys (what it holds can always be made again).
 */
function remembered<K, V>(memo: Map<K, V>, bound: number, key: K, make: () => V): V {
  let value = memo.get(key);
  if (value === undefined) {
    if (memo.size >= bound) memo.clear();
    value = make();
    memo.set(key, value);
  }
  return value;
}

/** A new array, for the memos whose values are arrays filled as they are used. */
const newArray = <T>(): T[] => [];

const NO_ALTERNATIVES: { word: string; logprob: number }[] = [];

type Draw = { word: string; logprob: number; alternatives: { word: string; logprob: number }[] };

type Sampler = { next(previous: string): Draw };

/**
 * A start's draw worked out once (drawTables): the candidates the draw may take, in the order it walks them,
 * their probabilities and their sum (added in that order), each one's Draw, and the Draw taken when the walk
 * ends without one (the first allowed candidate, or `the` when none is).
 */
type StartDraw = { probs: Float64Array; total: number; draws: Draw[]; fallback: Draw };

/**
 * The draws of one pool under one set of sampling settings, by start (the previous word's hash modulo the
 * pool's length), each worked out the first time that start comes: without penalties, a dynamic temperature
 * or alternatives to report, a draw's candidates, their order, their probabilities and what top_k, min_p and
 * top_p allow depend on nothing else, so only the random number differs from one draw to the next. A bounded
 * memo (at most DRAW_TABLES pools and settings, each at most a pool's length of starts).
 */
const drawTables = new Map<string, Array<StartDraw | undefined>>();
const DRAW_TABLES = 32;

/**
 * Words are drawn from a candidate list that depends on the previous word; candidate k has logit -0.35 k,
 * prompt words get a boost, and the penalties lower words already used. Temperature 0 (or a dynamic range
 * capped at 0) picks the most likely word, so the seed no longer matters.
 */
function createSampler(
  request: ChatProviderRequest,
  random: () => number,
  promptWords: string[],
  lexicon: string[],
  withAlternatives: boolean,
): Sampler {
  const s = request.sampling;
  const { words: pool, prompted, distinct, key: poolKey } = poolOf(lexicon, promptWords);
  const frequencyPenalty = s.frequency_penalty ?? 0;
  const presencePenalty = s.presence_penalty ?? 0;
  const repetitionPenalty = s.repetition_penalty;
  // How often each word of the pool (by position) was drawn: read only when a penalty depends on it (without
  // one, what it would subtract is 0).
  const counts =
    frequencyPenalty !== 0 || presencePenalty !== 0 || (repetitionPenalty && repetitionPenalty > 0)
      ? new Uint32Array(pool.length)
      : undefined;
  const topK = s.top_k;
  const minP = s.min_p ?? 0;
  const topP = s.top_p;
  const dynamic = s.max_temp !== undefined || s.min_temp !== undefined;
  const staticTemperature = s.temperature ?? 0.8;
  // Without penalties or a dynamic temperature a candidate's logit depends only on its rank k and the prompt's
  // boost, so each exp of the softmax is one of 32 x 32 values per temperature: remembered (expTableOf).
  const expTable =
    counts === undefined && !dynamic ? expTableOf(Math.max(staticTemperature, 1e-6)) : undefined;
  // And then, unless each draw's alternatives are reported, every draw of a start is the same but for its
  // random number: worked out once per start (drawTables).
  const starts =
    expTable && !withAlternatives
      ? remembered(
          drawTables,
          DRAW_TABLES,
          `${poolKey}\u0000${staticTemperature}\u0000${topK}\u0000${topP}\u0000${minP}`,
          newArray<StartDraw | undefined>,
        )
      : undefined;
  // The draw's working arrays, reused from word to word (the candidates in drawn order, then sorted).
  const words: string[] = [];
  /** Each candidate's kind when expTable is used: its rank k times 2, plus 1 when the prompt boosts it. */
  const kinds: number[] = [];
  const positions: number[] = [];
  const logits: number[] = [];
  const order: number[] = [];
  const probs: number[] = [];
  const allowed: number[] = [];
  let temperature = staticTemperature;
  /** How many candidates the last `rank` sorted. */
  let ranked = 0;

  /**
   * A start's candidates, sorted, their probabilities, and those top_k, min_p and top_p allow (their positions
   * in the sorted order, in `allowed`): how many are allowed. Sets `temperature` (a dynamic one depends on the
   * candidates).
   */
  function rank(start: number): number {
    let size = 0;
    for (let k = 0; k < 16; k++) {
      const position = (start + k * 7) % pool.length;
      const word = pool[position] as string;
      if (!distinct) {
        let taken = false;
        for (let j = 0; j < size; j++)
          if (words[j] === word) {
            taken = true;
            break;
          }
        if (taken) continue;
      }
      const boosted = prompted[position] === 1;
      let logit = -0.35 * k + (boosted ? 0.6 : 0);
      kinds[size] = k * 2 + (boosted ? 1 : 0);
      if (counts) {
        const used = counts[position] as number;
        logit -= frequencyPenalty * used + presencePenalty * (used > 0 ? 1 : 0);
        if (used > 0 && repetitionPenalty && repetitionPenalty > 0) logit -= Math.log(repetitionPenalty);
      }
      words[size] = word;
      positions[size] = position;
      logits[size] = logit;
      // Stable insertion by descending logit: the order a stable sort gives.
      let at = size;
      while (at > 0 && (logits[order[at - 1] as number] as number) < logit) {
        order[at] = order[at - 1] as number;
        at--;
      }
      order[at] = size;
      size++;
    }
    ranked = size;
    if (dynamic) {
      // Dynamic temperature: the flatter the candidates, the hotter the draw, within [min_temp, max_temp].
      const lo = s.min_temp ?? 0;
      const hi = Math.max(lo, s.max_temp ?? 2);
      const spread =
        size > 0 ? (logits[order[0] as number] as number) - (logits[order[size - 1] as number] as number) : 0;
      temperature = lo + (hi - lo) * Math.max(0, Math.min(1, 1 - spread / 8));
    }
    // Softmax over the sorted candidates' logits / temperature, in the same order of operations as ever.
    const divisor = Math.max(temperature, 1e-6);
    let max = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < size; i++) {
      const scaled = (logits[order[i] as number] as number) / divisor;
      probs[i] = scaled;
      if (scaled > max) max = scaled;
    }
    let sum = 0;
    // With expTable, each exp is remembered by the kinds of the largest candidate (the first: sorted by
    // descending logit, divided by a positive divisor) and of this one: the same operands, the same double.
    const top = expTable ? (kinds[order[0] as number] as number) * 32 : 0;
    for (let i = 0; i < size; i++) {
      const slot = top + (kinds[order[i] as number] as number);
      let e = expTable ? (expTable[slot] as number) : Number.NaN;
      if (Number.isNaN(e)) {
        e = Math.exp((probs[i] as number) - max);
        if (expTable) expTable[slot] = e;
      }
      probs[i] = e;
      sum += e;
    }
    for (let i = 0; i < size; i++) probs[i] = (probs[i] as number) / sum;
    // The allowed candidates, as positions in the sorted order.
    // `top_k` as `slice(0, top_k)` reads it (a fraction truncated).
    let count = topK && topK > 0 ? Math.min(size, Math.trunc(topK)) : size;
    for (let i = 0; i < count; i++) allowed[i] = i;
    if (minP > 0) {
      const top = count > 0 ? (probs[0] as number) : 0;
      let kept = 0;
      for (let i = 0; i < count; i++) {
        const at = allowed[i] as number;
        if ((probs[at] as number) >= minP * top) allowed[kept++] = at;
      }
      count = kept;
    }
    if (topP !== undefined && topP < 1) {
      let mass = 0;
      let kept = 0;
      for (let i = 0; i < count; i++) {
        const at = allowed[i] as number;
        if (mass < topP || mass === 0) allowed[kept++] = at;
        mass += probs[at] as number;
      }
      count = kept;
    }
    return count;
  }

  /** The sum of the allowed candidates' probabilities, added in the order the draw walks them. */
  function allowedTotal(count: number): number {
    let total = 0;
    for (let i = 0; i < count; i++) total += probs[allowed[i] as number] as number;
    return total;
  }

  /** A start's draw, worked out as `next` would (its order, probabilities and sum): see drawTables. */
  function startDraw(start: number): StartDraw {
    const count = rank(start);
    const startProbs = new Float64Array(count);
    const draws: Draw[] = [];
    for (let i = 0; i < count; i++) {
      const at = allowed[i] as number;
      startProbs[i] = probs[at] as number;
      draws.push({
        word: words[order[at] as number] as string,
        logprob: logOf(probs[at] as number),
        alternatives: NO_ALTERNATIVES,
      });
    }
    const fallback = draws[0] ?? { word: 'the', logprob: logOf(1), alternatives: NO_ALTERNATIVES };
    return { probs: startProbs, total: allowedTotal(count), draws, fallback };
  }

  return {
    next(previous) {
      // A small integer (`| 0` keeps the value): the positions below are then taken modulo in integer
      // arithmetic; from the hash's double (a uint32 may exceed V8's small integers) each was a floating-point
      // remainder, a fifth of the draw's time (bench/HISTORY.md, thirty-eighth round).
      const start = (hash32(previous) % pool.length) | 0;
      if (starts) {
        let known = starts[start];
        if (known === undefined) {
          known = startDraw(start);
          starts[start] = known;
        }
        // The same walk as below: one random number when the temperature is above 0, whatever is allowed.
        if (temperature > 0) {
          let r = random() * known.total;
          const startProbs = known.probs;
          for (let i = 0; i < startProbs.length; i++) {
            r -= startProbs[i] as number;
            if (r <= 0) return known.draws[i] as Draw;
          }
        }
        return known.fallback;
      }
      const count = rank(start);
      let chosenWord = 'the';
      let chosenPosition = -1;
      let chosenP = 1;
      if (count > 0) {
        chosenWord = words[order[allowed[0] as number] as number] as string;
        chosenPosition = positions[order[allowed[0] as number] as number] as number;
        chosenP = probs[allowed[0] as number] as number;
      }
      if (temperature > 0) {
        let r = random() * allowedTotal(count);
        for (let i = 0; i < count; i++) {
          const at = allowed[i] as number;
          const p = probs[at] as number;
          r -= p;
          if (r <= 0) {
            chosenWord = words[order[at] as number] as string;
            chosenPosition = positions[order[at] as number] as number;
            chosenP = p;
            break;
          }
        }
      }
      if (counts) {
        // 'the' when nothing was allowed: counted where it stands in the pool (both lexicons have it).
        const at = chosenPosition >= 0 ? chosenPosition : pool.indexOf(chosenWord);
        if (at >= 0) counts[at] = (counts[at] as number) + 1;
      }
      let alternatives = NO_ALTERNATIVES;
      // Only kept when top log probabilities are asked for: 16 objects a word, held for a whole stream.
      if (withAlternatives) {
        alternatives = [];
        for (let i = 0; i < ranked; i++)
          alternatives.push({ word: words[order[i] as number] as string, logprob: logOf(probs[i] ?? 0) });
      }
      return { word: chosenWord, logprob: logOf(chosenP), alternatives };
    },
  };
}

/**
 * The words a draw picks from: the lexicon's, then the prompt's new ones; which of them the prompt has (1 at
 * their positions); and whether a draw's 16 candidates (positions `start + 7k` modulo the pool's length, k < 16)
 * are always distinct, so that the draw need not look for repeats: they are unless the length divides `7d` for
 * some d from 1 to 15.
 */
type Pool = { words: string[]; prompted: Uint8Array; distinct: boolean; key: string };

const pools = new Map<string, Pool>();

/** The pool of a lexicon and a prompt's words (remembered for repeated prompts: a bounded memo). */
function poolOf(lexicon: string[], promptWords: string[]): Pool {
  const key = `${lexicon === LEXICON ? 'L' : 'R'}${promptWords.join(' ')}`;
  const known = pools.get(key);
  if (known) return known;
  const words = [...new Set([...lexicon, ...promptWords])];
  const inPrompt = new Set(promptWords);
  const prompted = new Uint8Array(words.length);
  for (let i = 0; i < words.length; i++) if (inPrompt.has(words[i] as string)) prompted[i] = 1;
  let distinct = true;
  for (let d = 1; d < 16; d++) if ((7 * d) % words.length === 0) distinct = false;
  const pool = { words, prompted, distinct, key };
  if (pools.size >= 256) pools.clear();
  pools.set(key, pool);
  return pool;
}

function logOf(p: number): number {
  return Math.max(-100, Math.log(Math.max(p, 1e-44)));
}

/** A piece of generated text with the log probability of its first token. */
type Piece = { text: string; logprob: number; alternatives: { word: string; logprob: number }[] };

const pieceForms = new Map<string, Array<string | undefined>>();

/**
 * A drawn word as the text of its piece: after a space (every piece but an answer's first), capitalised (a
 * sentence's first), with a period (a sentence's last). The same string for the same word and form, remembered
 * per word (a bounded memo: the pools' words are few), so that the memo of the pieces' tokens looks up a string
 * whose hash V8 keeps instead of hashing a new one for every word of every answer.
 */
function pieceText(word: string, spaced: boolean, capital: boolean, period: boolean): string {
  const forms = remembered(pieceForms, 4096, word, newArray<string | undefined>);
  const form = (spaced ? 4 : 0) + (capital ? 2 : 0) + (period ? 1 : 0);
  let text = forms[form];
  if (text === undefined) {
    const shown = capital ? word.charAt(0).toUpperCase() + word.slice(1) : word;
    text = `${spaced ? ' ' : ''}${shown}${period ? '.' : ''}`;
    forms[form] = text;
  }
  return text;
}

/**
 * `words` words in sentences of 8 to 14, drawn one at a time as they are taken. Only the first `limit` are
 * drawn: an answer cut by `max_tokens` cannot send more words than tokens, and the words drawn are exactly
 * those of the full answer (the same draws in the same order; the period of the last word still goes by
 * `words`). `spaceFirst`: the first word after a space too (it follows an intro).
 *
 * At module level, as every generator function of a request's path: a generator function made per call gets
 * its own initial map, which V8 keeps in the old generation and which points back at the function and so at
 * the request's whole scope, promoting it at the next scavenge (HISTORY.md, thirteenth round).
 */
function* drawSentences(
  sampler: Sampler,
  random: () => number,
  words: number,
  limit = words,
  spaceFirst = false,
): Generator<Piece, void, undefined> {
  let previous = '';
  let inSentence = 0;
  let sentenceLength = 8 + Math.floor(random() * 7);
  const drawn = Math.min(words, limit);
  for (let i = 0; i < drawn; i++) {
    const draw = sampler.next(previous);
    previous = draw.word;
    const last = inSentence + 1 >= sentenceLength || i === words - 1;
    yield {
      text: pieceText(draw.word, i > 0 || spaceFirst, inSentence === 0, last),
      logprob: draw.logprob,
      alternatives: draw.alternatives,
    };
    inSentence = last ? 0 : inSentence + 1;
    if (last) sentenceLength = 8 + Math.floor(random() * 7);
  }
}

/**
 * The intro, then the sentences drawn one at a time (the first spaced from the intro). An iterator over the
 * sentences' generator rather than a generator of its own around it (a `yield*` is a turn of both generators
 * per piece).
 */
class IntroThenSentences implements IterableIterator<Piece, void> {
  private intro: Piece | undefined;
  private readonly rest: Generator<Piece, void, undefined>;

  constructor(intro: string, sampler: Sampler, random: () => number, words: number, limit: number) {
    this.intro = fixedPiece(intro);
    this.rest = drawSentences(sampler, random, words, limit, true);
  }

  [Symbol.iterator](): IterableIterator<Piece, void> {
    return this;
  }

  next(): IteratorResult<Piece, void> {
    const intro = this.intro;
    if (intro === undefined) return this.rest.next();
    this.intro = undefined;
    return { value: intro, done: false };
  }

  return(): IteratorResult<Piece, void> {
    this.intro = undefined;
    return this.rest.return();
  }
}

/** The same pieces, all drawn at once (for answers that are edited or searched before they are sent). */
function sentences(sampler: Sampler, random: () => number, words: number, limit = words): Piece[] {
  return [...drawSentences(sampler, random, words, limit)];
}

function promptWordsOf(messages: readonly ProviderMessage[]): string[] {
  const words = new Set<string>();
  for (const message of messages) {
    if (
      message.role !== 'user' &&
      message.role !== 'system' &&
      message.role !== 'developer' &&
      message.role !== 'tool'
    )
      continue;
    const text =
      typeof message.content === 'string'
        ? message.content
        : (message.content ?? []).map((p) => (p.type === 'text' ? p.text : '')).join(' ');
    for (const w of wordsOf(text)) words.add(w);
  }
  return [...words].slice(0, 64);
}

const textWords = new Map<string, readonly string[]>();
const NO_WORDS: readonly string[] = [];

/**
 * A text's words of four letters or more, lowercased, in order (repeats kept); remembered for texts up to 2,000
 * characters (a bounded memo: the default system prompt comes with nearly every request, and its words were
 * found again each time, with a lowercased copy of it; their strings, the same objects from then on, are
 * hashed once).
 */
function wordsOf(text: string): readonly string[] {
  const known = textWords.get(text);
  if (known) return known;
  const found: readonly string[] = text.toLowerCase().match(/[a-z]{4,}/g) ?? NO_WORDS;
  if (text.length <= 2000) {
    if (textWords.size >= 1024) textWords.clear();
    textWords.set(text, found);
  }
  return found;
}

/** How many numbered sources (`[n] title` lines inside `<sources>`) the system messages give. */
function sourceCount(messages: readonly ProviderMessage[]): number {
  let count = 0;
  for (const m of messages) {
    if (m.role !== 'system' || typeof m.content !== 'string' || !m.content.includes('<sources>')) continue;
    count = Math.max(count, (m.content.match(/^\[\d+\] /gm) ?? []).length);
  }
  return count;
}

function lastUserText(messages: readonly ProviderMessage[]): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as ProviderMessage;
    if (m.role === 'user')
      return typeof m.content === 'string'
        ? m.content
        : (m.content ?? []).map((p) => (p.type === 'text' ? p.text : '')).join(' ');
  }
  return '';
}

/** A value that fits a JSON schema, drawn from the prompt where a string is wanted. */
function valueFor(
  schema: Record<string, unknown> | undefined,
  random: () => number,
  words: string[],
  depth = 0,
): unknown {
  const type = Array.isArray(schema?.type) ? schema.type[0] : schema?.type;
  if (Array.isArray(schema?.enum) && schema.enum.length > 0) return schema.enum[0];
  if (schema?.const !== undefined) return schema.const;
  switch (type) {
    case 'integer':
      return 1 + Math.floor(random() * 100);
    case 'number':
      return Math.round(random() * 10000) / 100;
    case 'boolean':
      return true;
    case 'array':
      return depth > 4 ? [] : [valueFor(schema?.items as Record<string, unknown>, random, words, depth + 1)];
    case 'object': {
      if (depth > 4) return {};
      const properties = (schema?.properties ?? {}) as Record<string, Record<string, unknown>>;
      const required = new Set(
        Array.isArray(schema?.required) ? (schema.required as string[]) : Object.keys(properties),
      );
      const out: Record<string, unknown> = {};
      for (const [key, sub] of Object.entries(properties))
        if (required.has(key)) out[key] = valueFor(sub, random, words, depth + 1);
      return out;
    }
    default:
      return words.length > 0 ? words[Math.floor(random() * words.length)] : 'example';
  }
}

function pickTool(request: ChatProviderRequest): ProviderTool | undefined {
  const tools = request.tools ?? [];
  if (tools.length === 0 || request.toolChoice === 'none') return undefined;
  const choice = request.toolChoice ?? 'auto';
  if (typeof choice === 'object')
    return tools.find((t) => t.function.name === choice.function.name) ?? tools[0];
  const last = request.messages[request.messages.length - 1];
  // `auto`: call a function for a new user turn; after a tool result, answer in text.
  if (choice === 'auto' && last?.role !== 'user') return undefined;
  const text = lastUserText(request.messages).toLowerCase();
  return tools.find((t) => text.includes(t.function.name.toLowerCase())) ?? tools[0];
}

function isMarked(message: ProviderMessage): boolean {
  return Array.isArray(message.content) && message.content.some((p) => p.cache_control !== undefined);
}

type PromptCache = ReturnType<typeof createPromptCache>;

/** Prompt caching: prefixes ending at a `cache_control` part, remembered per model. */
function createPromptCache(capacity: number) {
  const entries = new Map<string, true>();
  return {
    /** Returns [cached tokens, tokens written] for this request, and remembers its prefixes. */
    account(model: string, messages: readonly ProviderMessage[]): [number, number] {
      // No `cache_control` part: nothing read, nothing written (and no digest to work out).
      if (!messages.some(isMarked)) return [0, 0];
      const breakpoints: { key: string; tokens: number }[] = [];
      const digest = createHash('sha256').update(model);
      let tokens = 3;
      for (const message of messages) {
        digest.update(
          JSON.stringify([message.role, message.content, message.name ?? null, message.tool_calls ?? null]),
        );
        tokens += countMessageTokens(message);
        if (isMarked(message)) breakpoints.push({ key: digest.copy().digest('hex'), tokens });
      }
      let cached = 0;
      for (const b of breakpoints) if (entries.has(b.key)) cached = Math.max(cached, b.tokens);
      const longest = breakpoints.reduce((max, b) => Math.max(max, b.tokens), 0);
      for (const b of breakpoints) {
        entries.delete(b.key);
        entries.set(b.key, true);
      }
      while (entries.size > capacity) entries.delete(entries.keys().next().value as string);
      return [cached, Math.max(0, longest - cached)];
    },
  };
}

/**
 * A token of the answer as planned. Made by a constructor, not an object literal: in two of four `perf`
 * profiles of loaded servers each literal `{ channel, token, logprob, top }` missed its store caches and was
 * turned into a dictionary (`Map::Normalize`), 8 µs a chat; a constructor's map is its function's own, and no
 * profile showed it since (bench/HISTORY.md, forty-fifth round).
 */
class PlannedToken {
  declare channel: 'content' | 'reasoning';
  declare token: number;
  declare logprob: number;
  declare top: TopLogprob[];
  constructor(channel: 'content' | 'reasoning', token: number, logprob: number, top: TopLogprob[]) {
    this.channel = channel;
    this.token = token;
    this.logprob = logprob;
    this.top = top;
  }
}

function bytesOf(text: string): number[] {
  return [...Buffer.from(text, 'utf8')];
}

const pieceTokens = new Map<string, readonly number[]>();

/**
 * The tokens of a generated piece (a word with its space and punctuation); the pieces' tokens are remembered
 * (a bounded memo of a small vocabulary: same values). The array is shared: read it, never change it.
 */
function encodePiece(text: string): readonly number[] {
  const known = pieceTokens.get(text);
  if (known) return known;
  const tokens = encodeText(text);
  if (text.length <= 64) {
    if (pieceTokens.size >= 4096) pieceTokens.clear();
    pieceTokens.set(text, tokens);
  }
  return tokens;
}

const NO_TOP: TopLogprob[] = [];

/**
 * The tokens of the pieces, with their top alternatives. Lazy: a bounded answer (`max_tokens`) tokenizes
 * only what it sends, and the alternatives are worked out only when they are asked for (`top` > 0).
 */
function* planPieces(
  pieces: Iterable<Piece>,
  channel: 'content' | 'reasoning',
  top: number,
): Generator<PlannedToken, void, undefined> {
  for (const piece of pieces) {
    const tokens = encodePiece(piece.text);
    for (let i = 0; i < tokens.length; i++) {
      const token = tokens[i] as number;
      const logprob = tokenLogprob(piece, i);
      yield new PlannedToken(channel, token, logprob, topOf(piece, i, token, logprob, top));
    }
  }
}

/** The log probability of a piece's token `i`: the draw's for its first, near certainty for the rest. */
function tokenLogprob(piece: Piece, i: number): number {
  return i === 0 ? piece.logprob : -0.0001;
}

/**
 * The `top` most likely alternatives of a piece's token `i` (none when `top` is 0): the draw's other
 * candidates for its first token, the token itself for the rest.
 */
function topOf(piece: Piece, i: number, token: number, logprob: number, top: number): TopLogprob[] {
  if (top === 0) return NO_TOP;
  const alternatives =
    i === 0
      ? piece.alternatives.map((a) => ({
          token: decodeToken(encodePiece(piece.text.startsWith(' ') ? ` ${a.word}` : a.word)[0] as number),
          logprob: a.logprob,
        }))
      : [{ token: decodeToken(token), logprob }];
  const seen = new Set<string>();
  const list = alternatives.filter((a) => !seen.has(a.token) && seen.add(a.token)).slice(0, top);
  return list.map((a) => extend(a, { bytes: bytesOf(a.token) }));
}

/** Tokens generated between two turns of the event loop when no delay is set. */
const TOKENS_PER_TURN = 16;

function fixedPiece(text: string): Piece {
  return { text, logprob: -0.0001, alternatives: [] };
}

type DeltaEvent = Extract<ChatEvent, { type: 'delta' }>;

/**
 * The deltas of one field of a choice (its content, its reasoning, a tool call's arguments). A streamed answer
 * sends each token as a delta of its own; for a caller that reads the answer whole (`ChatProviderRequest.whole`)
 * the tokens between two turns of the event loop are gathered into one delta: the same text and log
 * probabilities, from one event a turn instead of one a token (each event costs a few promises on its way: the
 * engine's generator, the service's failover, the handler's loop).
 */
class Deltas {
  private text = '';
  private tokens = 0;
  private logprobs: TokenLogprob[] | undefined;

  constructor(
    private readonly index: number,
    private readonly field: 'content' | 'reasoning' | 'arguments',
    private readonly whole: boolean,
  ) {}

  /** A token: the delta to send now (a streamed answer's), or undefined while gathering. */
  push(text: string, logprobs: TokenLogprob[] | undefined): DeltaEvent | undefined {
    this.text += text;
    this.tokens++;
    if (logprobs) {
      this.logprobs ??= [];
      for (const lp of logprobs) this.logprobs.push(lp);
    }
    return this.whole ? undefined : this.take();
  }

  /** The delta of what was gathered since the last one (at a turn's end, and the field's); undefined if none. */
  take(): DeltaEvent | undefined {
    if (this.tokens === 0) return undefined;
    const { index, text, logprobs } = this;
    this.text = '';
    this.tokens = 0;
    this.logprobs = undefined;
    if (this.field === 'arguments')
      return { type: 'delta', index, toolCalls: [{ index: 0, function: { arguments: text } }] };
    const event: DeltaEvent =
      this.field === 'content'
        ? { type: 'delta', index, content: text }
        : { type: 'delta', index, reasoning: text };
    if (logprobs) event.logprobs = logprobs;
    return event;
  }
}

/**
 * What the engine's steps yield where the event loop is to run before the next token (`pause`): the events
 * object (`EngineEvents`) waits the turn, then asks for the next step.
 */
const TURN = Symbol('turn');

/** A step of an answer: an event to hand on, or a turn of the event loop to wait. */
type Step = ChatEvent | typeof TURN;

/**
 * The event loop's turn between two tokens: what `deltas` gathered since the last turn goes first (a delta, for
 * a caller that reads the answer whole), then the turn, and the request may have been aborted meanwhile. At
 * module level, as every generator function of a request's path (see `drawSentences`).
 */
function* takeTurn(deltas: Deltas, signal: AbortLike | undefined): Generator<Step, void, undefined> {
  const gathered = deltas.take();
  if (gathered) yield gathered;
  yield TURN;
  signal?.throwIfAborted();
}

const DONE: IteratorReturnResult<undefined> = { done: true, value: undefined };

/**
 * An answer's events (`ChatProvider.stream`) over its steps: the steps are a synchronous generator, and only a
 * turn of the event loop is waited for. An async generator did the same with a promise and an await of its own
 * for every event, besides the caller's (its `yield` awaits what it yields, and each request queues its
 * result): a non-streamed chat's three or four events went through it, and its turns are rare (one per 16
 * tokens). As an async generator's, `next` runs the steps at once up to the next event, a step that throws
 * rejects it, a `next` asked for while a turn is under way comes after it, and `return` ends the steps (its
 * caller stopped reading).
 */
class EngineEvents implements AsyncIterableIterator<ChatEvent> {
  /** The event after the turn under way, if one is. */
  private waiting: Promise<IteratorResult<ChatEvent>> | undefined;

  constructor(
    private readonly steps: Generator<Step, void, undefined>,
    private readonly pause: () => Promise<void>,
  ) {}

  [Symbol.asyncIterator](): AsyncIterableIterator<ChatEvent> {
    return this;
  }

  next(): Promise<IteratorResult<ChatEvent>> {
    if (this.waiting) {
      const next = () => this.next();
      return this.waiting.then(next, next);
    }
    let step: IteratorResult<Step, void>;
    try {
      step = this.steps.next();
    } catch (error) {
      return Promise.reject(error);
    }
    if (step.value !== TURN) return Promise.resolve(step as IteratorResult<ChatEvent>);
    const after = this.pause().then(() => {
      this.waiting = undefined;
      return this.next();
    });
    this.waiting = after;
    return after;
  }

  /** Ends the steps at once (a `next()` waiting for a turn then answers `done`). */
  return(): Promise<IteratorResult<ChatEvent>> {
    this.steps.return();
    return Promise.resolve(DONE);
  }
}

export function createLocalChatEngine(options: LocalChatEngineOptions = {}): ChatProvider {
  const cache = createPromptCache(options.cacheEntries ?? 1000);
  const delay = options.tokenDelayMs ?? 0;
  const pause = () =>
    new Promise<void>((resolve) => (delay > 0 ? setTimeout(resolve, delay) : setImmediate(resolve)));
  return {
    name: 'local',
    stream: (request: ChatProviderRequest) => new EngineEvents(steps(request, cache, delay), pause),
  };
}

/**
 * The steps of an answer (EngineEvents), with the engine's prompt cache and its delay between tokens. At
 * module level, as every generator function of a request's path (see `drawSentences`).
 */
function* steps(
  request: ChatProviderRequest,
  cache: PromptCache,
  delay: number,
): Generator<Step, void, undefined> {
  const signal = request.signal;
  // With a delay, every token waits it. Without, the engine still lets the event loop run (other
  // requests, socket writes, aborts) every few tokens, not after each one: same events, fewer turns.
  // The turn is taken before the token that follows a turn's worth (`pauseDue`), not after the turn's last
  // token: an answer that ends there (its bound, its last word, a stop sequence) goes on to its finish
  // without waiting a turn (or a delay) that nothing follows.
  const perTurn = delay > 0 ? 1 : TOKENS_PER_TURN;
  /** Tokens produced since the last turn. */
  let unpaused = 0;
  const pauseDue = (): boolean => {
    if (unpaused < perTurn) return false;
    unpaused = 0;
    return true;
  };
  const promptTokens = request.promptTokens ?? countPromptTokens(request.messages, request.tools);
  const [cachedTokens, cacheCreationTokens] = cache.account(request.model, request.messages);
  const baseSeed = request.sampling.seed ?? Math.floor(Math.random() * 2 ** 31);
  const promptWords = promptWordsOf(request.messages);
  const lastUser = lastUserText(request.messages);
  const requested = /\b(\d{1,5})\s+words?\b/i.exec(lastUser);
  const topN = request.logprobs?.top ?? 0;
  // The caller reads the answer whole: each field's tokens of a turn in one delta (Deltas).
  const readWhole = request.whole === true;
  let completionTokens = 0;
  let reasoningTokens = 0;

  for (let index = 0; index < request.n; index++) {
    const random = mulberry32(baseSeed * 31 + index);
    // Length and sentence breaks follow the prompt, so a greedy draw gives one answer whatever the seed.
    const shape = mulberry32(hash32(`${lastUser}\u0000${index}`));
    const sampler = createSampler(request, random, promptWords, LEXICON, topN > 0);
    const budget = request.maxTokens;
    const plan: PlannedToken[] = [];
    const reasoning = request.reasoning;
    if (reasoning?.enabled) {
      const words = EFFORT_WORDS[reasoning.effort ?? 'medium'] ?? 40;
      const thought = sentences(
        createSampler(request, random, promptWords, REASONING_LEXICON, topN > 0),
        shape,
        words,
      );
      if (reasoning.tags) {
        plan.push(
          ...[
            ...planPieces(
              [fixedPiece('<think>\n'), ...thought, fixedPiece('\n</think>\n\n')],
              'content',
              topN,
            ),
          ].map((t) => extend(t, { channel: 'reasoning' as const })),
        );
      } else {
        plan.push(...planPieces(thought, 'reasoning', topN));
      }
    }
    const tool = pickTool(request);
    let finish: FinishReason = 'stop';
    let emitted = 0;
    // A stream's opening chunk of the choice; read whole, it would add nothing (one turn of the caller less).
    if (!readWhole) yield { type: 'delta', index, content: '' };
    // Tagged reasoning travels in `content` (the older format); the domain may strip it.
    const thinking = new Deltas(index, reasoning?.tags ? 'content' : 'reasoning', readWhole);
    // Reasoning first, within the bound.
    for (const planned of plan) {
      if (emitted >= budget) break;
      signal?.throwIfAborted();
      if (pauseDue()) yield* takeTurn(thinking, signal);
      const text = decodeToken(planned.token);
      emitted++;
      reasoningTokens++;
      unpaused++;
      const lp =
        topN || request.logprobs
          ? [{ token: text, logprob: planned.logprob, bytes: bytesOf(text), top_logprobs: planned.top }]
          : undefined;
      const delta = thinking.push(text, lp);
      if (delta) yield delta;
    }
    const thought = thinking.take();
    if (thought) yield thought;
    if (plan.length > 0 && emitted >= budget) finish = 'length';
    if (finish !== 'length' && tool) {
      const args = JSON.stringify(
        valueFor(tool.function.parameters ?? { type: 'object' }, random, promptWords),
      );
      const id = `call_${Math.floor(random() * 2 ** 32)
        .toString(16)
        .padStart(8, '0')}${Math.floor(random() * 2 ** 32)
        .toString(16)
        .padStart(8, '0')}`;
      yield {
        type: 'delta',
        index,
        toolCalls: [
          { index: 0, id, type: 'function', function: { name: tool.function.name, arguments: '' } },
        ],
      };
      emitted += countTokens(tool.function.name);
      const argued = new Deltas(index, 'arguments', readWhole);
      for (const token of encodeText(args)) {
        signal?.throwIfAborted();
        if (emitted >= budget) {
          finish = 'length';
          break;
        }
        if (pauseDue()) yield* takeTurn(argued, signal);
        emitted++;
        unpaused++;
        const delta = argued.push(decodeToken(token), undefined);
        if (delta) yield delta;
      }
      const lastArguments = argued.take();
      if (lastArguments) yield lastArguments;
      if (finish !== 'length') finish = 'tool_calls';
    } else if (finish !== 'length') {
      const toolResult = request.messages[request.messages.length - 1]?.role === 'tool';
      const words = requested ? Math.min(20_000, Number(requested[1])) : 24 + Math.floor(shape() * 40);
      const intro = toolResult ? `${LOCAL_PREFIX} Based on the tool result:` : LOCAL_PREFIX;
      const sources = sourceCount(request.messages);
      // The intro and `budget` words hold more than `budget` tokens: nothing after them can be sent. With
      // sources (the last sentence gets a citation) or stop sequences (one may straddle the cut) the whole
      // answer is drawn.
      const whole = sources > 0 || (request.sampling.stop?.length ?? 0) > 0;
      let pieces: Iterable<Piece>;
      // Stop sequences cut the answer where they first occur; nothing at or after the cut is sent.
      let cut = Number.POSITIVE_INFINITY;
      if (whole) {
        const body = sentences(sampler, shape, words);
        // Given numbered sources, it cites them the way many models do, in brackets: `[1]`, `[1][2]`.
        if (sources > 0) {
          const firstEnd = body.find((p) => p.text.endsWith('.'));
          const lastPiece = body[body.length - 1];
          if (firstEnd) firstEnd.text = firstEnd.text.replace(/\.$/, ' [1].');
          if (lastPiece && lastPiece !== firstEnd && sources > 1)
            lastPiece.text = lastPiece.text.replace(/\.$/, ' [1][2].');
        }
        const first = body[0];
        if (first) first.text = ` ${first.text}`;
        pieces = [fixedPiece(intro), ...body];
        const full = (pieces as Piece[]).map((p) => p.text).join('');
        cut = Math.min(
          full.length,
          ...(request.sampling.stop ?? []).map((s) => full.indexOf(s)).filter((i) => i >= 0),
        );
      } else {
        // Drawn as they are sent (a stream holds one word at a time, not its whole answer).
        pieces = new IntroThenSentences(intro, sampler, shape, words, budget + 1);
      }
      let sent = 0;
      const said = new Deltas(index, 'content', readWhole);
      // Piece by piece, then token by token (as planPieces plans them, without an object and a generator's
      // turn per token: the answer's text is most of its tokens).
      content: for (const piece of pieces) {
        const tokens = encodePiece(piece.text);
        for (let i = 0; i < tokens.length; i++) {
          signal?.throwIfAborted();
          if (emitted >= budget) {
            finish = 'length';
            break content;
          }
          const room = cut - sent;
          if (room <= 0) break content;
          if (pauseDue()) yield* takeTurn(said, signal);
          const token = tokens[i] as number;
          let text = decodeToken(token);
          const partial = text.length > room;
          if (partial) text = text.slice(0, room);
          sent += text.length;
          emitted += partial ? encodeText(text).length : 1;
          unpaused++;
          let lp: TokenLogprob[] | undefined;
          if (request.logprobs) {
            const logprob = tokenLogprob(piece, i);
            const top = topOf(piece, i, token, logprob, topN);
            lp = [{ token: text, logprob, bytes: bytesOf(text), top_logprobs: top }];
          }
          const delta = said.push(text, lp);
          if (delta) yield delta;
          if (partial) break content;
        }
      }
      const lastSaid = said.take();
      if (lastSaid) yield lastSaid;
    }
    completionTokens += emitted;
    yield { type: 'finish', index, reason: finish };
  }
  yield {
    type: 'usage',
    usage: { promptTokens, completionTokens, reasoningTokens, cachedTokens, cacheCreationTokens },
  };
}
