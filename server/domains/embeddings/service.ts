/**
 * The embeddings service: resolve the model (404), check the inputs against the model's token limit and the
 * asked `dimensions` (400), take a concurrency slot (503), reserve the input tokens' price, run the backends
 * (failing over on capacity and failures), then capture the tokens as one CHARGE line and release the rest.
 * Tokens are counted with the real tokenizer; an upstream's own count is billed when it reports one, never
 * beyond what was reserved.
 */
import type { EmbeddingRequest } from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError, badRequest, notFound } from '../../http/errors.ts';
import { countTokens } from '../../providers/chat/tokenizer.ts';
import type { EmbeddingProvider } from '../../providers/embeddings/types.ts';
import type { CaptureItem } from '../../storage/ledger.ts';
import { backendsOf, ceilDiv, MEDIA_MESSAGES, mediaApiError, withFailover } from '../audio/common.ts';
import type { Charges } from '../billing/charges.ts';
import { createSlots } from '../concurrency.ts';
import type { TokenCount } from '../limits/rate-limiter.ts';

export type EmbeddingServiceDeps = {
  catalog: CatalogService;
  charges: Charges;
  isPro(accountId: string): Promise<boolean>;
  providerFor(backend: Backend): EmbeddingProvider;
  /**
   * The count of a finished request's tokens in the caller's tokens-per-minute window (undefined: nothing to
   * count), run in the transaction of the capture.
   */
  tokenCount?(principal: Principal, modelId: string, tokens: number): Promise<TokenCount | undefined>;
};

/** Vector length of a model whose catalogue entry gives none. */
export const DEFAULT_DIMENSIONS = 1024;

export type EmbeddingResult = {
  model: CatalogModel;
  router: string;
  vectors: Float32Array[];
  promptTokens: number;
};

const MILLION = 1_000_000n;

/** Nano-USD per million input tokens. */
export function inputPrice(model: CatalogModel): bigint {
  return model.pricing?.input?.usd ?? 0n;
}

export function embeddingCharge(model: CatalogModel, tokens: number): CaptureItem {
  const price = inputPrice(model);
  return {
    sku: 'embeddings.input_tokens',
    units: (tokens / 1e6).toString(),
    unitPriceNano: price,
    amountNano: ceilDiv(BigInt(tokens) * price, MILLION),
  };
}

export function createEmbeddingService(deps: EmbeddingServiceDeps) {
  const slots = createSlots();
  return {
    async embed(input: {
      body: EmbeddingRequest;
      principal: Principal;
      requestId: string;
      signal?: AbortSignal;
    }): Promise<EmbeddingResult> {
      const { body, principal } = input;
      const resolved = deps.catalog.resolveModel(body.model, 'embedding');
      if (!resolved) throw notFound(`Model ${body.model.split(':')[0]} was not found`, 'MODEL_NOT_FOUND');
      const model = resolved.model;
      if (model.pro && !(await deps.isPro(principal.accountId)))
        throw new ApiError(401, MEDIA_MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });

      const inputs = typeof body.input === 'string' ? [body.input] : body.input;
      const limit = model.spec.maxInputTokens;
      let promptTokens = 0;
      inputs.forEach((text, index) => {
        const tokens = countTokens(text);
        if (limit !== undefined && tokens > limit)
          throw badRequest(
            `Input ${index} has ${tokens} tokens; model ${model.id} accepts at most ${limit} per input`,
            'TOO_MANY_TOKENS',
          );
        promptTokens += tokens;
      });

      const native = model.spec.embeddingDimensions ?? DEFAULT_DIMENSIONS;
      // `dimensions` is honoured only where the model supports custom lengths; elsewhere it is ignored.
      const custom = body.dimensions !== undefined && model.spec.supportsCustomDimensions === true;
      if (custom && (body.dimensions as number) > native)
        throw badRequest(`dimensions must be at most ${native} for model ${model.id}`, 'INVALID_REQUEST', {
          _errors: [],
          dimensions: { _errors: [`must be <= ${native}`] },
        });
      const dimensions = custom ? (body.dimensions as number) : native;

      const backends = backendsOf(model, 'embedding');
      // Upstreams count with their own tokenizers: leave room for the difference.
      const upstream = backends.some((b) => b.kind !== 'local');
      const reservedTokens = upstream ? Math.ceil(promptTokens * 1.25) + 64 : promptTokens;
      const done = slots.acquire(model);
      try {
        const reservation = await deps.charges.reserve(principal, {
          amountNano: embeddingCharge(model, reservedTokens).amountNano,
          requestId: input.requestId,
          modelId: model.id,
        });
        let router = 'local';
        let result: Awaited<ReturnType<EmbeddingProvider['embed']>>;
        try {
          result = await withFailover(backends, input.signal, async (backend) => {
            const provider = deps.providerFor(backend);
            const answer = await provider.embed({
              model: backend.kind === 'local' ? model.id : backend.upstreamModel,
              inputs,
              dimensions,
              customDimensions: custom,
              ...(input.signal ? { signal: input.signal } : {}),
            });
            router = provider.name;
            return answer;
          });
        } catch (error) {
          await deps.charges.release(reservation);
          throw mediaApiError(error);
        }
        const billed = Math.min(result.promptTokens ?? promptTokens, reservedTokens);
        // A count that cannot be made (its tier unknown) is skipped: it never fails the capture.
        const count = await deps.tokenCount?.(principal, model.id, billed).catch(() => undefined);
        await deps.charges.captureWith(reservation, [embeddingCharge(model, billed)], count);
        return { model, router, vectors: result.vectors, promptTokens: billed };
      } finally {
        done();
      }
    },
  };
}

export type EmbeddingService = ReturnType<typeof createEmbeddingService>;
