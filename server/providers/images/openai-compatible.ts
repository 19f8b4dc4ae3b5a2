/**
 * The OpenAI-compatible upstream image adapter: `POST <baseUrl>/images/generations` with `response_format:
 * b64_json`, the size as the nearest of OpenAI's sizes (the domain resizes the result to the exact size asked),
 * and the end user in `user`. Seeds, negative prompts, steps and style options have no OpenAI parameter and
 * are not sent. The upstream is distrusted: a time limit on the whole answer, a cap on the bytes read, a check
 * of the answer's shape, exactly `n` images, each one a PNG, JPEG or WebP that a decoder reads. HTTP failures
 * map to the provider error kinds (429/503 capacity, 408/504 timeout, a `content_policy_violation` the content
 * policy, 400/404/422 the upstream's refusal, the rest failed).
 */
import sharp from 'sharp';
import {
  readBodyCapped,
  redactSecret,
  redactUrl,
  type UpstreamAdapterOptions,
  upstreamError,
} from '../http.ts';
import {
  type ImageProvider,
  ImageProviderError,
  type ImageProviderRequest,
  type ImageProviderResult,
} from './types.ts';

/** The shared adapter options (here `timeoutMs` bounds the whole answer), and a cap on returned pixels. */
export type OpenAiCompatibleImageOptions = UpstreamAdapterOptions & {
  /** Most pixels accepted in one returned image. */
  maxPixels?: number;
};

/** The sizes OpenAI-compatible servers accept, as [width, height]. */
export const OPENAI_SIZES: readonly [number, number][] = [
  [256, 256],
  [512, 512],
  [1024, 1024],
  [1536, 1024],
  [1024, 1536],
  [1792, 1024],
  [1024, 1792],
];

/** The OpenAI size of the closest shape (then the closest area) to `width` × `height`. */
export function nearestOpenAiSize(width: number, height: number): string {
  const ratio = Math.log(width / height);
  const area = width * height;
  let best = OPENAI_SIZES[2] as [number, number];
  let bestScore = Number.POSITIVE_INFINITY;
  for (const size of OPENAI_SIZES) {
    const score =
      Math.abs(Math.log(size[0] / size[1]) - ratio) * 10 + Math.abs(Math.log((size[0] * size[1]) / area));
    if (score < bestScore) {
      bestScore = score;
      best = size;
    }
  }
  return `${best[0]}x${best[1]}`;
}

