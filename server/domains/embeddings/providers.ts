/**
 * Which provider serves a catalogue backend for embeddings: the embedded hashing engine, or one
 * OpenAI-compatible adapter per upstream (created once), with its key read from the variable the catalogue names.
 */
import type { CatalogService } from '../../catalog/service.ts';
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createLocalEmbeddingEngine } from '../../providers/embeddings/local.ts';
import { createOpenAiCompatibleEmbeddings } from '../../providers/embeddings/openai-compatible.ts';
import type { EmbeddingProvider } from '../../providers/embeddings/types.ts';
import { createProviderRegistry } from '../../providers/registry.ts';
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
  return createProviderRegistry<EmbeddingProvider>(deps, {
    label: 'embeddings',
    local: local,
    upstream: createOpenAiCompatibleEmbeddings,
    defaultTimeoutMs: deps.config.chat.upstreamTimeoutMs,
  });
}
