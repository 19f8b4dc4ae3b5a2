/**
 * The chat provider port: what the chat domain asks of any model backend (the embedded local engine, an
 * OpenAI-compatible upstream). A provider turns one normalised request into a stream of events: pieces of
 * each choice, the end of each choice, and the token usage of the whole request. Failures are thrown as
 * `ChatProviderError` with a kind the domain maps to the interface's statuses.
 */

import type { AbortLike } from '../../http/request-abort.ts';

export type ChatRole = 'system' | 'developer' | 'user' | 'assistant' | 'tool';

/** A content part after the domain converted files to text; images, audio and video pass as they came. */
export type ProviderContentPart =
  | { type: 'text'; text: string; cache_control?: { type: 'ephemeral'; ttl?: string } }
  | { type: 'image_url'; image_url: { url: string; detail?: string }; cache_control?: unknown }
  | { type: 'input_audio'; input_audio: { data: string; format?: string }; cache_control?: unknown }
  | { type: 'video_url'; video_url: { url: string }; cache_control?: unknown };

export type ProviderToolCall = {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
};

export type ProviderMessage = {
  role: ChatRole;
  content: string | ProviderContentPart[] | null;
  name?: string;
  tool_calls?: ProviderToolCall[];
  tool_call_id?: string;
  /** Fields a reasoning model asks to have sent back unchanged (`reasoning_details`, `thought_signature`…). */
  extra?: Record<string, unknown>;
};

export type ProviderTool = {
  type: 'function';
  function: {
    name: string;
    description?: string;
    parameters?: Record<string, unknown>;
    strict?: boolean | null;
  };
};

export type ProviderToolChoice =
  | 'none'
  | 'auto'
  | 'required'
  | { type: 'function'; function: { name: string } };

export type SamplingOptions = {
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  min_temp?: number;
  max_temp?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
  repetition_penalty?: number;
  seed?: number;
  stop?: string[];
  stop_token_ids?: number[];
};

export type ChatProviderRequest = {
  /** The model name the backend knows (the catalogue id, or the upstream's own name). */
  model: string;
  messages: ProviderMessage[];
  /** Bound on generated tokens per choice, visible and reasoning together. */
  maxTokens: number;
  n: number;
  sampling: SamplingOptions;
  tools?: ProviderTool[];
  toolChoice?: ProviderToolChoice;
  parallelToolCalls?: boolean;
  logprobs?: { top: number };
  /** Reasoning: `off` asks the model not to think; `effort` scales how long it thinks. */
  reasoning?: { enabled: boolean; effort?: string; tags: boolean };
  responseFormat?: unknown;
  promptCacheKey?: string;
  /** Request fields the interface does not list, passed through to upstreams as they came. */
  passthrough?: Record<string, unknown>;
  /**
   * The prompt's tokens (these messages and tools) by our tokenizer, when the caller counted them already: a
   * backend that reports our count (the local engine, an upstream that reports no usage) takes it instead of
   * counting the same prompt again.
   */
  promptTokens?: number;
  /**
   * The caller reads the answer whole (a request that is not streamed): a delta may then carry several tokens,
   * as the local engine sends those of one turn of the event loop. A streamed answer's deltas are one token each.
   */
  whole?: boolean;
  /** The request's abort (an `AbortSignal` will do); what a backend hands on to an API that wants a signal is its own. */
  signal?: AbortLike;
  /**
   * Told by a provider that calls an upstream once its request is on its way, with what cancels that call:
   * what its caller does during the upstream's wait starts then (the chat's hold made ahead, ChatService).
   * Providers without a call (the local engine) never call it.
   */
  started?(cancel: () => void): void;
};

export type TopLogprob = { token: string; logprob: number; bytes: number[] };
export type TokenLogprob = TopLogprob & { top_logprobs: TopLogprob[] };

export type ToolCallDelta = {
  index: number;
  id?: string;
  type?: 'function';
  function?: { name?: string; arguments?: string };
};

export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter';

export type ProviderUsage = {
  promptTokens: number;
  completionTokens: number;
  reasoningTokens: number;
  /** Prompt tokens read from the prompt cache. */
  cachedTokens: number;
  /** Prompt tokens written to the prompt cache. */
  cacheCreationTokens: number;
};

export type ChatEvent =
  | {
      type: 'delta';
      index: number;
      content?: string;
      reasoning?: string;
      toolCalls?: ToolCallDelta[];
      logprobs?: TokenLogprob[];
    }
  | { type: 'finish'; index: number; reason: FinishReason }
  | { type: 'usage'; usage: ProviderUsage };

export type ChatProvider = {
  /** Stable backend name (the `x-service-model-router` header). */
  readonly name: string;
  /**
   * Runs the request. The iterator ends after the `usage` event; it throws `ChatProviderError` on failure,
   * also part-way through. Aborting `request.signal` stops the backend's work.
   */
  stream(request: ChatProviderRequest): AsyncIterable<ChatEvent>;
};

/**
 * - `bad_request`: the backend refused the request itself (400 with its message)
 * - `capacity`: overloaded or rate-limited (503)
 * - `timeout`: no answer in time (504)
 * - `failed`: any other failure, including a stream cut short (500)
 */
export type ChatProviderErrorKind = 'bad_request' | 'capacity' | 'timeout' | 'failed';

export class ChatProviderError extends Error {
  override readonly name = 'ChatProviderError';
  readonly kind: ChatProviderErrorKind;
  /** Seconds after which a retry may succeed (from an upstream `Retry-After`). */
  readonly retryAfter: number | undefined;
  constructor(
    kind: ChatProviderErrorKind,
    message: string,
    options: { cause?: unknown; retryAfter?: number } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.kind = kind;
    this.retryAfter = options.retryAfter;
  }
}
