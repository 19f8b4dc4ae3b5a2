/**
 * Video job options checked against the model, and the job's price. The same function prices `POST
 * /video/quote` and `POST /video/queue`, so queuing the quoted parameters charges exactly the quoted amount.
 *
 * Price = seconds × the model's per-second price at the resolution, plus seconds × its audio price per second
 * when a soundtrack is produced (catalogue `video.pricePerSecond` / `audioPricePerSecond`, in nano-USD).
 */
import type { CatalogModel } from '../../catalog/types.ts';
import { badRequest } from '../../http/errors.ts';
import type { CaptureItem } from '../../storage/ledger.ts';

export const DEFAULT_PROMPT_LIMIT = 2500;

export type VideoPriceInput = {
  duration: string;
  resolution?: string;
  aspect_ratio?: string;
  audio?: boolean;
};

export type ResolvedVideoOptions = {
  /** The duration as sent (`5s`), `auto` resolved to the model's natural length. */
  duration: string;
  durationSeconds: number;
  resolution: string;
  /** Absent when the model takes its frame shape from the input image. */
  aspectRatio?: string;
  audio: boolean;
  priceNano: bigint;
  items: CaptureItem[];
};

function constraintsOf(model: CatalogModel) {
  const c = (model.spec.constraints ?? {}) as {
    durations?: string[];
    resolutions?: string[];
    aspect_ratios?: string[];
    audio?: boolean;
    audio_configurable?: boolean;
    prompt_character_limit?: number;
    model_type?: string;
  };
  return {
    durations: c.durations ?? [],
    resolutions: c.resolutions ?? [],
    aspectRatios: c.aspect_ratios ?? [],
    audio: c.audio ?? false,
    audioConfigurable: c.audio_configurable ?? false,
    promptLimit: c.prompt_character_limit ?? DEFAULT_PROMPT_LIMIT,
    modelType: c.model_type ?? 'text-to-video',
  };
}

export { constraintsOf as videoConstraints };

const seconds = (duration: string) => Number.parseInt(duration, 10);

/** Checks duration, resolution, aspect ratio and audio against the model and prices the job. */
export function resolveVideoOptions(model: CatalogModel, input: VideoPriceInput): ResolvedVideoOptions {
  const c = constraintsOf(model);
  const video = model.video;
  if (!video) throw badRequest(`Model ${model.id} has no video pricing`, 'INVALID_MODEL');

  let duration = input.duration;
  const listed = c.durations.map((d) => d.toLowerCase());
  if (duration.toLowerCase() === 'auto' && !listed.includes('auto')) {
    // The model's natural length: the first duration it lists.
    duration = c.durations.find((d) => Number.isFinite(seconds(d))) ?? duration;
  } else if (!listed.includes(duration.toLowerCase())) {
    throw badRequest(
      `Model ${model.id} does not support duration ${input.duration}; supported: ${c.durations.join(', ')}`,
      'INVALID_REQUEST',
      { _errors: [], duration: { _errors: [`Must be one of ${c.durations.join(', ')}`] } },
    );
  }
  const durationSeconds = seconds(duration);
  if (!Number.isFinite(durationSeconds) || durationSeconds <= 0) {
    throw badRequest(`Model ${model.id} cannot price duration ${input.duration}`);
  }

  const resolution =
    input.resolution ?? (c.resolutions.includes('720p') ? '720p' : (c.resolutions[0] ?? '720p'));
  if (!c.resolutions.includes(resolution)) {
    throw badRequest(
      `Model ${model.id} does not support resolution ${resolution}; supported: ${c.resolutions.join(', ')}`,
      'INVALID_REQUEST',
      { _errors: [], resolution: { _errors: [`Must be one of ${c.resolutions.join(', ')}`] } },
    );
  }

  let aspectRatio: string | undefined;
  if (c.aspectRatios.length > 0) {
    const asked = input.aspect_ratio;
    if (asked === undefined || asked === 'auto' || asked === 'adaptive') {
      aspectRatio = c.aspectRatios.includes('16:9') ? '16:9' : c.aspectRatios[0];
    } else if (c.aspectRatios.includes(asked)) {
      aspectRatio = asked;
    } else {
      throw badRequest(
        `Model ${model.id} does not support aspect ratio ${asked}; supported: ${c.aspectRatios.join(', ')}`,
        'INVALID_REQUEST',
        { _errors: [], aspect_ratio: { _errors: [`Must be one of ${c.aspectRatios.join(', ')}`] } },
      );
    }
  }

  // Models without a soundtrack ignore `audio`; models whose soundtrack cannot be turned off always make one.
  const audio = c.audio && (c.audioConfigurable ? (input.audio ?? true) : true);

  const perSecond = video.pricePerSecond[resolution];
  if (perSecond === undefined) throw badRequest(`Model ${model.id} has no price for ${resolution}`);
  const items: CaptureItem[] = [
    {
      sku: `video.seconds.${resolution}`,
      units: durationSeconds,
      unitPriceNano: perSecond,
      amountNano: BigInt(durationSeconds) * perSecond,
    },
  ];
  if (audio && video.audioPricePerSecond > 0n) {
    items.push({
      sku: 'video.audio_seconds',
      units: durationSeconds,
      unitPriceNano: video.audioPricePerSecond,
      amountNano: BigInt(durationSeconds) * video.audioPricePerSecond,
    });
  }
  const priceNano = items.reduce((sum, item) => sum + item.amountNano, 0n);
  return {
    duration,
    durationSeconds,
    resolution,
    ...(aspectRatio ? { aspectRatio } : {}),
    audio,
    priceNano,
    items,
  };
}
