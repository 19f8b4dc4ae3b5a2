/**
 * The OpenAI-compatible upstream adapter: sends the request to `<baseUrl>/chat/completions` (always streamed,
 * with `stream_options.include_usage`, so usage arrives and nothing waits for a whole answer), passes the
 * pieces through as they come, and takes usage from the upstream. The upstream is distrusted: a time limit
 * on the answer's start and on every pause, a cap on the bytes read, a check of each chunk's shape, and a
 * stream that ends without `[DONE]` is a failure, never a clean end. HTTP failures map to the provider error
 * kinds (429/503 capacity, 408/504 timeout, 400/404/422 the upstream's refusal, the rest failed).
 */
import { createSseParser, type SseEvent } from '../../../client/sse.ts';
import { redactSecret, redactUrl, type UpstreamAdapterOptions, upstreamError } from '../http.ts';
import {
  dispatchPost,
  fetchPost,
  readAnswerCapped,
  type UpstreamAnswer,
  type UpstreamCall,
} from '../upstream-post.ts';
import { countPromptTokens, countTokens } from './tokenizer.ts';
import {
  type ChatEvent,
  type ChatProvider,
  ChatProviderError,
  type ChatProviderRequest,
  type FinishReason,
  type TokenLogprob,
  type ToolCallDelta,
} from './types.ts';

export type OpenAiCompatibleOptions = UpstreamAdapterOptions;

const FINISH = new Set(['stop', 'length', 'tool_calls', 'content_filter']);

type UpstreamChunk = {
  choices?: {
    index?: number;
    delta?: { content?: string | null; reasoning_content?: string | null; tool_calls?: ToolCallDelta[] };
    finish_reason?: string | null;
    logprobs?: { content?: TokenLogprob[] | null } | null;
  }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    completion_tokens_details?: { reasoning_tokens?: number } | null;
    prompt_tokens_details?: { cached_tokens?: number; cache_creation_input_tokens?: number } | null;
  } | null;
  error?: { message?: string; code?: string | null; type?: string };
};

