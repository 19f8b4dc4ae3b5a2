/**
 * The chat service: turns a validated request into a priced, routed provider run and settles its bill.
 *
 *   prepare: resolve the model (404), Pro gate (401), options and persona (400/404), capability checks (400),
 *            messages, prompt tokens, a concurrency slot (503), then the reservation of the worst case; when
 *            the balance cannot cover the full bound the bound is lowered to what it covers (402 only below a
 *            minimal answer). With CHAT_CALL_BEFORE_HOLD (`callBeforeHold`, off by default), a request served
 *            by upstreams alone, with no web work to do first, leaves its reservation to `run`
 *            (PreparedChat.hold).
 *   run:     the provider events, from the backend chosen for the request (`prompt_cache_key` always picks the
 *            same one), failing over to the next backend when one fails before producing anything. A request
 *            whose reservation is left to it makes it there: before the upstream call, or, when the hold is as
 *            good as certain (Charges.holdsAhead), while the call is on its way: the reservation's statements
 *            run during the upstream's first wait instead of before it. Either way no event is handed on, and
 *            nothing can be charged, before the hold is made; a refused hold cancels the call and is refused as
 *            it would have been before it.
 *   settle:  capture the real cost (prompt, cache reads and writes, output, searches, scrapes) as CHARGE
 *            entries with the request and model ids, release the rest, and count the tokens per minute in
 *            the same transaction; its amounts are known beforehand, so the answer waits for it only when
 *            other requests are in flight (Charges.captureDetached).
 */
import { createHash } from 'node:crypto';
import type { ChatCompletionRequest } from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError, badRequest, notFound } from '../../http/errors.ts';
import type { AbortLike } from '../../http/request-abort.ts';
import { nanoToUsdNumber } from '../../money.ts';
import { extend, isPromise } from '../../objects.ts';
import { countPromptTokens, countTokens } from '../../providers/chat/tokenizer.ts';
import {
  type ChatEvent,
  type ChatProvider,
  ChatProviderError,
  type ChatProviderRequest,
  type ProviderTool,
  type ProviderToolChoice,
  type ProviderUsage,
  type SamplingOptions,
} from '../../providers/chat/types.ts';
import type { SearchProvider, SearchResult } from '../../providers/search/types.ts';
import type { Reservation } from '../../storage/ledger.ts';
import type { Charges } from '../billing/charges.ts';
import { AT_CAPACITY_MESSAGE, createSlots } from '../concurrency.ts';
import type { TokenCount } from '../limits/rate-limiter.ts';
import { providerApiError } from '../provider-errors.ts';
import { type ChatOptions, resolveOptions } from './options.ts';
import { affordableCompletionTokens, chargeItems, type Extras, worstCaseNano } from './pricing.ts';
import { buildMessages, type FileConverter } from './prompt.ts';
import { searchContext } from './web/citations.ts';
import { extractUrls, type Scraper } from './web/scrape.ts';
import { scrapeContext, scrapedPages } from './web/scraping.ts';

export type ChatServiceDeps = {
  catalog: CatalogService;
  charges: Charges;
  isPro(accountId: string): Promise<boolean>;
  /** The provider serving one backend of a model. */
  providerFor(backend: Backend): ChatProvider;
  /**
   * The count of a finished request's tokens in the caller's tokens-per-minute window (undefined: nothing to
   * count); settle runs it in the transaction of the capture, so the charge and the count cost one commit.
   */
  tokenCount?(
    principal: Principal,
    modelId: string,
    tokens: number,
  ): TokenCount | undefined | Promise<TokenCount | undefined>;
  convertFile?: FileConverter;
  /** Web search (`enable_web_search`) and scraping (`enable_web_scraping`); absent: the feature is off. */
  web?: { search?: SearchProvider; scraper?: Scraper; now?: () => Date };
  /** Default output bound for models whose catalogue entry gives none. */
  defaultMaxTokens?: number;
  /**
   * A request served by upstreams alone, with no web work first, may send its upstream call before its
   * reservation is made when the hold is as good as certain (CHAT_CALL_BEFORE_HOLD; off: the reservation is
   * made first, as for every other request).
   */
  callBeforeHold?: boolean;
};

/** The smallest answer worth starting: below it, a request the balance cannot cover is refused (402). */
export const MIN_COMPLETION_TOKENS = 16;

