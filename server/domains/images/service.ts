/**
 * The image service: one generation from a validated request to finished files and a settled bill.
 *
 *   admit:      resolve the model (404), Pro gate (401), the model's rules (400), the content policy (422),
 *               a concurrency slot (503), then the reservation of the worst case (402): every variant at the
 *               request's price tier, plus the enhancement when asked for.
 *   preprocess: the deterministic prompt enhancement and the decoding of style references.
 *   infer:      the provider of the first backend that answers (failing over while a backend is at capacity
 *               or fails), then finishing (size, blur, watermark, EXIF, format) of every image.
 *   settle:     capture the real cost (the images delivered, the enhancement only when a rewrite was made) as
 *               CHARGE entries with the request and model ids, release the rest; on any failure release all.
 *
 * `timing` is measured with the monotonic clock around those phases.
 */
import type { ImageGenerateRequest } from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError, notFound } from '../../http/errors.ts';
import { nanoToUsdNumber } from '../../money.ts';
import {
  type ImageProvider,
  ImageProviderError,
  type ImageProviderResult,
} from '../../providers/images/types.ts';
import type { Charges } from '../billing/charges.ts';
import { AT_CAPACITY_MESSAGE, createSlots } from '../concurrency.ts';
import { providerApiError } from '../provider-errors.ts';
import { checkPromptContent } from './content.ts';
import { enhancePrompt } from './enhance.ts';
import { CONTENT_TYPES, finishImage } from './finish.ts';
import { constraintsOf, type ImageRequest, resolveImageRequest } from './options.ts';
import { chargeItems, type PriceTier, worstCaseNano } from './pricing.ts';
import { decodeStyleReferences } from './references.ts';

export type ImageServiceDeps = {
  catalog: CatalogService;
  charges: Charges;
  isPro(accountId: string): Promise<boolean>;
  /** The provider serving one backend of a model. */
  providerFor(backend: Backend): ImageProvider;
  /** Monotonic milliseconds (timing); `performance.now` by default. */
  clock?: () => number;
  /** Source of omitted seeds in [0, 1); a cryptographic one by default. */
  random?: () => number;
};

export const MESSAGES = {
  capacity: AT_CAPACITY_MESSAGE,
  timeout: 'The image generation took too long and was timed-out.',
  failed: 'Inference processing failed',
  proOnly: 'This model is only available to Pro users',
  policy: 'The prompt violates the content policy',
};

export type ImageTiming = {
  inferenceDuration: number;
  inferencePreprocessingTime: number;
  inferenceQueueTime: number;
  total: number;
};

export type ImageGeneration = {
  model: CatalogModel;
  request: ImageRequest;
  images: Buffer[];
  contentType: string;
  blurred: boolean;
  /** The rewritten prompt, when `enhance_prompt` made a rewrite. */
  enhancedPrompt?: string;
  router: string;
  timing: ImageTiming;
  cost: { usd: number; diem: number };
};

/** A provider failure as the interface's status. */
export function toApiError(error: unknown): ApiError {
  return providerApiError(error, {
    isProviderError: (e) => e instanceof ImageProviderError,
    messages: MESSAGES,
    timeoutStatus: 503,
  });
}

const round = (ms: number) => Math.round(ms * 10) / 10;

