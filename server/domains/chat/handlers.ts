/**
 * `POST /chat/completions`: a `chat.completion` JSON answer, or a Server-Sent Events stream of
 * `chat.completion.chunk` events that ends with a `choices: []` chunk carrying `usage` and `cost`, then
 * `data: [DONE]`. The stream's headers are sent only once the backend produced its first event, so failures
 * before that still get their HTTP status; failures after it are an in-band `{"error": …}` event then
 * `[DONE]`. A client that goes away stops the backend and is billed for what had been produced.
 */
import type { ServerResponse } from 'node:http';
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionLogprobs,
  ChatCompletionRequest,
  ChatToolCall,
} from '../../../generated/api.d.ts';
import type { HandlerGroups } from '../../handlers.ts';
import type { Principal } from '../../http/auth.ts';
import type { HandlerContext, ReplyHeaders } from '../../http/contract.ts';
import { ApiError } from '../../http/errors.ts';
import type { AbortLike } from '../../http/request-abort.ts';
import { extend } from '../../objects.ts';
import type {
  ChatEvent,
  FinishReason,
  ProviderUsage,
  TokenLogprob,
  ToolCallDelta,
} from '../../providers/chat/types.ts';
import { hashRequestBody, type IdempotencyStore } from '../../storage/idempotency.ts';
import { openEventStream } from './event-stream.ts';
import { echoOptions } from './options.ts';
import {
  type ChatService,
  MESSAGES,
  type PreparedChat,
  type Settlement,
  streamErrorBody,
  toApiError,
} from './service.ts';
import { createThinkStripper, type ThinkStripper } from './think.ts';
import { createCitationRewriter, rewriteCitations } from './web/citations.ts';
import { searchDocumentsToolCall, webSearchCitations } from './web/documents.ts';

export type ChatHandlersDeps = {
  chat: ChatService;
  /** `Idempotency-Key` on non-streamed requests; absent: the header is ignored. */
  idempotency?: IdempotencyStore;
  /** Longest a non-streamed request may run before it is answered with 504 (streams are not limited). */
  timeoutMs: number;
};

type ChoiceState = {
  content: string;
  reasoning: string;
  toolCalls: ChatToolCall[];
  logprobs: TokenLogprob[];
  finish?: FinishReason;
  started: boolean;
  stripper?: ThinkStripper;
};

function usageBody(usage: ProviderUsage): ChatCompletion['usage'] {
  return {
    prompt_tokens: usage.promptTokens,
    completion_tokens: usage.completionTokens,
    total_tokens: usage.promptTokens + usage.completionTokens,
    completion_tokens_details: { reasoning_tokens: usage.reasoningTokens },
    prompt_tokens_details: {
      cached_tokens: usage.cachedTokens,
      cache_creation_input_tokens: usage.cacheCreationTokens,
    },
  };
}

function logprobsBody(tokens: TokenLogprob[]): ChatCompletionLogprobs | null {
  const first = tokens[0];
  if (!first) return null;
  return {
    token: first.token,
    logprob: first.logprob,
    bytes: first.bytes,
    top_logprobs: first.top_logprobs,
    content: tokens,
  };
}

/** Applies one tool-call fragment to the calls of a choice. */
function mergeToolCall(
  calls: ChatToolCall[],
  delta: NonNullable<Extract<ChatEvent, { type: 'delta' }>['toolCalls']>[number],
) {
  const existing = calls[delta.index];
  if (!existing) {
    calls[delta.index] = {
      id: delta.id ?? `call_${delta.index}`,
      type: 'function',
      function: { name: delta.function?.name ?? '', arguments: delta.function?.arguments ?? '' },
    };
    return;
  }
  if (delta.function?.name) existing.function.name += delta.function.name;
  if (delta.function?.arguments) existing.function.arguments += delta.function.arguments;
}

/** Whether think blocks are removed from `content` (older tag format) and reasoning dropped (field format). */
function visibility(prepared: PreparedChat) {
  const o = prepared.options;
  const strip = prepared.model.reasoning && (o.strip_thinking_response || o.disable_thinking);
  return { stripTags: strip, dropReasoning: prepared.model.reasoning && o.disable_thinking };
}

/** The echo, with the sources when a web search ran. */
function echoOf(prepared: PreparedChat) {
  const results = prepared.searchResults;
  return echoOptions(prepared.options, results ? webSearchCitations(results) : undefined);
}

/** `^n^` citations: only with `enable_web_citations` and sources to cite. */
function citationSources(prepared: PreparedChat): number | undefined {
  const n = prepared.searchResults?.length ?? 0;
  return prepared.options.enable_web_citations && n > 0 ? n : undefined;
}

