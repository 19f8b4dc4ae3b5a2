/**
 * Token counting with a real BPE tokenizer (`o200k_base`, the encoding of current OpenAI models, from
 * `gpt-tokenizer`). The local engine counts its usage with it; the chat domain uses it to size reservations
 * and to bill what an interrupted stream had produced.
 */
import { decode, encode } from 'gpt-tokenizer/encoding/o200k_base';
import type { ProviderMessage, ProviderTool } from './types.ts';

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