export function createImageService(deps: ImageServiceDeps) {
  const clock = deps.clock ?? (() => performance.now());
  const { acquire } = createSlots();

  return {
    /** Resolves an image model by id, trait or OpenAI name (404 when none). */
    resolveModel(name: string): CatalogModel {
      const resolved = deps.catalog.resolveModel(name, 'image');
      if (resolved?.model.type !== 'image')
        throw notFound(`Model ${name.split(':')[0]} was not found`, 'MODEL_NOT_FOUND');
      return resolved.model;
    },

    async generate(input: {
      body: ImageGenerateRequest & { output_compression?: number };
      principal: Principal;
      requestId: string;
      signal: AbortSignal;
    }): Promise<ImageGeneration> {
      const started = clock();
      const { body, principal } = input;
      const model = this.resolveModel(body.model);
      if (model.pro && !(await deps.isPro(principal.accountId)))
        throw new ApiError(401, MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });
      const request = resolveImageRequest(model, body, {
        imageStyles: deps.catalog.imageStyles().data,
        ...(deps.random ? { random: deps.random } : {}),
      });
      const content = checkPromptContent(request.prompt);
      if (content.violation)
        throw new ApiError(422, MESSAGES.policy, {
          code: 'CONTENT_POLICY_VIOLATION',
          headers: { 'x-service-is-content-violation': 'true' },
        });
      if (model.backends.length === 0)
        throw new ApiError(503, `Model ${model.id} has no backend configured`, { code: 'MODEL_OFFLINE' });

      const tier: PriceTier = {
        ...(request.resolution ? { resolution: request.resolution } : {}),
        ...(request.quality ? { quality: request.quality } : {}),
      };
      // Tiered models without a resolution tier in the request are priced at their first tier.
      if (!tier.resolution && request.quality) {
        const tiers = constraintsOf(model).resolutions;
        if (tiers?.[0]) tier.resolution = constraintsOf(model).defaultResolution ?? tiers[0];
      }
      const done = acquire(model);
      try {
        const reservation = await deps.charges.reserve(principal, {
          amountNano: worstCaseNano(model, { tier, variants: request.variants, enhance: request.enhance }),
          requestId: input.requestId,
          modelId: model.id,
        });
        const admitted = clock();
        try {
          // Preprocessing: the rewrite and the references.
          const enhancedPrompt = request.enhance
            ? enhancePrompt(request.prompt, constraintsOf(model).promptCharacterLimit ?? 7500)
            : undefined;
          const references = await decodeStyleReferences(request.styleReferences);
          const prompt = enhancedPrompt ?? request.prompt;
          const preprocessed = clock();

          let result: ImageProviderResult | undefined;
          let router = '';
          let lastError: unknown;
          for (const backend of model.backends) {
            const provider = deps.providerFor(backend);
            try {
              result = await provider.generate({
                model: backend.kind === 'local' ? model.id : backend.upstreamModel,
                prompt,
                ...(request.negativePrompt ? { negativePrompt: request.negativePrompt } : {}),
                width: request.width,
                height: request.height,
                seed: request.seed,
                variants: request.variants,
                steps: request.steps,
                ...(request.cfgScale !== undefined ? { cfgScale: request.cfgScale } : {}),
                ...(request.loraStrength !== undefined ? { loraStrength: request.loraStrength } : {}),
                ...(request.stylePreset ? { stylePreset: request.stylePreset } : {}),
                styleReferences: references,
                ...(request.quality ? { quality: request.quality } : {}),
                user: request.anonUserId
                  ? `${principal.accountId}||${request.anonUserId}`
                  : principal.accountId,
                signal: input.signal,
              });
              router = provider.name;
              break;
            } catch (error) {
              lastError = error;
              const retryable =
                error instanceof ImageProviderError && (error.kind === 'capacity' || error.kind === 'failed');
              if (!retryable || input.signal.aborted) throw error;
            }
          }
          if (!result) throw lastError;
          if (result.images.length !== request.variants)
            throw new ImageProviderError(
              'failed',
              `Backend ${router} returned ${result.images.length} images`,
            );

          const blurred = request.safeMode && content.adult;
          const images: Buffer[] = [];
          for (const [index, image] of result.images.entries()) {
            images.push(
              await finishImage(image, {
                width: request.width,
                height: request.height,
                format: request.format,
                blur: blurred,
                watermark: !request.hideWatermark,
                ...(request.encoderQuality !== undefined ? { quality: request.encoderQuality } : {}),
                ...(request.embedExif
                  ? {
                      exif: {
                        description: prompt,
                        model: model.id,
                        software: `image engine ${router}`,
                        comment: exifComment(model, request, prompt, index),
                      },
                    }
                  : {}),
              }),
            );
          }
          const inferred = clock();
          const capture = await deps.charges.capture(
            reservation,
            chargeItems(model, { tier, images: images.length, enhanced: enhancedPrompt !== undefined }),
          );
          const finished = clock();
          return {
            model,
            request,
            images,
            contentType: CONTENT_TYPES[request.format],
            blurred,
            ...(enhancedPrompt !== undefined ? { enhancedPrompt } : {}),
            router,
            timing: {
              inferenceQueueTime: round(admitted - started),
              inferencePreprocessingTime: round(preprocessed - admitted),
              inferenceDuration: round(inferred - preprocessed),
              total: round(finished - started),
            },
            cost: { usd: nanoToUsdNumber(capture.usdNano), diem: nanoToUsdNumber(capture.diemNano) },
          };
        } catch (error) {
          await deps.charges.release(reservation);
          throw toApiError(error);
        }
      } finally {
        done();
      }
    },
  };
}

/** The generation parameters written into EXIF (`UserComment`, as JSON). */
function exifComment(model: CatalogModel, request: ImageRequest, prompt: string, index: number) {
  return {
    model: model.id,
    prompt,
    ...(request.negativePrompt ? { negative_prompt: request.negativePrompt } : {}),
    seed: request.seed + index,
    steps: request.steps,
    width: request.width,
    height: request.height,
    ...(request.cfgScale !== undefined ? { cfg_scale: request.cfgScale } : {}),
    ...(request.loraStrength !== undefined ? { lora_strength: request.loraStrength } : {}),
    ...(request.stylePreset ? { style_preset: request.stylePreset } : {}),
    ...(request.aspectRatio ? { aspect_ratio: request.aspectRatio } : {}),
    ...(request.resolution ? { resolution: request.resolution } : {}),
    ...(request.quality ? { quality: request.quality } : {}),
    variant: index + 1,
  };
}

export type ImageService = ReturnType<typeof createImageService>;