export const MESSAGES = {
  capacity: AT_CAPACITY_MESSAGE,
  timeout:
    'The request took too long to complete and was timed-out. For long-running inference requests, use the streaming API by setting `stream=true` in your request.',
  failed: 'Inference processing failed',
  proOnly: 'This model is only available to Pro users',
  characterNotFound: 'No character could be found from the provided character_slug',
};

export type PreparedChat = {
  requestId: string;
  created: number;
  principal: Principal;
  model: CatalogModel;
  options: ChatOptions;
  request: Omit<ChatProviderRequest, 'signal'>;
  promptTokens: number;
  /** Bound actually applied (may be lower than asked when the balance could not cover it). */
  maxTokens: number;
  extras: Extras;
  /**
   * The worst case held for the request. Undefined only while `hold` is still to be made (then nothing was
   * handed on yet), or after it was refused (then nothing will be).
   */
  reservation: Reservation | undefined;
  /** The reservation left to `run`, when it is: made before the request's first event is handed on. */
  hold?: PendingHold;
  /** The web search results given to the model, when a search ran. */
  searchResults?: SearchResult[];
  backends: readonly Backend[];
  /** Set once a backend answered: its name. */
  router?: string;
  /** Frees the concurrency slot; idempotent. */
  done(): void;
};

/** A reservation left to `run` (PreparedChat.hold). */
export type PendingHold = {
  /** Its first attempt's amount: what Charges.holdsAhead judges. */
  amountNano: bigint;
  /**
   * Makes it (with the bound lowered when the balance cannot cover the full one, as `prepare` does): sets
   * the prepared request's `reservation`, and its `maxTokens` when the bound was lowered; throws the 402.
   */
  make(): Promise<void>;
};

export type Settlement = {
  usage: ProviderUsage;
  cost: { usd: number; diem: number };
};

/** A provider failure as the interface's status. */
export function toApiError(error: unknown): ApiError {
  return providerApiError(error, {
    isProviderError: (e) => e instanceof ChatProviderError,
    messages: MESSAGES,
    timeoutStatus: 504,
  });
}

/** The in-band error event of a stream that already started. */
export function streamErrorBody(error: unknown) {
  const failure = toApiError(error);
  const code =
    failure.status === 503 ? 'model_overloaded' : failure.status === 504 ? 'timeout' : 'upstream_error';
  const retry = Number(failure.headers['Retry-After']);
  return {
    error: {
      message: failure.message,
      type: failure.status >= 500 ? 'server_error' : 'api_error',
      code,
      param: null,
      ...(Number.isFinite(retry) && retry > 0 ? { retry_after: retry } : {}),
    },
  };
}

function toolsOf(body: ChatCompletionRequest): ProviderTool[] | undefined {
  const tools = (body.tools ?? []).filter((t) => (t as { function?: unknown }).function) as ProviderTool[];
  return tools.length > 0 ? tools.map((t) => extend(t, { type: 'function' as const })) : undefined;
}

const DONE: IteratorReturnResult<undefined> = { done: true, value: undefined };

const ignore = () => undefined;

/** Whether every backend is an upstream (none is this process's own engine, which has no call to wait on). */
function onlyUpstreams(backends: readonly Backend[]): boolean {
  return backends.length > 0 && backends.every((b) => b.kind !== 'local');
}

/**
 * The hold of a request whose upstream call is made ahead of it (PreparedChat.hold, Charges.holdsAhead): made
 * once the call is on its way (the provider's `started`, its statements then run during the upstream's wait),
 * or once the call's first event is in when the provider never says so (a connection that failed first).
 * `made` settles as the hold does.
 */
class HeldAhead {
  readonly made: Promise<void>;
  private making: Promise<void> | undefined;
  private settle!: (making: Promise<void>) => void;
  private cancelCall: (() => void) | undefined;

  constructor(private readonly hold: PendingHold) {
    this.made = new Promise<void>((resolve) => {
      this.settle = resolve;
    });
  }

  /** ChatProviderRequest.started: the call is on its way; `cancel` ends it. */
  readonly started = (cancel: () => void): void => {
    this.cancelCall = cancel;
    this.start();
  };

