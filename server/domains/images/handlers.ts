/**
 * `POST /image/generate` (JSON with base64 images, or with `return_binary` the image file itself) and the
 * OpenAI-compatible `POST /images/generations` (`b64_json` or `data:` URLs). Both run the image service; the
 * handlers only translate and set the image headers (`x-service-is-blurred`, the content-violation flags,
 * `x-service-enhanced-prompt` when a rewrite was made, the model headers).
 */
import { randomUUID } from 'node:crypto';
import type {
  ImageGenerateRequest,
  ImageGenerateResponse,
  ImageGenerationsRequest,
  ImageGenerationsResponse,
} from '../../../generated/api.d.ts';
import type { HandlerGroups } from '../../handlers.ts';
import type { ReplyHeaders } from '../../http/contract.ts';
import { ApiError } from '../../http/errors.ts';
import { toGenerateRequest } from './compat.ts';
import type { ImageGeneration, ImageService } from './service.ts';

export type ImageHandlersDeps = { images: ImageService };

function headersOf(generation: ImageGeneration): ReplyHeaders {
  return {
    'x-service-model-id': generation.model.id,
    'x-service-model-name': generation.model.spec.name,
    'x-service-model-router': generation.router,
    'x-service-is-blurred': String(generation.blurred),
    'x-service-is-content-violation': 'false',
    'x-service-is-adult-model-content-violation': 'false',
    ...(generation.enhancedPrompt !== undefined
      ? { 'x-service-enhanced-prompt': encodeURIComponent(generation.enhancedPrompt) }
      : {}),
  };
}

/** The request as it ran: defaults filled in, the seed actually used. */
function echo(generation: ImageGeneration): Record<string, unknown> {
  const r = generation.request;
  return {
    model: generation.model.id,
    prompt: r.prompt,
    ...(r.negativePrompt ? { negative_prompt: r.negativePrompt } : {}),
    width: r.width,
    height: r.height,
    ...(r.aspectRatio ? { aspect_ratio: r.aspectRatio } : {}),
    ...(r.resolution ? { resolution: r.resolution } : {}),
    ...(r.quality ? { quality: r.quality } : {}),
    steps: r.steps,
    ...(r.cfgScale !== undefined ? { cfg_scale: r.cfgScale } : {}),
    ...(r.loraStrength !== undefined ? { lora_strength: r.loraStrength } : {}),
    seed: r.seed,
    format: r.format,
    variants: r.variants,
    ...(r.stylePreset ? { style_preset: r.stylePreset } : {}),
    enhance_prompt: r.enhance,
    safe_mode: r.safeMode,
    hide_watermark: r.hideWatermark,
    embed_exif_metadata: r.embedExif,
    return_binary: r.returnBinary,
  };
}

const principalOf = <T>(principal: T | undefined): T => {
  if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
  return principal;
};

export function createImageHandlers(deps: ImageHandlersDeps): HandlerGroups {
  const { images } = deps;
  return {
    generateImage: async (ctx) => {
      const generation = await images.generate({
        body: ctx.body as ImageGenerateRequest,
        principal: principalOf(ctx.principal),
        requestId: ctx.requestId,
        signal: ctx.signal,
      });
      const headers = headersOf(generation);
      if (generation.request.returnBinary)
        return {
          status: 200 as const,
          contentType: generation.contentType,
          body: generation.images[0] as Buffer,
          headers,
        };
      const body: ImageGenerateResponse = {
        id: `img_${randomUUID().replace(/-/g, '')}`,
        images: generation.images.map((image) => image.toString('base64')),
        timing: generation.timing,
        request: echo(generation),
      };
      return { status: 200 as const, body, headers };
    },

    createImage: async (ctx) => {
      const body = ctx.body as ImageGenerationsRequest;
      const model = images.resolveModel(body.model ?? 'default');
      const generation = await images.generate({
        body: toGenerateRequest(model, body),
        principal: principalOf(ctx.principal),
        requestId: ctx.requestId,
        signal: ctx.signal,
      });
      const asUrl = body.response_format === 'url';
      const response: ImageGenerationsResponse = {
        created: Math.floor(Date.now() / 1000),
        data: generation.images.map((image) =>
          asUrl
            ? { url: `data:${generation.contentType};base64,${image.toString('base64')}` }
            : { b64_json: image.toString('base64') },
        ),
      };
      return { status: 200 as const, body: response, headers: headersOf(generation) };
    },
  };
}
