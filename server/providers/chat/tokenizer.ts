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

const { decode, encode } = GptEncoding.getEncodingApi('o200k_base', loadO200kRanks);

/** Tokens of a text. */
export function encodeText(text: string): number[] {
  return encode(text, { allowedSpecial: new Set(), disallowedSpecial: new Set() });
}

export function countTokens(text: string): number {
  return text ? encodeText(text).length : 0;
}

export function decodeTokens(tokens: readonly number[]): string {
  return decode(tokens);
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
  const calls = (message.tool_calls ?? [])
    .map((c) => `${c.function.name}(${c.function.arguments})`)
    .join('\n');
  return calls ? `${content}\n${calls}` : content;
}

/** Tokens of one message, framing included. */
export function countMessageTokens(message: ProviderMessage): number {
  const media = Array.isArray(message.content)
    ? message.content.filter((part) => part.type !== 'text').length * MEDIA_PART_TOKENS
    : 0;
  return (
    MESSAGE_OVERHEAD +
    countTokens(message.role) +
    countTokens(messageText(message)) +
    media +
    (message.name ? countTokens(message.name) + 1 : 0)
  );
}

/** Prompt tokens of a request: every message, the tool definitions and the reply priming. */
export function countPromptTokens(
  messages: readonly ProviderMessage[],
  tools?: readonly ProviderTool[],
): number {
  let total = REPLY_PRIMING;
  for (const message of messages) total += countMessageTokens(message);
  if (tools && tools.length > 0) total += countTokens(JSON.stringify(tools));
  return total;
}
