/**
 * The image provider port: what the image domain asks of any image backend (the embedded local engine, an
 * OpenAI-compatible upstream). A provider draws `variants` images for one normalised request and returns them
 * as pixels or as encoded files; the domain does everything after that (resizing to the exact size, safe-mode
 * blur, watermark, EXIF, the output format), so every backend's images are finished the same way. Failures
 * are thrown as `ImageProviderError` with a kind the domain maps to the interface's statuses.
 */

export type ImageQuality = 'low' | 'medium' | 'high';

/** A style reference, already decoded to an image file (PNG, JPEG, WebP, …) the domain checked. */
export type ProviderStyleReference = { image: Buffer; strength: number };

export type ImageProviderRequest = {
  /** The model name the backend knows (the catalogue id, or the upstream's own name). */
  model: string;
  /** The prompt to draw: after enhancement and with the style preset applied. */
  prompt: string;
  negativePrompt?: string;
  /** The size the domain will deliver; a backend may draw another size of the same shape. */
  width: number;
  height: number;
  /** Seed of the first variant; variant `i` uses `seed + i`. */
  seed: number;
  variants: number;
  steps: number;
  cfgScale?: number;
  loraStrength?: number;
  stylePreset?: string;
  styleReferences: ProviderStyleReference[];
  quality?: ImageQuality;
  /** The end user for upstream attribution: `<account id>||<anon_user_id>` or the account id. */
  user?: string;
  signal?: AbortSignal;
};

/** One generated image: raw interleaved pixels, or an encoded file. */
export type ProviderImage =
  | { kind: 'raw'; data: Buffer; width: number; height: number; channels: 3 | 4 }
  | { kind: 'encoded'; data: Buffer };

export type ImageProviderResult = { images: ProviderImage[] };

export type ImageProvider = {
  /** Stable backend name (the `x-service-model-router` header). */
  readonly name: string;
  generate(request: ImageProviderRequest): Promise<ImageProviderResult>;
};

/**
 * - `bad_request`: the backend refused the request itself (400 with its message)
 * - `content_policy`: the backend refused the prompt under its content policy (422)
 * - `capacity`: overloaded or rate-limited (503)
 * - `timeout`: no answer in time (504)
 * - `failed`: any other failure, including an answer that is not what was asked (500)
 */
export type ImageProviderErrorKind = 'bad_request' | 'content_policy' | 'capacity' | 'timeout' | 'failed';

export class ImageProviderError extends Error {
  override readonly name = 'ImageProviderError';
  readonly kind: ImageProviderErrorKind;
  /** Seconds after which a retry may succeed (from an upstream `Retry-After`). */
  readonly retryAfter: number | undefined;
  constructor(
    kind: ImageProviderErrorKind,
    message: string,
    options: { cause?: unknown; retryAfter?: number } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.kind = kind;
    this.retryAfter = options.retryAfter;
  }
}
