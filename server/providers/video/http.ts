/**
 * The upstream video adapter: drives a job-based HTTP video API that follows this service's own video
 * lifecycle (another instance of it, or any gateway with the same interface):
 *
 *   POST {baseUrl}/video/queue     {model, prompt, duration, resolution, aspect_ratio?, audio, seed, …} -> {queue_id}
 *   POST {baseUrl}/video/retrieve  {model, queue_id} -> 200 JSON {status: PROCESSING|COMPLETED, download_url?}
 *                                                       | 200 video/mp4 | 422 content policy | 4xx/5xx failure
 *   POST {baseUrl}/video/complete  {model, queue_id} -> {success}
 *
 * The upstream's `queue_id` is reported as the job's handle before polling starts, so a worker that takes the job
 * over after a crash resumes polling the same upstream job instead of paying for a second one. Every reply is
 * distrusted: per-request timeouts, a deadline for the whole job, a size cap on the video, an MP4 signature
 * check, and failures mapped to the provider error kinds.
 */

import { readBodyCapped, redactSecret } from '../http.ts';
import {
  type VideoGenerationRequest,
  type VideoProvider,
  VideoProviderError,
  type VideoResult,
  type VideoRunContext,
} from './types.ts';

export type HttpVideoProviderOptions = {
  name: string;
  /** Base URL of the upstream API (`https://host/api/v1`). */
  baseUrl: string;
  apiKey?: string;
  /** The model name sent upstream. */
  upstreamModel: string;
  /** Time cap of one HTTP request (default 30 s). */
  requestTimeoutMs?: number;
  /** Time cap of the whole job, from the first poll (default 30 minutes). */
  jobTimeoutMs?: number;
  /** Pause between polls (default 2 s). */
  pollIntervalMs?: number;
  /** Largest video accepted (default 256 MB). */
  maxBytes?: number;
  fetch?: typeof fetch;
  /** Clock, for the job deadline. */
  now?: () => number;
};

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });

/** True when the bytes start like an ISO base media file (`ftyp` box). */
export function looksLikeMp4(bytes: Uint8Array): boolean {
  return bytes.length >= 12 && Buffer.from(bytes.subarray(4, 8)).toString('latin1') === 'ftyp';
}

function errorText(body: unknown, fallback: string): string {
  const error = (body as { error?: unknown } | null)?.error;
  if (typeof error === 'string') return error.slice(0, 500);
  const nested = (error as { message?: unknown } | undefined)?.message;
  return typeof nested === 'string' ? nested.slice(0, 500) : fallback;
}

