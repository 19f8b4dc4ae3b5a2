/**
 * `POST /images/generations` (OpenAI) as a `POST /image/generate` request: `size` becomes the model's width
 * and height (pixel models: capped at 1280 per side keeping the shape, rounded to the model's divisor) or the
 * nearest aspect ratio it offers; `n` becomes variants; `quality` `hd`/`standard` read as `high`/`medium`
 * (`auto` leaves the model's default); `moderation: low` turns safe mode off; `output_format` (PNG by default)
 * and `output_compression` (the encoder quality, OpenAI's meaning: 100 is the best) carry over. `style`,
 * `background` and `user` have no effect.
 */
import type { ImageGenerateRequest, ImageGenerationsRequest } from '../../../generated/api.d.ts';
import type { CatalogModel } from '../../catalog/types.ts';
import { constraintsOf } from './options.ts';

const MAX_SIDE = 1280;

/** The nearest offered ratio to `width` × `height`, by log distance. */
export function nearestRatio(width: number, height: number, offered: readonly string[]): string | undefined {
  const target = Math.log(width / height);
  let best: string | undefined;
  let distance = Number.POSITIVE_INFINITY;
  for (const ratio of offered) {
    const match = /^(\d+):(\d+)$/.exec(ratio);
    if (!match) continue;
    const d = Math.abs(Math.log(Number(match[1]) / Number(match[2])) - target);
    if (d < distance) {
      distance = d;
      best = ratio;
    }
  }
  return best;
}

/** A pixel size within 1280 per side, same shape, each side a multiple of `divisor`. */
export function fitPixels(width: number, height: number, divisor: number) {
  const scale = Math.min(1, MAX_SIDE / Math.max(width, height));
  const side = (length: number) => Math.max(divisor, Math.floor((length * scale) / divisor) * divisor);
  return { width: side(width), height: side(height) };
}

export function toGenerateRequest(
  model: CatalogModel,
  body: ImageGenerationsRequest,
): ImageGenerateRequest & { output_compression?: number } {
  const c = constraintsOf(model);
  const request: ImageGenerateRequest & { output_compression?: number } = {
    model: model.id,
    prompt: body.prompt,
    variants: body.n ?? 1,
    format: body.output_format ?? 'png',
    safe_mode: body.moderation !== 'low',
  };
  const size = body.size && body.size !== 'auto' ? body.size.split('x').map(Number) : undefined;
  if (size && size.length === 2) {
    const [w, h] = size as [number, number];
    if ((c.sizing ?? 'pixels') === 'pixels')
      Object.assign(request, fitPixels(w, h, c.widthHeightDivisor ?? 1));
    else {
      const ratio = nearestRatio(w, h, c.aspectRatios ?? []);
      if (ratio) request.aspect_ratio = ratio;
    }
  }
  const quality = body.quality === 'hd' ? 'high' : body.quality === 'standard' ? 'medium' : body.quality;
  if (quality && quality !== 'auto') request.quality = quality;
  if (body.output_compression !== undefined) request.output_compression = body.output_compression;
  return request;
}