export function createOpenAiCompatibleProvider(options: OpenAiCompatibleOptions): ChatProvider {
  const post = options.fetch ? fetchPost(options.fetch) : dispatchPost;
  const maxBytes = options.maxBytes ?? 16 * 1024 * 1024;
  const endpoint = `${options.baseUrl.replace(/\/+$/, '')}/chat/completions`;

  return {
    name: options.name,
    async *stream(request: ChatProviderRequest): AsyncGenerator<ChatEvent> {
      const started = performance.now();
      let outcome = 'ok';
      let call: UpstreamCall | undefined;
      let timedOut = false;
      let timeout: NodeJS.Timeout | undefined;
      // One timer for the whole answer, pushed back at every event (not a new timer per event).
      const arm = () => {
        if (timeout) timeout.refresh();
        else
          timeout = setTimeout(() => {
            timedOut = true;
            call?.cancel();
          }, options.timeoutMs);
      };
      // The client leaving cancels the upstream call too (a listener, not a signal of our own: see UpstreamCall).
      const onClientGone = () => call?.cancel();
      // The caller may end the call it was told of (`started`): counted as `cancelled`, not as a failure.
      const onSent = request.started;
      let withdrawn = false;
      request.signal?.addEventListener('abort', onClientGone, { once: true });
      const fail = (
        kind: ChatProviderError['kind'],
        message: string,
        extra: { cause?: unknown; retryAfter?: number } = {},
      ) => {
        outcome = kind;
        return new ChatProviderError(kind, message, extra);
      };
      const translate = (error: unknown): unknown => {
        if (error instanceof ChatProviderError) return error;
        if (withdrawn) {
          outcome = 'cancelled';
          return error;
        }
        if (request.signal?.aborted) {
          outcome = 'client_abort';
          return error;
        }
        if (timedOut)
          return fail('timeout', `Upstream ${options.name} did not answer within ${options.timeoutMs} ms`, {
            cause: error,
          });
        return fail(
          'failed',
          `Upstream ${options.name} (${redactUrl(endpoint)}) failed: ${(error as Error)?.message ?? error}`,
          { cause: error },
        );
      };
      // Object.assign, not a literal starting with a spread: see server/objects.ts.
      const body: Record<string, unknown> = Object.assign(
        {},
        request.passthrough,
        {
          model: options.upstreamModel,
          messages: request.messages.map(({ extra, ...m }) => Object.assign({}, extra, m)),
          max_completion_tokens: request.maxTokens,
          n: request.n,
        },
        request.sampling,
        { stream: true, stream_options: { include_usage: true } },
      );
      if (request.tools?.length) body.tools = request.tools;
      if (request.toolChoice) body.tool_choice = request.toolChoice;
      if (request.parallelToolCalls !== undefined && request.tools?.length)
        body.parallel_tool_calls = request.parallelToolCalls;
      if (request.logprobs) {
        body.logprobs = true;
        if (request.logprobs.top > 0) body.top_logprobs = request.logprobs.top;
      }
      if (request.reasoning?.enabled && request.reasoning.effort)
        body.reasoning_effort = request.reasoning.effort;
      if (request.responseFormat) body.response_format = request.responseFormat;
      if (request.promptCacheKey) body.prompt_cache_key = request.promptCacheKey;

      let text = '';
      let usage: ChatEvent | undefined;
      const finished = new Set<number>();
      let response: UpstreamAnswer | undefined;
      let done = false;
      try {
        arm();
        try {
          call = post(endpoint, {
            headers: {
              'content-type': 'application/json',
              accept: 'text/event-stream',
              ...(options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}),
            },
            body: JSON.stringify(body),
            ...(onSent
              ? {
                  onSent: () =>
                    onSent(() => {
                      withdrawn = true;
                      call?.cancel();
                    }),
                }
              : {}),
          });
          if (request.signal?.aborted) call.cancel();
          response = await call.answer;
        } catch (error) {
          throw translate(error);
        }
        if (response.status !== 200) {
          const detail = await readAnswerCapped(response, 64 * 1024, { truncate: true })
            .then((bytes) => bytes?.toString('utf8') ?? '')
            .catch(() => '');
          const message = redactSecret(
            upstreamError(detail).message ?? `status ${response.status}`,
            options.apiKey,
          );
          const retry = Number(response.header('retry-after'));
          const retryAfter = Number.isFinite(retry) && retry > 0 ? retry : undefined;
          if (response.status === 429 || response.status === 503 || response.status === 529)
            throw fail('capacity', `Upstream ${options.name} is at capacity: ${message}`, { retryAfter });
          if (response.status === 408 || response.status === 504)
            throw fail('timeout', `Upstream ${options.name} timed out: ${message}`);
          if (response.status === 400 || response.status === 404 || response.status === 422)
            throw fail('bad_request', message);
          throw fail('failed', `Upstream ${options.name} answered ${response.status}: ${message}`);
        }
        if (!(response.header('content-type') ?? '').includes('text/event-stream'))
          throw fail('failed', `Upstream ${options.name} did not answer with an event stream`);
        // The body's chunks read here, and each chunk's events handled in one go (createSseParser): no
        // generator between the socket and this loop, so no promise per event before the one the caller awaits.
        const parser = createSseParser();
        const reader = response.body[Symbol.asyncIterator]();
        let bytes = 0;
        reading: for (;;) {
          arm();
          let read: IteratorResult<Uint8Array>;
          try {
            read = await reader.next();
          } catch (error) {
            throw translate(error);
          }
          let events: Iterable<SseEvent>;
          if (read.done) events = parser.end();
          else {
            bytes += read.value.byteLength;
            if (bytes > maxBytes)
              throw fail('failed', `Upstream ${options.name} answer exceeds ${maxBytes} bytes`);
            events = parser.push(read.value);
          }
          for (const { data } of events) {
            // Pushed back at every event too, as the caller may take its time over each.
            arm();
            if (data === '[DONE]') {
              done = true;
              break reading;
            }
            let chunk: UpstreamChunk;
            try {
              chunk = JSON.parse(data) as UpstreamChunk;
            } catch (error) {
              throw fail('failed', `Upstream ${options.name} sent an event that is not JSON`, {
                cause: error,
              });
            }
            if (chunk.error) {
              const code = chunk.error.code ?? '';
              throw fail(
                /overload|capacity|rate/.test(code) ? 'capacity' : 'failed',
                `Upstream ${options.name}: ${chunk.error.message ?? 'error in stream'}`,
              );
            }
            if (chunk.usage) {
              const u = chunk.usage;
              usage = {
                type: 'usage',
                usage: {
                  promptTokens: u.prompt_tokens ?? 0,
                  completionTokens: u.completion_tokens ?? 0,
                  reasoningTokens: u.completion_tokens_details?.reasoning_tokens ?? 0,
                  cachedTokens: u.prompt_tokens_details?.cached_tokens ?? 0,
                  cacheCreationTokens: u.prompt_tokens_details?.cache_creation_input_tokens ?? 0,
                },
              };
            }
            if (chunk.choices !== undefined && !Array.isArray(chunk.choices))
              throw fail('failed', `Upstream ${options.name} sent a malformed chunk`);
            for (const choice of chunk.choices ?? []) {
              const index = Number.isInteger(choice.index) ? (choice.index as number) : 0;
              const delta = choice.delta ?? {};
              const event: ChatEvent = { type: 'delta', index };
              if (typeof delta.content === 'string') event.content = delta.content;
              if (typeof delta.reasoning_content === 'string') event.reasoning = delta.reasoning_content;
              if (Array.isArray(delta.tool_calls) && delta.tool_calls.length > 0)
                event.toolCalls = delta.tool_calls;
              if (Array.isArray(choice.logprobs?.content)) event.logprobs = choice.logprobs.content;
              text +=
                (event.content ?? '') +
                (event.reasoning ?? '') +
                (event.toolCalls ?? [])
                  .map((t) => `${t.function?.name ?? ''}${t.function?.arguments ?? ''}`)
                  .join('');
              if (
                event.content !== undefined ||
                event.reasoning !== undefined ||
                event.toolCalls ||
                event.logprobs
              )
                yield event;
              if (choice.finish_reason) {
                const reason = (
                  FINISH.has(choice.finish_reason) ? choice.finish_reason : 'stop'
                ) as FinishReason;
                finished.add(index);
                yield { type: 'finish', index, reason };
              }
            }
          }
          if (read.done) break;
        }
        if (!done)
          throw fail(
            'failed',
            `Upstream ${options.name} stream ended without its terminator (truncated answer)`,
          );
        for (let index = 0; index < request.n; index++)
          if (!finished.has(index)) yield { type: 'finish', index, reason: 'stop' };
        // An upstream that reports no usage is counted with our tokenizer rather than billed as zero.
        yield usage ?? {
          type: 'usage',
          usage: {
            promptTokens: request.promptTokens ?? countPromptTokens(request.messages, request.tools),
            completionTokens: countTokens(text),
            reasoningTokens: 0,
            cachedTokens: 0,
            cacheCreationTokens: 0,
          },
        };
      } catch (error) {
        if (outcome === 'ok') outcome = request.signal?.aborted ? 'client_abort' : 'failed';
        throw error;
      } finally {
        const finish = () => {
          clearTimeout(timeout);
          request.signal?.removeEventListener('abort', onClientGone);
          options.observe?.(outcome, (performance.now() - started) / 1000);
        };
        if (done && response) {
          // After `[DONE]` the rest (the chunked body's last marker, at least one tick away) is drained and the
          // connection kept, still under the timer and the client's signal, without the events' reader waiting
          // for it: the answer's final frames leave with its others (one socket write when the upstream's
          // answer came in one read, instead of two), and do not wait for an upstream slow to end its body.
          void response.release(true).then(finish, finish);
        } else {
          // Otherwise the connection is dropped.
          await response?.release(false);
          finish();
        }
      }
    },
  };
}
