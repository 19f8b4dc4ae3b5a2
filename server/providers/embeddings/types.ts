/**
 * The embedding provider port: what the embeddings domain asks of a backend (the embedded hashing engine, an
 * OpenAI-compatible upstream). A provider turns a batch of texts into one vector per text, in input order.
 * Failures are thrown as `ChatProviderError` (the provider error shared by every inference port) with a kind
 * the domain maps to the interface's statuses.
 */

export type EmbeddingProviderRequest = {
  /** The model name the backend knows (the catalogue id, or the upstream's own name). */
  model: string;
  inputs: readonly string[];
  /** Length of every returned vector (the model's native length, or a shorter one the caller asked for). */
  dimensions: number;
  /** Whether `dimensions` was asked for explicitly (an upstream is then sent the field). */
  customDimensions: boolean;
  signal?: AbortSignal;
};

export type EmbeddingProviderResult = {
  /** One vector per input, in input order, each of length `dimensions`. */
  vectors: Float32Array[];
  /** Input tokens as the backend counted them, when it reports them. */
  promptTokens?: number;
};

export type EmbeddingProvider = {
  /** Stable backend name (the `x-service-model-router` header). */
  readonly name: string;
  embed(request: EmbeddingProviderRequest): Promise<EmbeddingProviderResult>;
};