  /** The call's first event, asked for: the hold starts when it is in, at the latest. */
  after(pending: Promise<unknown>): void {
    pending.then(this.start, this.start);
  }

  /** Ends the call, and its events (a first event already in is dropped with its connection). */
  cancel(events: AsyncIterator<ChatEvent>): void {
    this.cancelCall?.();
    events.return?.(undefined)?.catch(ignore);
  }

  private readonly start = (): void => {
    if (this.making) return;
    this.making = this.hold.make();
    this.settle(this.making);
  };
}

export function createChatService(deps: ChatServiceDeps) {
  const { acquire } = createSlots();

  /** The events of the first backend that produces any, trying the next on a retryable failure before that. */
  function failover(prepared: PreparedChat, signal: AbortLike): AsyncIterator<ChatEvent> {
    let next = 0;
    let provider: ChatProvider | undefined;
    let events: AsyncIterator<ChatEvent> | undefined;
    let produced = false;
    let finished = false;
    let lastError: unknown;
    return {
      next(): Promise<IteratorResult<ChatEvent>> {
        // Once a backend has produced, there is nothing left to fail over to: its events are handed on as
        // they come, without a promise and an await of this iterator's own per event. Its end and its failure
        // end it as they did here (an iterator that ended or threw answers `done` after).
        if (produced && events && !finished) return events.next();
        return first();
      },
      async return(): Promise<IteratorResult<ChatEvent>> {
        const open = finished ? undefined : events;
        finished = true;
        await open?.return?.();
        return DONE;
      },
    };

    /** The first event: the hold left to the run, then the backends in turn until one produces. */
    async function first(): Promise<IteratorResult<ChatEvent>> {
      for (;;) {
        if (finished) return DONE;
        // The reservation left to the run (first call only): made now, before the upstream call, unless it
        // is as good as certain; then it is made below, while the call is on its way.
        const hold = prepared.hold;
        let ahead: HeldAhead | undefined;
        if (hold) {
          prepared.hold = undefined;
          if (deps.charges.holdsAhead(prepared.principal, hold.amountNano)) ahead = new HeldAhead(hold);
          else {
            try {
              await hold.make();
            } catch (error) {
              finished = true;
              throw error;
            }
          }
        }
        if (!events || !provider) {
          const backend = prepared.backends[next++];
          if (!backend) {
            finished = true;
            throw lastError;
          }
          provider = deps.providerFor(backend);
          produced = false;
          events = provider
            .stream(
              extend(prepared.request, {
                model: backend.kind === 'local' ? prepared.model.id : backend.upstreamModel,
                signal,
                // A call made ahead of its hold says when it is on its way, and hands over its cancel.
                ...(ahead ? { started: ahead.started } : {}),
              }),
            )
            [Symbol.asyncIterator]();
        }
        // Asked for, the first event starts the call.
        const pending = events.next();
        if (ahead) {
          // The event waits until the hold is made; should the call fail meanwhile, it is read after that.
          ahead.after(pending);
          const bound = prepared.maxTokens;
          try {
            await ahead.made;
          } catch (error) {
            ahead.cancel(events);
            finished = true;
            throw error;
          }
          if (prepared.maxTokens !== bound) {
            // The balance covered only a lower bound: the call asked for more. Made again, from the first
            // backend, with the bound that is held (as it would have been made after the hold).
            ahead.cancel(events);
            events = undefined;
            provider = undefined;
            next = 0;
            continue;
          }
        }
        try {
          const result = await pending;
          if (result.done) {
            finished = true;
            return DONE;
          }
          if (!produced) prepared.router = provider.name;
          produced = true;
          return result;
        } catch (error) {
          lastError = error;
          const retryable =
            error instanceof ChatProviderError && (error.kind === 'capacity' || error.kind === 'failed');
          if (produced || !retryable || signal.aborted) {
            finished = true;
            throw error;
          }
          events = undefined;
        }
      }
    }
  }

  /** Backends in the order to try: a `prompt_cache_key` always starts at the same one. */
  function backendOrder(model: CatalogModel, key: string | undefined): Backend[] {
    const list = [...model.backends];
    if (!key || list.length < 2) return list;
    const start = createHash('sha256').update(key).digest().readUInt32BE(0) % list.length;
    return [...list.slice(start), ...list.slice(0, start)];
  }

  type HoldInput = {
    requestId: string;
    promptTokens: number;
    maxTokens: number;
    n: number;
    extras: Extras;
    fixedBound: boolean;
  };

  /** What a hold of `input` with `maxTokens` per choice holds: its worst case. */
  const holdAmount = (model: CatalogModel, input: HoldInput, maxTokens = input.maxTokens) =>
    worstCaseNano(model, {
      promptTokens: input.promptTokens,
      completionTokens: maxTokens * input.n,
      extras: input.extras,
    });

  async function reserve(
    principal: Principal,
    model: CatalogModel,
    input: HoldInput,
  ): Promise<{ reservation: Reservation; maxTokens: number }> {
    let maxTokens = input.maxTokens;
    for (let attempt = 0; ; attempt++) {
      const amountNano = holdAmount(model, input, maxTokens);
      try {
        const reservation = await deps.charges.reserve(principal, {
          amountNano,
          requestId: input.requestId,
          modelId: model.id,
        });
        return { reservation, maxTokens };
      } catch (error) {
        const cause = error instanceof ApiError ? error.cause : undefined;
        const available = availableOf(cause);
        if (available === undefined || attempt >= 3) throw error;
        const affordable = affordableCompletionTokens(model, {
          promptTokens: input.promptTokens,
          extras: input.extras,
          budgetNano: available,
          choices: input.n,
        });
        const floor = Math.min(MIN_COMPLETION_TOKENS, input.maxTokens);
        if (affordable < floor || affordable >= maxTokens) throw error;
        maxTokens = affordable;
      }
    }
  }

  /**
   * The request's token count for the capture's transaction: at once when its tier is known, a promise when
   * it must be read; undefined (the count skipped, never the capture failed) when it cannot be made.
   */
  function tokenCountOf(
    prepared: PreparedChat,
    tokens: number,
  ): TokenCount | undefined | Promise<TokenCount | undefined> {
    try {
      const count = deps.tokenCount?.(prepared.principal, prepared.model.id, tokens);
      return isPromise(count) ? count.catch(() => undefined) : count;
    } catch {
      return undefined;
    }
  }

  return {
    async prepare(input: {
      body: ChatCompletionRequest;
      principal: Principal;
      requestId: string;
      /** The request's signal, asked for only by the steps that hand one on (scraping, web search). */
      signalOf?: () => AbortSignal;
    }): Promise<PreparedChat> {
      const { body, principal } = input;
      const resolved = deps.catalog.resolveModel(body.model, 'text');
      if (!resolved) throw notFound(`Model ${body.model.split(':')[0]} was not found`, 'MODEL_NOT_FOUND');
      const model = resolved.model;
      const options = resolveOptions(model, body.service_parameters, resolved.suffixOptions);
      const persona = options.character_slug
        ? deps.catalog.getCharacterPersona(options.character_slug)
        : undefined;
      if (options.character_slug && !persona)
        throw notFound(MESSAGES.characterNotFound, 'CHARACTER_NOT_FOUND');
      if ((model.pro || persona?.pro) && !(await deps.isPro(principal.accountId)))
        throw new ApiError(401, MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });

      const caps = (model.spec.capabilities ?? {}) as Record<string, unknown>;
      const wantsLogprobs = body.logprobs === true || (body.top_logprobs ?? 0) > 0;
      if (wantsLogprobs && caps.supportsLogProbs !== true)
        throw badRequest(`Model ${model.id} does not support logprobs`, 'UNSUPPORTED_FEATURE');
      const tools = toolsOf(body);
      if (tools && caps.supportsFunctionCalling !== true)
        throw badRequest(
          `Model ${model.id} does not support function calling (tools)`,
          'UNSUPPORTED_FEATURE',
        );
      const format = (body.response_format as { type?: string } | undefined)?.type;
      if (format && format !== 'text' && caps.supportsResponseSchema !== true)
        throw badRequest(
          `Model ${model.id} does not support response_format ${format}`,
          'UNSUPPORTED_FEATURE',
        );

      const messages = await buildMessages({
        model,
        messages: body.messages,
        includeServicePrompt: options.include_service_system_prompt,
        ...(persona ? { personaPrompt: persona.systemPrompt } : {}),
        ...(deps.convertFile ? { convertFile: deps.convertFile } : {}),
      });

      const modelMax = model.spec.maxCompletionTokens ?? deps.defaultMaxTokens ?? 4096;
      const asked =
        body.max_completion_tokens ??
        (body.max_tokens !== undefined && body.max_tokens > 0 ? body.max_tokens : undefined);
      const maxTokens = Math.min(asked ?? modelMax, modelMax);
      const n = body.n ?? 1;
      const thinkingOff = options.disable_thinking && model.canDisableThinking;
      const effort =
        body.reasoning_effort ??
        body.reasoning?.effort ??
        (caps.defaultReasoningEffort as string | undefined);
      const reasoning = model.reasoning
        ? {
            enabled: !thinkingOff && effort !== 'none',
            tags: model.thinkingTags,
            ...(effort ? { effort } : {}),
          }
        : undefined;
      const stop = body.stop == null ? undefined : typeof body.stop === 'string' ? [body.stop] : body.stop;
      const constraints = (model.spec.constraints ?? {}) as Record<string, { default?: number } | undefined>;
      // Set fields only, in this order (an upstream receives them as they are listed here).
      const sampling: SamplingOptions = {};
      const temperature = body.temperature ?? constraints.temperature?.default;
      if (temperature !== undefined) sampling.temperature = temperature;
      const topP = body.top_p ?? constraints.top_p?.default;
      if (topP !== undefined) sampling.top_p = topP;
      if (body.top_k !== undefined) sampling.top_k = body.top_k;
      if (body.min_p !== undefined) sampling.min_p = body.min_p;
      if (body.min_temp !== undefined) sampling.min_temp = body.min_temp;
      if (body.max_temp !== undefined) sampling.max_temp = body.max_temp;
      if (body.frequency_penalty !== undefined) sampling.frequency_penalty = body.frequency_penalty;
      if (body.presence_penalty !== undefined) sampling.presence_penalty = body.presence_penalty;
      const repetitionPenalty = body.repetition_penalty ?? constraints.repetition_penalty?.default;
      if (repetitionPenalty !== undefined) sampling.repetition_penalty = repetitionPenalty;
      if (body.seed !== undefined) sampling.seed = body.seed;
      if (stop !== undefined) sampling.stop = stop;
      if (body.stop_token_ids !== undefined) sampling.stop_token_ids = body.stop_token_ids;
      // Web work: scraping the user's URLs bypasses search; `auto` searches when the message asks for facts.
      const userText = lastUserText(body.messages);
      const scrapeUrls = options.enable_web_scraping && deps.web?.scraper ? extractUrls(userText) : [];
      const searching =
        scrapeUrls.length === 0 &&
        deps.web?.search !== undefined &&
        !options.enable_x_search &&
        (options.enable_web_search === 'on' ||
          (options.enable_web_search === 'auto' && wantsSearch(userText)));
      const worstExtras: Extras = { searches: searching ? 1 : 0, scrapes: scrapeUrls.length };
      // Upper bounds of the context the web work adds (a token is never shorter than a character here).
      const webAllowance = (searching ? SEARCH_CONTEXT_CHARS : 0) + scrapeUrls.length * (PAGE_CHARS + 400);
      let promptTokens = countPromptTokens(messages, tools);
      const extras: Extras = { searches: 0, scrapes: 0 };
      const backends = backendOrder(model, body.prompt_cache_key);
      if (backends.length === 0)
        throw new ApiError(503, `Model ${model.id} has no backend configured`, { code: 'MODEL_OFFLINE' });
      // Upstreams count with their own tokenizers: leave room for the difference.
      const upstream = backends.some((b) => b.kind !== 'local');
      const reservedPrompt = (upstream ? Math.ceil(promptTokens * 1.25) + 64 : promptTokens) + webAllowance;
      const holdInput: HoldInput = {
        requestId: input.requestId,
        promptTokens: reservedPrompt,
        maxTokens,
        n,
        extras: worstExtras,
        fixedBound: asked !== undefined,
      };
      // Served by upstreams alone, with no web work to do first, and calls allowed before their holds: the
      // reservation is left to `run`, which makes it at the upstream call (PreparedChat.hold).
      const atTheCall =
        deps.callBeforeHold === true && onlyUpstreams(backends) && scrapeUrls.length === 0 && !searching;
      const done = acquire(model);
      try {
        const reserved = atTheCall ? undefined : await reserve(principal, model, holdInput);
        let searchResults: SearchResult[] | undefined;
        let context: string | undefined;
        try {
          if (scrapeUrls.length > 0 && deps.web?.scraper) {
            const scraper = deps.web.scraper;
            const signal = input.signalOf?.();
            const results = await Promise.all(scrapeUrls.map((url) => scraper.scrape(url, signal)));
            extras.scrapes = scrapedPages(results).length;
            context = scrapeContext(results, { maxPageChars: PAGE_CHARS });
          } else if (searching && deps.web?.search) {
            searchResults = await deps.web.search
              .search(userText.slice(0, 400), {
                limit: SEARCH_RESULTS,
                ...(input.signalOf ? { signal: input.signalOf() } : {}),
              })
              .then((results) => {
                extras.searches = 1;
                return results;
              })
              // A failed search degrades to an answer without sources, and is not charged.
              .catch(() => []);
            context = searchContext(searchResults, {
              cite: options.enable_web_citations,
              ...(deps.web.now ? { now: deps.web.now() } : {}),
            });
          }
        } catch (error) {
          if (reserved) await deps.charges.release(reserved.reservation);
          throw error;
        }
        if (context) {
          const lastUser = messages.map((m) => m.role).lastIndexOf('user');
          messages.splice(lastUser < 0 ? messages.length : lastUser, 0, { role: 'system', content: context });
          promptTokens = countPromptTokens(messages, tools);
        }
        const passthrough = passthroughOf(body);
        const bound = reserved?.maxTokens ?? maxTokens;
        const request: Omit<ChatProviderRequest, 'signal'> = {
          model: model.id,
          messages,
          promptTokens,
          maxTokens: bound,
          n,
          sampling,
          ...(tools ? { tools } : {}),
          ...(body.tool_choice ? { toolChoice: body.tool_choice as ProviderToolChoice } : {}),
          ...(body.parallel_tool_calls !== undefined ? { parallelToolCalls: body.parallel_tool_calls } : {}),
          ...(wantsLogprobs ? { logprobs: { top: body.top_logprobs ?? 0 } } : {}),
          ...(reasoning ? { reasoning } : {}),
          ...(body.response_format ? { responseFormat: body.response_format } : {}),
          ...(body.prompt_cache_key ? { promptCacheKey: body.prompt_cache_key } : {}),
          ...(Object.keys(passthrough).length > 0 ? { passthrough } : {}),
          ...(body.stream ? {} : { whole: true }),
        };
        const prepared: PreparedChat = {
          requestId: input.requestId,
          created: Math.floor(Date.now() / 1000),
          principal,
          model,
          options,
          request,
          promptTokens,
          maxTokens: bound,
          extras,
          reservation: reserved?.reservation,
          ...(searchResults ? { searchResults } : {}),
          backends,
          done,
        };
        if (atTheCall)
          prepared.hold = {
            amountNano: holdAmount(model, holdInput),
            async make() {
              const made = await reserve(principal, model, holdInput);
              prepared.reservation = made.reservation;
              if (made.maxTokens !== prepared.maxTokens) {
                prepared.maxTokens = made.maxTokens;
                request.maxTokens = made.maxTokens;
              }
            },
          };
        return prepared;
      } catch (error) {
        done();
        throw error;
      }
    },

    /**
     * The provider events, with failover to the next backend while nothing was produced. A plain iterator
     * over the provider's (not an async generator around it): one promise per event, not a generator's
     * queue and two awaits.
     */
    run(prepared: PreparedChat, signal: AbortLike): AsyncIterable<ChatEvent> {
      return new Run(failover, prepared, signal);
    },

    /**
     * Captures what the request used (or, when it was cut short, what it had produced) without waiting for
     * the capture (Charges.captureDetached): the settlement is known at once from the reservation and the
     * usage, so the answer that reports it is written while the capture commits.
     */
    settle(prepared: PreparedChat, usage: ProviderUsage | undefined, producedText: string): Settlement {
      const final: ProviderUsage = usage ?? {
        promptTokens: prepared.promptTokens,
        completionTokens: countTokens(producedText),
        reasoningTokens: 0,
        cachedTokens: 0,
        cacheCreationTokens: 0,
      };
      const reservation = prepared.reservation;
      // A hold refused (or never made): nothing was handed on, and nothing is held to charge.
      if (!reservation) return { usage: final, cost: { usd: 0, diem: 0 } };
      // A count that cannot be made (its tier unknown) is skipped, as a failed count never fails the capture.
      const count = tokenCountOf(prepared, final.promptTokens + final.completionTokens);
      const capture = deps.charges.captureDetached(
        reservation,
        chargeItems(prepared.model, final, prepared.extras),
        count,
      );
      return {
        usage: final,
        cost: { usd: nanoToUsdNumber(capture.usdNano), diem: nanoToUsdNumber(capture.diemNano) },
      };
    },

    /** Gives the reservation back (nothing chargeable happened); nothing to do when none was made. */
    async release(prepared: PreparedChat): Promise<void> {
      if (prepared.reservation) await deps.charges.release(prepared.reservation);
    },
  };
}