/** The `service_web_search_documents` call of `return_search_results_as_documents`. */
function documentsCall(prepared: PreparedChat): ChatToolCall | undefined {
  const results = prepared.searchResults;
  return prepared.options.return_search_results_as_documents && results
    ? searchDocumentsToolCall(results)
    : undefined;
}

/** The streamed text pipeline of one choice: think blocks out, then citations rewritten. */
function textFilter(prepared: PreparedChat, stripTags: boolean): ThinkStripper | undefined {
  const stripper = stripTags ? createThinkStripper() : undefined;
  const sources = citationSources(prepared);
  const citations = sources ? createCitationRewriter({ sources }) : undefined;
  if (!stripper && !citations) return undefined;
  return {
    push: (text) => {
      const visible = stripper ? stripper.push(text) : text;
      return citations ? citations.push(visible) : visible;
    },
    flush: () => {
      const rest = stripper ? stripper.flush() : '';
      return citations ? citations.push(rest) + citations.flush() : rest;
    },
  };
}

/** What answers a request whose client went away: nobody reads it, and it is no failure of the server's. */
function clientClosed(cause: unknown): ApiError {
  return new ApiError(499, 'The client closed the request', { code: 'CLIENT_CLOSED', cause });
}

function modelHeaders(prepared: PreparedChat): ReplyHeaders {
  return {
    'x-service-model-id': prepared.model.id,
    'x-service-model-name': prepared.model.spec.name,
    ...(prepared.router ? { 'x-service-model-router': prepared.router } : {}),
  };
}

