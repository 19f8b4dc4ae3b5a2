/**
 * Which provider serves a catalogue backend, for every kind of provider: the one embedded engine for a
 * `local` backend, or one upstream adapter per upstream backend (created once, keyed by name, URL and
 * upstream model), with its API key read from the variable the catalogue names and its latency reported to
 * the metrics under `<label>:<backend name>`.
 */
import type { Backend } from '../catalog/types.ts';
import type { Config } from '../config.ts';
import type { Metrics } from '../observability/metrics.ts';

/** What every upstream adapter is built from. */
export type UpstreamAdapterOptions = {
  name: string;
  baseUrl: string;
  upstreamModel: string;
  timeoutMs: number;
  apiKey?: string;
  fetch?: typeof fetch;
  observe: (outcome: string, seconds: number) => void;
};

export type ProviderRegistryDeps = { config: Config; metrics?: Metrics; fetch?: typeof fetch };

export function createProviderRegistry<P>(
  deps: ProviderRegistryDeps,
  options: {
    /** Metrics label of the provider kind, e.g. `chat`. */
    label: string;
    local: P;
    upstream: (options: UpstreamAdapterOptions) => P;
    /** When the backend sets no `timeoutMs`. */
    defaultTimeoutMs: number;
  },
): (backend: Backend) => P {
  const upstreams = new Map<string, P>();
  return (backend) => {
    if (backend.kind === 'local') return options.local;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = options.upstream({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        timeoutMs: backend.timeoutMs ?? options.defaultTimeoutMs,
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
        observe: (outcome, seconds) =>
          deps.metrics?.observeUpstream(`${options.label}:${backend.name}`, outcome, seconds),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}