/** Results given to the model per search. */
const SEARCH_RESULTS = 5;
/** Upper bound of the search context's length (five capped excerpts, titles, URLs and instructions). */
const SEARCH_CONTEXT_CHARS = 1_000 + SEARCH_RESULTS * 2_600;
/** Longest text of one scraped page placed in the prompt. */
const PAGE_CHARS = 8_000;

/** `auto` web search: the local heuristic of "the message asks about facts that may be recent". */
export function wantsSearch(text: string): boolean {
  return /\?|\b(latest|today|current|currently|news|recent|recently|price|weather|who|when|where|how (tall|many|much))\b/i.test(
    text,
  );
}

function lastUserText(messages: ChatCompletionRequest['messages']): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as { role: string; content?: unknown };
    if (m.role !== 'user') continue;
    if (typeof m.content === 'string') return m.content;
    if (Array.isArray(m.content))
      return (m.content as { type: string; text?: string }[])
        .filter((p) => p.type === 'text')
        .map((p) => p.text ?? '')
        .join('\n');
    return '';
  }
  return '';
}

const KNOWN_FIELDS = new Set([
  'model',
  'messages',
  'frequency_penalty',
  'presence_penalty',
  'repetition_penalty',
  'logprobs',
  'top_logprobs',
  'max_completion_tokens',
  'max_tokens',
  'temperature',
  'top_p',
  'top_k',
  'min_p',
  'min_temp',
  'max_temp',
  'seed',
  'n',
  'stop',
  'stop_token_ids',
  'stream',
  'stream_options',
  'response_format',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'reasoning',
  'reasoning_effort',
  'prompt_cache_key',
  'prompt_cache_retention',
  'user',
  'anon_user_id',
  'service_parameters',
]);

