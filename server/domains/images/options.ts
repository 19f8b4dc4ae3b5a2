/**
 * The rules of an image request that depend on the model, applied after the schema checks: prompt limits,
 * the sizing kind (pixels, aspect ratio, resolution tier), quality tiers, steps, style presets and style
 * references, variants with `return_binary`, and the disabled `inpaint`. The result is the request as it will
 * run, with every default filled in (the seed too: random when omitted). Every refusal is a 400 with the
 * `{error, details}` tree pointing at the field.
 */
import { randomInt } from 'node:crypto';
import type { ImageGenerateRequest } from '../../../generated/api.d.ts';
import type { CatalogModel } from '../../catalog/types.ts';
import { badRequest } from '../../http/errors.ts';
import type { ImageQuality } from '../../providers/images/types.ts';
import type { ImageFormat } from './finish.ts';

export const SEED_LIMIT = 999_999_999;
/** The pixel size of pixel-based models when `width` or `height` is omitted. */
export const DEFAULT_PIXELS = 1024;
/** Steps for models whose catalogue entry gives none. */
export const DEFAULT_STEPS = 8;
/** Long side of each resolution tier; aspect-ratio models draw at 1K. */
export const RESOLUTION_PIXELS: Record<string, number> = { '1K': 1024, '2K': 2048, '4K': 4096 };

type Sizing = 'pixels' | 'aspect_ratio' | 'resolution';

type ImageConstraints = {
  sizing?: Sizing;
  promptCharacterLimit?: number;
  steps?: { default: number; max: number };
  widthHeightDivisor?: number;
  aspectRatios?: string[];
  defaultAspectRatio?: string;
  resolutions?: string[];
  defaultResolution?: string;
  qualities?: ImageQuality[];
  defaultQuality?: ImageQuality;
  maxStyleReferences?: number;
};

export type ImageRequest = {
  prompt: string;
  negativePrompt?: string;
  width: number;
  height: number;
  sizing: Sizing;
  aspectRatio?: string;
  resolution?: string;
  quality?: ImageQuality;
  steps: number;
  cfgScale?: number;
  loraStrength?: number;
  seed: number;
  variants: number;
  format: ImageFormat;
  /** Encoder quality for jpeg and webp (the OpenAI-compatible `output_compression`). */
  encoderQuality?: number;
  safeMode: boolean;
  hideWatermark: boolean;
  embedExif: boolean;
  returnBinary: boolean;
  stylePreset?: string;
  enhance: boolean;
  styleReferences: { image: string; strength: number }[];
  anonUserId?: string;
};

function refuse(field: string, message: string): never {
  throw badRequest(message, 'INVALID_REQUEST', { _errors: [], [field]: { _errors: [message] } });
}

export function constraintsOf(model: CatalogModel): ImageConstraints {
  return (model.spec.constraints ?? {}) as ImageConstraints;
}

/** `W:H` of a ratio string, or undefined. */
function parseRatio(ratio: string): [number, number] | undefined {
  const match = /^(\d{1,2}):(\d{1,2})$/.exec(ratio);
  if (!match) return undefined;
  const w = Number(match[1]);
  const h = Number(match[2]);
  return w > 0 && h > 0 ? [w, h] : undefined;
}

/** The size of a ratio with its long side at `long` pixels (the short side rounded to a multiple of 8). */
export function sizeOfRatio(ratio: [number, number], long: number): { width: number; height: number } {
  const [w, h] = ratio;
  const short = Math.max(8, Math.round((long * Math.min(w, h)) / Math.max(w, h) / 8) * 8);
  return w >= h ? { width: long, height: short } : { width: short, height: long };
}