export function createHttpVideoProvider(options: HttpVideoProviderOptions): VideoProvider {
  const doFetch = options.fetch ?? fetch;
  const now = options.now ?? Date.now;
  const base = options.baseUrl.replace(/\/+$/, '');
  const requestTimeoutMs = options.requestTimeoutMs ?? 30_000;
  const jobTimeoutMs = options.jobTimeoutMs ?? 30 * 60_000;
  const pollIntervalMs = options.pollIntervalMs ?? 2_000;
  const maxBytes = options.maxBytes ?? 256 * 1024 * 1024;

  async function call(
    path: string,
    body: unknown,
    signal: AbortSignal,
    method: 'POST' | 'GET' = 'POST',
  ): Promise<Response> {
    const timeout = AbortSignal.timeout(requestTimeoutMs);
    const url = path.startsWith('http') ? path : `${base}${path}`;
    // The key goes only to the upstream itself, never to a download host it links to.
    const own = url.startsWith(`${base}/`);
    try {
      return await doFetch(url, {
        method,
        headers: {
          accept: 'application/json, video/mp4',
          ...(method === 'POST' ? { 'content-type': 'application/json' } : {}),
          ...(options.apiKey && own ? { authorization: `Bearer ${options.apiKey}` } : {}),
        },
        ...(method === 'POST' ? { body: JSON.stringify(body) } : {}),
        signal: AbortSignal.any([signal, timeout]),
        redirect: 'error',
      });
    } catch (error) {
      if (signal.aborted)
        throw new VideoProviderError('failed', 'Video generation was stopped', { cause: error });
      if (timeout.aborted)
        throw new VideoProviderError('timeout', `The video upstream ${options.name} did not answer in time`);
      throw new VideoProviderError('capacity', `The video upstream ${options.name} is unreachable`, {
        cause: error,
      });
    }
  }

  async function json(response: Response): Promise<unknown> {
    const text = await readCapped(response, 1024 * 1024).catch(() => Buffer.alloc(0));
    try {
      return JSON.parse(text.toString('utf8')) as unknown;
    } catch {
      return undefined;
    }
  }

  /** Maps a failed upstream answer to a provider error. */
  async function failure(response: Response, what: string): Promise<VideoProviderError> {
    const body = await json(response);
    const message = redactSecret(
      errorText(body, `${what} failed with status ${response.status}`),
      options.apiKey,
    );
    if (response.status === 422) {
      const recommended = (body as { recommendedModel?: unknown } | undefined)?.recommendedModel;
      return new VideoProviderError('content_policy', message, {
        ...(typeof recommended === 'string' ? { recommendedModel: recommended } : {}),
      });
    }
    if (response.status === 429 || response.status === 503)
      return new VideoProviderError('capacity', message);
    if (response.status === 504) return new VideoProviderError('timeout', message);
    if (response.status === 400 || response.status === 413)
      return new VideoProviderError('bad_request', message);
    return new VideoProviderError('failed', `The video upstream ${options.name}: ${message}`);
  }

  async function queue(request: VideoGenerationRequest, signal: AbortSignal): Promise<string> {
    const response = await call(
      '/video/queue',
      {
        model: options.upstreamModel,
        prompt: request.prompt,
        ...(request.negativePrompt ? { negative_prompt: request.negativePrompt } : {}),
        duration: request.duration,
        resolution: request.resolution,
        ...(request.aspectRatio ? { aspect_ratio: request.aspectRatio } : {}),
        audio: request.audio,
        seed: request.seed,
        ...(request.imageUrl ? { image_url: request.imageUrl } : {}),
        ...(request.endImageUrl ? { end_image_url: request.endImageUrl } : {}),
      },
      signal,
    );
    if (!response.ok) throw await failure(response, 'Queuing the video');
    const id = ((await json(response)) as { queue_id?: unknown } | undefined)?.queue_id;
    if (typeof id !== 'string' || id.length === 0 || id.length > 256) {
      throw new VideoProviderError('failed', `The video upstream ${options.name} returned no queue_id`);
    }
    return id;
  }

  async function video(response: Response): Promise<VideoResult> {
    const bytes = await readCapped(response, maxBytes);
    if (!looksLikeMp4(bytes)) {
      throw new VideoProviderError(
        'failed',
        `The video upstream ${options.name} returned something that is not an MP4`,
      );
    }
    return { contentType: 'video/mp4', bytes };
  }

  return {
    name: options.name,
    async generate(request, context: VideoRunContext): Promise<VideoResult> {
      const { signal } = context;
      let handle = context.resume;
      if (!handle) {
        handle = await queue(request, signal);
        await context.onHandle(handle);
      }
      const deadline = now() + jobTimeoutMs;
      for (;;) {
        if (signal.aborted) throw new VideoProviderError('failed', 'Video generation was stopped');
        if (now() > deadline) {
          throw new VideoProviderError(
            'timeout',
            `The video upstream ${options.name} did not finish in time`,
          );
        }
        let response: Response;
        try {
          response = await call(
            '/video/retrieve',
            { model: options.upstreamModel, queue_id: handle },
            signal,
          );
        } catch (error) {
          // A poll that did not get through says nothing about the job: try again until the deadline.
          if (error instanceof VideoProviderError && error.kind !== 'failed') {
            await sleep(pollIntervalMs, signal);
            continue;
          }
          throw error;
        }
        if (response.status === 429 || response.status === 503) {
          await response.body?.cancel().catch(() => undefined);
          await sleep(pollIntervalMs, signal);
          continue;
        }
        if (!response.ok) throw await failure(response, 'The video job');
        const type = response.headers.get('content-type') ?? '';
        if (type.startsWith('video/')) return video(response);
        const status = (await json(response)) as { status?: unknown; download_url?: unknown } | undefined;
        if (status?.status === 'COMPLETED') {
          if (typeof status.download_url !== 'string' || !/^https?:\/\//.test(status.download_url)) {
            throw new VideoProviderError(
              'failed',
              `The video upstream ${options.name} gave no download link`,
            );
          }
          const download = await call(status.download_url, undefined, signal, 'GET');
          if (!download.ok) throw await failure(download, 'Downloading the video');
          return video(download);
        }
        if (status?.status !== 'PROCESSING') {
          throw new VideoProviderError(
            'failed',
            `The video upstream ${options.name} sent an unreadable status`,
          );
        }
        await sleep(pollIntervalMs, signal);
      }
    },
    async discard(handle: string): Promise<void> {
      try {
        const response = await call(
          '/video/complete',
          { model: options.upstreamModel, queue_id: handle },
          AbortSignal.timeout(requestTimeoutMs),
        );
        await response.body?.cancel().catch(() => undefined);
      } catch {
        // Best effort: the upstream expires stored media on its own.
      }
    },
  };
}

/** The body within `maxBytes`, or the size-limit failure. */
async function readCapped(response: Response, maxBytes: number): Promise<Buffer> {
  const bytes = await readBodyCapped(response, maxBytes);
  if (!bytes) throw new VideoProviderError('failed', 'The upstream video exceeds the size limit');
  return bytes;
}