export function createOpenAiCompatibleImageProvider(options: OpenAiCompatibleImageOptions): ImageProvider {
  const doFetch = options.fetch ?? fetch;
  const maxBytes = options.maxBytes ?? 64 * 1024 * 1024;
  const maxPixels = options.maxPixels ?? 4096 * 4096;
  const endpoint = `${options.baseUrl.replace(/\/+$/, '')}/images/generations`;

  return {
    name: options.name,
    async generate(request: ImageProviderRequest): Promise<ImageProviderResult> {
      const started = performance.now();
      let outcome = 'ok';
      const timer = new AbortController();
      const timeout = setTimeout(() => timer.abort(), options.timeoutMs);
      const signal = request.signal ? AbortSignal.any([request.signal, timer.signal]) : timer.signal;
      const fail = (
        kind: ImageProviderError['kind'],
        message: string,
        extra: { cause?: unknown; retryAfter?: number } = {},
      ) => {
        outcome = kind;
        return new ImageProviderError(kind, message, extra);
      };
      const translate = (error: unknown): unknown => {
        if (error instanceof ImageProviderError) return error;
        if (request.signal?.aborted) {
          outcome = 'client_abort';
          return error;
        }
        if (timer.signal.aborted)
          return fail('timeout', `Upstream ${options.name} did not answer within ${options.timeoutMs} ms`, {
            cause: error,
          });
        return fail(
          'failed',
          `Upstream ${options.name} (${redactUrl(endpoint)}) failed: ${(error as Error)?.message ?? error}`,
          { cause: error },
        );
      };
      const body: Record<string, unknown> = {
        model: options.upstreamModel,
        // OpenAI has no style parameter: the preset is named in the prompt.
        prompt: request.stylePreset ? `${request.prompt}, ${request.stylePreset} style` : request.prompt,
        n: request.variants,
        size: nearestOpenAiSize(request.width, request.height),
        response_format: 'b64_json',
        ...(request.quality ? { quality: request.quality } : {}),
        ...(request.user ? { user: request.user } : {}),
      };
      try {
        let raw: Buffer | undefined;
        let response: Response;
        try {
          response = await doFetch(endpoint, {
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              accept: 'application/json',
              ...(options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}),
            },
            body: JSON.stringify(body),
            signal,
          });
          raw = await readBodyCapped(response, response.status === 200 ? maxBytes : 64 * 1024);
        } catch (error) {
          throw translate(error);
        }
        if (response.status !== 200) {
          const detail = upstreamError(raw?.toString('utf8') ?? '');
          const message = redactSecret(detail.message ?? `status ${response.status}`, options.apiKey);
          const retry = Number(response.headers.get('retry-after'));
          const retryAfter = Number.isFinite(retry) && retry > 0 ? retry : undefined;
          if (response.status === 429 || response.status === 503 || response.status === 529)
            throw fail('capacity', `Upstream ${options.name} is at capacity: ${message}`, {
              ...(retryAfter ? { retryAfter } : {}),
            });
          if (response.status === 408 || response.status === 504)
            throw fail('timeout', `Upstream ${options.name} timed out: ${message}`);
          if (detail.code === 'content_policy_violation' || detail.code === 'CONTENT_POLICY_VIOLATION')
            throw fail('content_policy', message);
          if (response.status === 400 || response.status === 404 || response.status === 422)
            throw fail('bad_request', message);
          throw fail('failed', `Upstream ${options.name} answered ${response.status}: ${message}`);
        }
        if (!raw) throw fail('failed', `Upstream ${options.name} answer exceeds ${maxBytes} bytes`);
        let parsed: { data?: unknown };
        try {
          parsed = JSON.parse(raw.toString('utf8')) as { data?: unknown };
        } catch (error) {
          throw fail('failed', `Upstream ${options.name} answered with something that is not JSON`, {
            cause: error,
          });
        }
        if (!Array.isArray(parsed.data) || parsed.data.length !== request.variants)
          throw fail(
            'failed',
            `Upstream ${options.name} returned ${Array.isArray(parsed.data) ? parsed.data.length : 'no'} images for ${request.variants} asked`,
          );
        const images: ImageProviderResult['images'] = [];
        for (const item of parsed.data as { b64_json?: unknown }[]) {
          if (typeof item?.b64_json !== 'string' || item.b64_json.length === 0)
            throw fail('failed', `Upstream ${options.name} returned an image without b64_json`);
          const data = Buffer.from(item.b64_json, 'base64');
          let format: string | undefined;
          let pixels = 0;
          try {
            const meta = await sharp(data).metadata();
            format = meta.format;
            pixels = meta.width * meta.height;
          } catch (error) {
            throw fail('failed', `Upstream ${options.name} returned data that is not an image`, {
              cause: error,
            });
          }
          if (!format || !['png', 'jpeg', 'webp'].includes(format))
            throw fail(
              'failed',
              `Upstream ${options.name} returned an image in an unexpected format (${format})`,
            );
          if (pixels > maxPixels)
            throw fail(
              'failed',
              `Upstream ${options.name} returned an image larger than ${maxPixels} pixels`,
            );
          images.push({ kind: 'encoded', data });
        }
        return { images };
      } catch (error) {
        if (outcome === 'ok') outcome = request.signal?.aborted ? 'client_abort' : 'failed';
        throw error;
      } finally {
        clearTimeout(timeout);
        options.observe?.(outcome, (performance.now() - started) / 1000);
      }
    },
  };
}
