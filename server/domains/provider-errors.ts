/**
 * A provider failure as the interface's status, the same way for every inference domain: at capacity is 503
 * (with the upstream's `Retry-After`), a refusal of the request itself 400 with its reason, a content-policy
 * refusal 422, no answer in time 504 where the operation documents it (chat) and 503 elsewhere, anything
 * else 500. Errors that already are `ApiError`s pass through.
 */
import { ApiError } from '../http/errors.ts';

/** What the provider error classes of every port have in common. */
export type ProviderFailure = Error & { kind: string; retryAfter?: number | undefined };

export type ProviderErrorMessages = { capacity: string; timeout: string; failed: string; policy?: string };

export function providerApiError(
  error: unknown,
  options: {
    isProviderError(error: unknown): error is ProviderFailure;
    messages: ProviderErrorMessages;
    /** 504 only where the operation documents it. */
    timeoutStatus: 503 | 504;
  },
): ApiError {
  if (error instanceof ApiError) return error;
  const { messages } = options;
  if (options.isProviderError(error)) {
    switch (error.kind) {
      case 'capacity':
        return new ApiError(503, messages.capacity, {
          code: 'MODEL_AT_CAPACITY',
          cause: error,
          ...(error.retryAfter ? { headers: { 'Retry-After': String(error.retryAfter) } } : {}),
        });
      case 'timeout':
        return new ApiError(options.timeoutStatus, messages.timeout, {
          code: 'REQUEST_TIMEOUT',
          cause: error,
        });
      case 'bad_request':
        return new ApiError(400, error.message, { code: 'UPSTREAM_REJECTED', cause: error });
      case 'content_policy':
        if (messages.policy) {
          return new ApiError(422, messages.policy, { code: 'CONTENT_POLICY_VIOLATION', cause: error });
        }
        break;
    }
  }
  return new ApiError(500, messages.failed, { code: 'INFERENCE_FAILED', cause: error });
}
