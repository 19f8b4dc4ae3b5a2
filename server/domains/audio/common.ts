/**
 * Pieces every media domain (embeddings, speech, transcription) shares: the per-process concurrency slots of a
 * model (503 when full), the mapping of provider failures to the interface's statuses, and the order in which
 * a request tries a model's backends (failing over on capacity and failures, never after a refusal).
 */
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import { ApiError } from '../../http/errors.ts';
import { ChatProviderError } from '../../providers/chat/types.ts';
import { AT_CAPACITY_MESSAGE } from '../concurrency.ts';
import { providerApiError } from '../provider-errors.ts';

export const MEDIA_MESSAGES = {
  capacity: AT_CAPACITY_MESSAGE,
  timeout: 'The model did not answer in time. Please try again later.',
  failed: 'Inference processing failed',
  proOnly: 'This model is only available to Pro users',
};

/** Rounds a nano-USD amount up: `ceil(a / b)`. */
export const ceilDiv = (a: bigint, b: bigint) => (a + b - 1n) / b;

/** The backends of a model, or 503 when none is configured. */
export function backendsOf(model: CatalogModel, what: string): readonly Backend[] {
  if (model.backends.length === 0)
    throw new ApiError(503, `No ${what} backend is configured for model ${model.id}`, {
      code: 'MODEL_OFFLINE',
    });
  return model.backends;
}

/** Runs `attempt` on each backend in turn while they fail with capacity or a failure. */
export async function withFailover<T>(
  backends: readonly Backend[],
  signal: AbortSignal | undefined,
  attempt: (backend: Backend) => Promise<T>,
): Promise<T> {
  let lastError: unknown;
  for (const backend of backends) {
    try {
      return await attempt(backend);
    } catch (error) {
      lastError = error;
      const retryable =
        error instanceof ChatProviderError && (error.kind === 'capacity' || error.kind === 'failed');
      if (!retryable || signal?.aborted) throw error;
    }
  }
  throw lastError;
}

/** A provider failure as the interface's status. */
export function mediaApiError(error: unknown): ApiError {
  // These operations declare no 504: a backend that did not answer in time is unavailable for now.
  return providerApiError(error, {
    isProviderError: (e) => e instanceof ChatProviderError,
    messages: MEDIA_MESSAGES,
    timeoutStatus: 503,
  });
}
