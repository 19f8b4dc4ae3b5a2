/**
 * Which provider serves a catalogue backend of an image model: the one embedded local engine, or one
 * OpenAI-compatible adapter per upstream (created once, keyed by name, URL and model), with its key read from
 * the variable the catalogue names. An upstream waits `timeoutMs` from the catalogue, else two minutes.
 */
import type { Backend } from '../../catalog/types.ts';
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createLocalImageEngine } from '../../providers/images/local.ts';
import { createOpenAiCompatibleImageProvider } from '../../providers/images/openai-compatible.ts';
import type { ImageProvider } from '../../providers/images/types.ts';

export const DEFAULT_IMAGE_UPSTREAM_TIMEOUT_MS = 120_000;

export function createImageProviders(deps: { config: Config; metrics?: Metrics; fetch?: typeof fetch }) {
  const local = createLocalImageEngine();
  const upstreams = new Map<string, ImageProvider>();
  return (backend: Backend): ImageProvider => {
    if (backend.kind === 'local') return local;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = createOpenAiCompatibleImageProvider({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        timeoutMs: backend.timeoutMs ?? DEFAULT_IMAGE_UPSTREAM_TIMEOUT_MS,
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
        observe: (outcome, seconds) =>
          deps.metrics?.observeUpstream(`image:${backend.name}`, outcome, seconds),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}