export function createChatHandlers(deps: ChatHandlersDeps): HandlerGroups {
  const { chat } = deps;

  async function complete(ctx: HandlerContext<'createChatCompletion'>, prepared: PreparedChat) {
    // One abort for both ends: the request's, by the client leaving or by the time limit, read without making
    // a signal (http/request-abort.ts).
    const signal = ctx.cancellation;
    let timedOut = false;
    const timeout = setTimeout(() => {
      timedOut = true;
      ctx.abort();
    }, deps.timeoutMs);
    const n = prepared.request.n;
    const choices: ChoiceState[] = Array.from({ length: n }, () => ({
      content: '',
      reasoning: '',
      toolCalls: [],
      logprobs: [],
      started: false,
    }));
    let usage: ProviderUsage | undefined;
    let settlement: Settlement;
    const produced = () =>
      choices
        .map(
          (c) =>
            c.content + c.reasoning + c.toolCalls.map((t) => t.function.name + t.function.arguments).join(''),
        )
        .join('');
    try {
      try {
        for await (const event of chat.run(prepared, signal)) {
          const choice = 'index' in event ? choices[event.index] : undefined;
          if (event.type === 'usage') usage = event.usage;
          else if (event.type === 'finish' && choice) choice.finish = event.reason;
          else if (event.type === 'delta' && choice) {
            choice.content += event.content ?? '';
            choice.reasoning += event.reasoning ?? '';
            for (const call of event.toolCalls ?? []) mergeToolCall(choice.toolCalls, call);
            if (event.logprobs) choice.logprobs.push(...event.logprobs);
          }
        }
      } catch (error) {
        if (signal.aborted && !timedOut) {
          // The client left: the work done so far is billed; nobody reads an answer.
          chat.settle(prepared, undefined, produced());
          throw clientClosed(error);
        }
        await chat.release(prepared);
        if (timedOut) throw new ApiError(504, MESSAGES.timeout, { code: 'REQUEST_TIMEOUT', cause: error });
        throw toApiError(error);
      }
      settlement = chat.settle(prepared, usage, produced());
    } finally {
      clearTimeout(timeout);
      prepared.done();
    }
    const { stripTags, dropReasoning } = visibility(prepared);
    const body: ChatCompletion = {
      id: `chatcmpl-${ctx.requestId}`,
      object: 'chat.completion',
      created: prepared.created,
      model: prepared.model.id,
      choices: choices.map((c, index) => {
        let content = c.content;
        if (stripTags) {
          const s = createThinkStripper();
          content = s.push(content) + s.flush();
        }
        const sources = citationSources(prepared);
        if (sources) content = rewriteCitations(content, { sources });
        const documents = documentsCall(prepared);
        const toolCalls = [...(documents ? [documents] : []), ...c.toolCalls.filter(Boolean)];
        return {
          index,
          finish_reason: c.finish ?? 'stop',
          stop_reason: null,
          logprobs: prepared.request.logprobs ? logprobsBody(c.logprobs) : null,
          message: {
            role: 'assistant' as const,
            content: toolCalls.length > 0 && content === '' ? null : content,
            reasoning_content: dropReasoning || c.reasoning === '' ? null : c.reasoning,
            tool_calls: toolCalls.length > 0 ? toolCalls : null,
          },
        };
      }),
      usage: usageBody(settlement.usage),
      cost: settlement.cost,
      prompt_logprobs: null,
      service_parameters: echoOf(prepared),
    };
    return { status: 200 as const, body, headers: modelHeaders(prepared) };
  }

  async function stream(ctx: HandlerContext<'createChatCompletion'>, prepared: PreparedChat) {
    // The request's own abort (the client gone) stops the engine: no controller of our own, and no signal made
    // (http/request-abort.ts).
    const iterator = chat.run(prepared, ctx.cancellation)[Symbol.asyncIterator]();
    let first: IteratorResult<ChatEvent>;
    try {
      first = await iterator.next();
    } catch (error) {
      await chat.release(prepared).finally(() => prepared.done());
      throw ctx.cancellation.aborted ? clientClosed(error) : toApiError(error);
    }
    const { stripTags, dropReasoning } = visibility(prepared);
    const n = prepared.request.n;
    const choices: ChoiceState[] = Array.from({ length: n }, () => {
      const filter = textFilter(prepared, stripTags);
      return {
        content: '',
        reasoning: '',
        toolCalls: [],
        logprobs: [],
        started: false,
        ...(filter ? { stripper: filter } : {}),
      };
    });
    const documents = documentsCall(prepared);
    const base = {
      id: `chatcmpl-${ctx.requestId}`,
      object: 'chat.completion.chunk' as const,
      created: prepared.created,
      model: prepared.model.id,
    };
    let produced = '';

    return {
      headers: modelHeaders(prepared),
      stream: async (res: ServerResponse, signal: AbortLike) => {
        // The writer's abort is the request's own (app.ts): the client gone ends the stream.
        const aborted = () => signal.aborted;
        // The frames of one turn leave together, the head with the first, the end with the last (event-stream.ts).
        const events = openEventStream(res, aborted);
        const write = events.write;
        const send = async (payload: unknown) => {
          await write(typeof payload === 'string' ? payload : JSON.stringify(payload));
        };
        // Every chunk of one choice is `{...base, choices: [choice]}`: the part before the choice is the same
        // for the whole stream (`{"id":…,"choices":[`), so it is serialised once: the same bytes as serialising
        // the whole chunk.
        const chunkHead = JSON.stringify(extend(base, { choices: [] })).slice(0, -2);
        const sendChoice = (choice: ChatCompletionChunk['choices'][number]) =>
          write(`${chunkHead}${JSON.stringify(choice)}]}`);
        let usage: ProviderUsage | undefined;
        let failure: unknown;
        // `include_search_results_in_stream`: the sources come first, in a chunk without choices.
        if (prepared.options.include_search_results_in_stream && prepared.searchResults)
          await send(extend(base, { choices: [], service_parameters: echoOf(prepared) }));
        try {
          let next = first;
          while (!next.done) {
            const event = next.value;
            if (event.type === 'usage') usage = event.usage;
            else {
              const state = choices[event.index];
              if (state) {
                const opening = !state.started;
                state.started = true;
                if (event.type === 'delta') {
                  const toolCalls = event.toolCalls;
                  if (event.content !== undefined) produced += event.content;
                  if (event.reasoning !== undefined) produced += event.reasoning;
                  if (toolCalls)
                    for (const t of toolCalls)
                      produced += (t.function?.name ?? '') + (t.function?.arguments ?? '');
                  let content = event.content;
                  if (content !== undefined && state.stripper) content = state.stripper.push(content);
                  const reasoning = dropReasoning ? undefined : event.reasoning;
                  // The documents call comes first in each choice; the model's own calls follow it.
                  let calls: ToolCallDelta[] | undefined;
                  if (opening && documents)
                    calls = [{ index: 0, id: documents.id, type: 'function', function: documents.function }];
                  if (toolCalls && toolCalls.length > 0) {
                    calls ??= [];
                    for (const t of toolCalls) calls.push(documents ? extend(t, { index: t.index + 1 }) : t);
                  }
                  // Keys in the order the interface's examples show them: role, content, reasoning, calls.
                  const delta: ChatCompletionChunk['choices'][number]['delta'] = {};
                  if (opening) delta.role = 'assistant';
                  if (content !== undefined && (content !== '' || opening)) delta.content = content;
                  if (reasoning) delta.reasoning_content = reasoning;
                  if (calls) delta.tool_calls = calls as NonNullable<typeof delta.tool_calls>;
                  if (opening || delta.content !== undefined || reasoning || calls || event.logprobs) {
                    const written = sendChoice(
                      event.logprobs && prepared.request.logprobs
                        ? {
                            index: event.index,
                            delta,
                            finish_reason: null,
                            logprobs: logprobsBody(event.logprobs),
                          }
                        : { index: event.index, delta, finish_reason: null },
                    );
                    if (written) await written;
                  }
                } else {
                  const rest = state.stripper?.flush();
                  if (rest)
                    await sendChoice({ index: event.index, delta: { content: rest }, finish_reason: null });
                  await sendChoice({
                    index: event.index,
                    delta: opening ? { role: 'assistant' } : {},
                    finish_reason: event.reason,
                  });
                }
              }
            }
            if (aborted()) break;
            next = await iterator.next();
          }
        } catch (error) {
          failure = error;
        }
        try {
          if (aborted() || res.destroyed) {
            await iterator.return?.(undefined);
            chat.settle(prepared, undefined, produced);
            return;
          }
          if (failure) {
            // Delivered output is billed; the rest of the reservation goes back.
            chat.settle(prepared, undefined, produced);
            await send(streamErrorBody(failure));
            await send('[DONE]');
            return;
          }
          const settlement = chat.settle(prepared, usage, produced);
          await send(
            extend(base, {
              choices: [],
              usage: usageBody(settlement.usage),
              cost: settlement.cost,
              service_parameters: echoOptions(prepared.options),
            }),
          );
          await send('[DONE]');
        } finally {
          prepared.done();
          events.end();
        }
      },
    };
  }

  const handlers: HandlerGroups = {
    createChatCompletion: (ctx) => {
      const key = ctx.headers['idempotency-key'];
      const body = ctx.body as ChatCompletionRequest;
      // Streams ignore the key (nothing to replay); a non-streamed answer is stored and replayed for 24 h.
      if (!deps.idempotency || typeof key !== 'string' || body.stream || !ctx.principal) return run(ctx);
      return idempotent(ctx, deps.idempotency, key, ctx.principal);
    },
  };
  return handlers;

  /** The chat under an `Idempotency-Key`: run once, its answer stored; the same request again replays it. */
  async function idempotent(
    ctx: HandlerContext<'createChatCompletion'>,
    idempotency: NonNullable<ChatHandlersDeps['idempotency']>,
    key: string,
    principal: Principal,
  ) {
    const body = ctx.body as ChatCompletionRequest;
    const scope = {
      principal:
        principal.kind === 'apiKey'
          ? `${principal.accountId}:${principal.keyId}`
          : `wallet:${principal.accountId}`,
      operation: 'createChatCompletion',
      key,
    };
    const begun = await idempotency.begin(scope, {
      requestHash: hashRequestBody(ctx.sentBody ?? body),
    });
    if (begun.kind === 'replay')
      return {
        status: 200 as const,
        contentType: 'application/json',
        body: begun.response.body,
        headers: extend(begun.response.headers, { 'Idempotent-Replayed': 'true' }),
      };
    if (begun.kind === 'in_flight')
      throw new ApiError(
        409,
        'A request with this Idempotency-Key is still being processed; retry after it completes',
        {
          code: 'IDEMPOTENCY_IN_FLIGHT',
        },
      );
    if (begun.kind === 'mismatch')
      throw new ApiError(400, 'This Idempotency-Key was already used with a different request body', {
        code: 'IDEMPOTENCY_KEY_REUSED',
      });
    try {
      const reply = await run(ctx);
      if ('body' in reply && 'status' in reply && !('contentType' in reply)) {
        const headers = Object.fromEntries(
          Object.entries(reply.headers ?? {}).map(([k, v]) => [k, String(v)]),
        );
        await idempotency.complete(
          scope,
          { status: reply.status, headers, body: JSON.stringify(reply.body) },
          begun.owner,
        );
      }
      return reply;
    } catch (error) {
      await idempotency.abandon(scope, begun.owner).catch(() => {});
      throw error;
    }
  }

  async function run(ctx: HandlerContext<'createChatCompletion'>) {
    const principal = ctx.principal;
    if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
    const body = ctx.body as ChatCompletionRequest;
    const sent = ctx.sentBody?.service_parameters as ChatCompletionRequest['service_parameters'];
    const prepared = await chat.prepare({
      body: extend(body, { service_parameters: sent ?? {} }),
      principal,
      requestId: ctx.requestId,
      signalOf: () => ctx.signal,
    });
    // Awaited, not returned: an async function returning a promise resolves with it two microtasks later.
    return body.stream ? await stream(ctx, prepared) : await complete(ctx, prepared);
  }
}
