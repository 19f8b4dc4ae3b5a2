/**
 * Which provider serves a catalogue backend of a video model: the one embedded local engine, or one HTTP
 * adapter per upstream (created once, keyed by name, URL and model). For video models an upstream backend
 * (`kind: openai-compatible` in the catalogue) is an API that follows this service's video lifecycle
 * (`/video/queue`, `/video/retrieve`, `/video/complete`) under its `baseUrl`.
 */
import type { Backend } from '../../catalog/types.ts';
import type { Config } from '../../config.ts';
import { createHttpVideoProvider } from '../../providers/video/http.ts';
import { createLocalVideoEngine } from '../../providers/video/local.ts';
import type { VideoProvider } from '../../providers/video/types.ts';

export function createVideoProviders(deps: {
  config: Config;
  fetch?: typeof fetch;
  /** Pause between polls of an upstream job. */
  upstreamPollMs?: number;
}) {
  const local = createLocalVideoEngine();
  const upstreams = new Map<string, VideoProvider>();
  return (backend: Backend): VideoProvider => {
    if (backend.kind === 'local') return local;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = createHttpVideoProvider({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        ...(backend.timeoutMs ? { requestTimeoutMs: backend.timeoutMs } : {}),
        ...(deps.upstreamPollMs !== undefined ? { pollIntervalMs: deps.upstreamPollMs } : {}),
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}