/** Request fields the interface does not list: passed to upstreams as they came. */
function passthroughOf(body: ChatCompletionRequest): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key in body)
    if (Object.hasOwn(body, key) && !KNOWN_FIELDS.has(key)) out[key] = (body as Record<string, unknown>)[key];
  return out;
}

function availableOf(cause: unknown): bigint | undefined {
  const c = cause as
    | { usdAvailableNano?: unknown; diemAvailableNano?: unknown; limitNano?: unknown; spentNano?: unknown }
    | undefined;
  if (typeof c?.usdAvailableNano === 'bigint' && typeof c.diemAvailableNano === 'bigint')
    return c.usdAvailableNano + c.diemAvailableNano;
  if (typeof c?.limitNano === 'bigint' && typeof c.spentNano === 'bigint') return c.limitNano - c.spentNano;
  return undefined;
}

export type ChatService = ReturnType<typeof createChatService>;

/**
 * A chat's provider events as an iterable (ChatService.run). A class: an object literal with the computed key
 * `[Symbol.asyncIterator]` is defined through V8's runtime on every request, about 1.5 µs a chat under load
 * (`perf`, bench/HISTORY.md, thirty-sixth round).
 */
class Run implements AsyncIterable<ChatEvent> {
  constructor(
    private readonly failover: (prepared: PreparedChat, signal: AbortLike) => AsyncIterator<ChatEvent>,
    private readonly prepared: PreparedChat,
    private readonly signal: AbortLike,
  ) {}

  [Symbol.asyncIterator](): AsyncIterator<ChatEvent> {
    return this.failover(this.prepared, this.signal);
  }
}
