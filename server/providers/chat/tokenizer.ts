/**
 * Token counting with a real BPE tokenizer (`o200k_base`, the encoding of current OpenAI models, from
 * `gpt-tokenizer`). The local engine counts its usage with it; the chat domain uses it to size reservations
 * and to bill what an interrupted stream had produced.
 *
 * The ranks are read from the package's `o200k_base.tiktoken` data file rather than imported from its
 * generated JavaScript module (`gpt-tokenizer/encoding/o200k_base`): the same 200,000 ranks (a unit test
 * compares them entry by entry), but V8 keeps the source text of every module for the life of the process,
 * and that module is a 2.2 MB array literal (3.7 MB as a string, plus its compiled constants, and a start-up
 * peak of several times that while it is parsed). The data file's buffer is dropped once it is read.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { GptEncoding } from 'gpt-tokenizer/GptEncoding';
import type { ProviderMessage, ProviderTool } from './types.ts';

const utf8 = new TextDecoder('utf8', { fatal: true });

/**
 * The mergeable ranks of `o200k_base`, as `gpt-tokenizer`'s generated module holds them: index = rank, the
 * token as a string when its bytes are valid UTF-8 (and re-encode to the same bytes), else its bytes; ranks
 * absent from the file stay holes.
 */
export function loadO200kRanks(): (string | number[])[] {
  const path = createRequire(import.meta.url).resolve('gpt-tokenizer/data/o200k_base.tiktoken');
  const ranks: (string | number[])[] = [];
  for (const line of readFileSync(path, 'latin1').split('\n')) {
    if (!line) continue;
    const space = line.indexOf(' ');
    const bytes = Buffer.from(line.slice(0, space), 'base64');
    const rank = Number.parseInt(line.slice(space + 1), 10);
    let token: string | number[];
    try {
      token = utf8.decode(bytes);
      if (Buffer.byteLength(token, 'utf8') !== bytes.length) token = [...bytes];
    } catch {
      token = [...bytes];
    }
    ranks[rank] = token;
  }
  return ranks;
}

/** The ranks the encoding decodes with (the library's own table, referenced, not copied). */
let ranks: readonly (string | number[])[] = [];
const encoding = GptEncoding.getEncodingApi('o200k_base', () => {
  ranks = loadO200kRanks();
  return ranks as (string | number[])[];
});
const { decode, encode } = encoding;

/**
 * Special tokens are plain text here (`<|endoftext|>` in a prompt is counted as the text it is): one options
 * object for every call (the library reads the sets and keeps nothing of them).
 */
const PLAIN_TEXT = Object.freeze({ allowedSpecial: new Set<string>(), disallowedSpecial: new Set<string>() });

/** Tokens of a text. */
export function encodeText(text: string): number[] {
  return encode(text, PLAIN_TEXT);
}

/** How many tokens `encodeText` would give (the library's count, without building the array). */
export function countTokens(text: string): number {
  return text ? encoding.countTokens(text, PLAIN_TEXT) : 0;
}

export function decodeTokens(tokens: readonly number[]): string {
  return decode(tokens);
}

/**
 * The text of one token, as `decodeTokens([token])` gives it: a token whose bytes are UTF-8 text is its
 * rank's string (what the library returns for it, with no decoder in between); any other token (a part of a
 * character, a special token) goes through the library, whose streaming decoder carries partial bytes over.
 */
export function decodeToken(token: number): string {
  const text = ranks[token];
  return typeof text === 'string' ? text : decode([token]);
}

/**
 * Token counts of prompt texts, remembered: a multi-turn chat resends its whole history every turn and
 * system prompts and tool definitions repeat, and the same prompt is counted by the domain (to reserve) and
 * by the local engine (to report usage). A count is a pure function of the text, so a remembered count is
 * the count. Bounded both ways: at most `entries` texts and `bytes` of text (UTF-16, two bytes a unit);
 * texts longer than `maxTextBytes` are never kept; the least recently used go first.
 */
export function createTokenCountCache(limits: { entries: number; bytes: number; maxTextBytes: number }) {
  const counts = new Map<string, number>();
  let bytes = 0;
  return {
    count(text: string): number {
      if (!text) return 0;
      const known = counts.get(text);
      if (known !== undefined) {
        // Most recently used last (Map order is insertion order).
        counts.delete(text);
        counts.set(text, known);
        return known;
      }
      const value = countTokens(text);
      const size = text.length * 2;
      if (size > limits.maxTextBytes) return value;
      counts.set(text, value);
      bytes += size;
      while (counts.size > limits.entries || bytes > limits.bytes) {
        const oldest = counts.keys().next().value as string;
        counts.delete(oldest);
        bytes -= oldest.length * 2;
      }
      return value;
    },
    /** Entries and bytes held (for tests). */
    size(): { entries: number; bytes: number } {
      return { entries: counts.size, bytes };
    },
  };
}

/** The process's prompt-text counts: 4,096 texts and 4 MiB at most, none over 256 KiB. */
const promptCounts = createTokenCountCache({
  entries: 4096,
  bytes: 4 * 1024 * 1024,
  maxTextBytes: 256 * 1024,
});

/** `countTokens` for prompt texts (messages, names, roles, tool definitions), through the bounded cache. */
export function countPromptTextTokens(text: string): number {
  return promptCounts.count(text);
}

/** What an image, audio clip or video costs in prompt tokens (a flat estimate, as OpenAI's low detail). */
export const MEDIA_PART_TOKENS = 85;

/** Per-message framing (role and separators), as in OpenAI's chat format. */
const MESSAGE_OVERHEAD = 3;
/** Tokens that prime the assistant's reply. */
const REPLY_PRIMING = 3;

/** The text of one message as the model reads it (media parts excluded). */
export function messageText(message: ProviderMessage): string {
  const content =
    typeof message.content === 'string'
      ? message.content
      : (message.content ?? []).map((part) => (part.type === 'text' ? part.text : '')).join('\n');
  const toolCalls = message.tool_calls;
  if (!toolCalls || toolCalls.length === 0) return content;
  const calls = toolCalls.map((c) => `${c.function.name}(${c.function.arguments})`).join('\n');
  return calls ? `${content}\n${calls}` : content;
}

/** Tokens of one message, framing included. */
export function countMessageTokens(message: ProviderMessage): number {
  const media = Array.isArray(message.content)
    ? message.content.filter((part) => part.type !== 'text').length * MEDIA_PART_TOKENS
    : 0;
  return (
    MESSAGE_OVERHEAD +
    countPromptTextTokens(message.role) +
    countPromptTextTokens(messageText(message)) +
    media +
    (message.name ? countPromptTextTokens(message.name) + 1 : 0)
  );
}

/** Prompt tokens of a request: every message, the tool definitions and the reply priming. */
export function countPromptTokens(
  messages: readonly ProviderMessage[],
  tools?: readonly ProviderTool[],
): number {
  let total = REPLY_PRIMING;
  for (const message of messages) total += countMessageTokens(message);
  if (tools && tools.length > 0) total += countPromptTextTokens(JSON.stringify(tools));
  return total;
}
