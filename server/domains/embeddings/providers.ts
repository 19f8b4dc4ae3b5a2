/**
 * Which provider serves a catalogue backend for embeddings: the embedded hashing engine, or one
 * OpenAI-compatible adapter per upstream (created once), with its key read from the variable the catalogue names.
 */
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend } from '../../catalog/types.ts';
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createLocalEmbeddingEngine } from '../../providers/embeddings/local.ts';
import { createOpenAiCompatibleEmbeddings } from '../../providers/embeddings/openai-compatible.ts';
import type { EmbeddingProvider } from '../../providers/embeddings/types.ts';
import { DEFAULT_DIMENSIONS } from './service.ts';

export function createEmbeddingProviders(deps: {
  config: Config;
  catalog: CatalogService;
  metrics?: Metrics;
  fetch?: typeof fetch;
}) {
  const local = createLocalEmbeddingEngine({
    nativeDimensions: (model) => deps.catalog.getModel(model)?.spec.embeddingDimensions ?? DEFAULT_DIMENSIONS,
  });
  const upstreams = new Map<string, EmbeddingProvider>();
  return (backend: Backend): EmbeddingProvider => {
    if (backend.kind === 'local') return local;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = createOpenAiCompatibleEmbeddings({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        timeoutMs: backend.timeoutMs ?? deps.config.chat.upstreamTimeoutMs,
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
        observe: (outcome, seconds) =>
          deps.metrics?.observeUpstream(`embeddings:${backend.name}`, outcome, seconds),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}
