/**
 * The video provider port: what the video worker asks of any video backend (the embedded local engine, an
 * HTTP job-based upstream). A generation may take minutes and may outlive the worker that started it, so a
 * provider reports a resumable handle (`onHandle`, stored with the job) as soon as it has one, and a later
 * worker passes it back as `resume` instead of starting the work again. Failures are thrown as
 * `VideoProviderError` with a kind the domain maps to the interface's answers.
 */

/** One job as a backend sees it: every option already checked against the model. */
export type VideoGenerationRequest = {
  /** The model name the backend knows (the catalogue id, or the upstream's own name). */
  model: string;
  prompt: string;
  negativePrompt?: string;
  /** Whole seconds. */
  durationSeconds: number;
  /** The duration as the interface names it (`5s`), for upstreams. */
  duration: string;
  /** Resolution tier (`720p`). */
  resolution: string;
  /** Frame shape (`16:9`); absent for models whose shape follows the input image. */
  aspectRatio?: string;
  audio: boolean;
  seed: number;
  /** First and last frames (data URLs or URLs). */
  imageUrl?: string;
  endImageUrl?: string;
};

export type VideoResult = { contentType: 'video/mp4'; bytes: Buffer };

export type VideoRunContext = {
  /** Aborted when the worker stops or loses the job. */
  signal: AbortSignal;
  /** The handle a previous attempt reported, if any. */
  resume?: string;
  /** Persists a handle before the provider starts waiting on it. */
  onHandle(handle: string): Promise<void>;
};

export type VideoProvider = {
  /** Stable backend name (stored with the job, the `x-service-model-router` header). */
  readonly name: string;
  /** Produces the video, or throws `VideoProviderError`. */
  generate(request: VideoGenerationRequest, context: VideoRunContext): Promise<VideoResult>;
  /** Frees what the backend keeps for a finished job (best effort; never throws). */
  discard?(handle: string): Promise<void>;
};

/**
 * - `content_policy`: the backend refused the content (retrieve answers 422, credits refunded)
 * - `bad_request`: the backend refused the request itself (job failed, refunded)
 * - `capacity`: overloaded; the job may be retried later
 * - `timeout`: no answer in time
 * - `failed`: any other failure (retrieve answers 500, refunded)
 */
export type VideoProviderErrorKind = 'content_policy' | 'bad_request' | 'capacity' | 'timeout' | 'failed';

export class VideoProviderError extends Error {
  override readonly name = 'VideoProviderError';
  readonly kind: VideoProviderErrorKind;
  /** A model the backend suggests for a refused request. */
  readonly recommendedModel: string | undefined;
  constructor(
    kind: VideoProviderErrorKind,
    message: string,
    options: { cause?: unknown; recommendedModel?: string } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.kind = kind;
    this.recommendedModel = options.recommendedModel;
  }
}