export function resolveImageRequest(
  model: CatalogModel,
  body: ImageGenerateRequest & { output_compression?: number },
  context: { imageStyles: readonly string[]; random?: () => number },
): ImageRequest {
  const c = constraintsOf(model);
  const limit = c.promptCharacterLimit ?? 7500;
  if (body.prompt.length > limit)
    refuse(
      'prompt',
      `Prompt is ${body.prompt.length} characters; model ${model.id} accepts at most ${limit}`,
    );
  if (body.negative_prompt !== undefined && body.negative_prompt.length > limit)
    refuse(
      'negative_prompt',
      `Negative prompt is ${body.negative_prompt.length} characters; model ${model.id} accepts at most ${limit}`,
    );
  if (body.inpaint !== undefined && body.inpaint !== null)
    refuse('inpaint', 'Inpainting is disabled since 2025-05-19; leave inpaint out');
  const variants = body.variants ?? 1;
  const returnBinary = body.return_binary ?? false;
  if (returnBinary && variants > 1)
    refuse(
      'variants',
      'Only one variant can be returned with return_binary; set variants to 1 or return JSON',
    );
  if (body.anon_user_id?.includes('||')) refuse('anon_user_id', 'anon_user_id must not contain "||"');

  // Sizing, by the kind of model.
  const sizing: Sizing = c.sizing ?? 'pixels';
  let width: number;
  let height: number;
  let aspectRatio: string | undefined;
  let resolution: string | undefined;
  if (sizing === 'pixels') {
    width = body.width ?? DEFAULT_PIXELS;
    height = body.height ?? DEFAULT_PIXELS;
    const divisor = c.widthHeightDivisor ?? 1;
    if (width % divisor !== 0)
      refuse('width', `width must be a multiple of ${divisor} for model ${model.id}`);
    if (height % divisor !== 0)
      refuse('height', `height must be a multiple of ${divisor} for model ${model.id}`);
  } else {
    for (const field of ['width', 'height'] as const)
      if (body[field] !== undefined)
        refuse(
          field,
          `Model ${model.id} is sized by aspect ratio${sizing === 'resolution' ? ' and resolution' : ''}: send aspect_ratio instead of width and height`,
        );
    const offered = c.aspectRatios ?? ['1:1'];
    aspectRatio =
      body.aspect_ratio === undefined || body.aspect_ratio === 'auto'
        ? (c.defaultAspectRatio ?? offered[0] ?? '1:1')
        : body.aspect_ratio;
    if (!offered.includes(aspectRatio))
      refuse('aspect_ratio', `Model ${model.id} offers the aspect ratios ${offered.join(', ')}`);
    let long = RESOLUTION_PIXELS['1K'] as number;
    if (sizing === 'resolution') {
      const tiers = c.resolutions ?? ['1K'];
      resolution = body.resolution ?? c.defaultResolution ?? tiers[0] ?? '1K';
      if (!tiers.includes(resolution))
        refuse('resolution', `Model ${model.id} offers the resolutions ${tiers.join(', ')}`);
      long = RESOLUTION_PIXELS[resolution] ?? long;
    }
    const ratio = parseRatio(aspectRatio) ?? [1, 1];
    ({ width, height } = sizeOfRatio(ratio, long));
  }

  // Quality tiers: the model's default when omitted; ignored by models without tiers.
  let quality: ImageQuality | undefined;
  if (c.qualities) {
    quality = body.quality ?? c.defaultQuality ?? 'high';
    if (!c.qualities.includes(quality))
      refuse('quality', `Model ${model.id} offers the qualities ${c.qualities.join(', ')}`);
  }

  // Steps: bounded by the model; models without steps ignore the field.
  let steps = DEFAULT_STEPS;
  if (c.steps) {
    steps = body.steps ?? c.steps.default;
    if (steps > c.steps.max) refuse('steps', `Model ${model.id} accepts at most ${c.steps.max} steps`);
  }

  if (body.style_preset !== undefined && !context.imageStyles.includes(body.style_preset))
    refuse('style_preset', `Unknown style_preset "${body.style_preset}"; see GET /image/styles`);

  const references = body.style_references ?? [];
  if (references.length > 0) {
    if (model.spec.supportsStyleReferences !== true)
      refuse('style_references', `Model ${model.id} does not support style references`);
    const max = c.maxStyleReferences ?? 1;
    if (references.length > max)
      refuse('style_references', `Model ${model.id} accepts at most ${max} style references`);
  }

  const seed =
    body.seed ??
    (context.random
      ? Math.floor(context.random() * (2 * SEED_LIMIT + 1)) - SEED_LIMIT
      : randomInt(-SEED_LIMIT, SEED_LIMIT + 1));

  return {
    prompt: body.prompt,
    ...(body.negative_prompt ? { negativePrompt: body.negative_prompt } : {}),
    width,
    height,
    sizing,
    ...(aspectRatio ? { aspectRatio } : {}),
    ...(resolution ? { resolution } : {}),
    ...(quality ? { quality } : {}),
    steps,
    ...(body.cfg_scale !== undefined ? { cfgScale: body.cfg_scale } : {}),
    ...(body.lora_strength !== undefined ? { loraStrength: body.lora_strength } : {}),
    seed,
    variants,
    format: body.format ?? 'webp',
    ...(body.output_compression !== undefined
      ? { encoderQuality: Math.max(1, body.output_compression) }
      : {}),
    safeMode: body.safe_mode ?? true,
    hideWatermark: body.hide_watermark ?? false,
    embedExif: body.embed_exif_metadata ?? false,
    returnBinary,
    ...(body.style_preset ? { stylePreset: body.style_preset } : {}),
    enhance: body.enhance_prompt ?? false,
    styleReferences: references.map((r) => ({ image: r.image, strength: r.strength ?? 0.5 })),
    ...(body.anon_user_id ? { anonUserId: body.anon_user_id } : {}),
  };
}
