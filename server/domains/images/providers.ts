/**
 * Which provider serves a catalogue backend of an image model: the one embedded local engine, or one
 * OpenAI-compatible adapter per upstream (created once, keyed by name, URL and model), with its key read from
 * the variable the catalogue names. An upstream waits `timeoutMs` from the catalogue, else two minutes.
 */
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createLocalImageEngine } from '../../providers/images/local.ts';
import { createOpenAiCompatibleImageProvider } from '../../providers/images/openai-compatible.ts';
import type { ImageProvider } from '../../providers/images/types.ts';
import { createProviderRegistry } from '../../providers/registry.ts';

export const DEFAULT_IMAGE_UPSTREAM_TIMEOUT_MS = 120_000;

export function createImageProviders(deps: { config: Config; metrics?: Metrics; fetch?: typeof fetch }) {
  const local = createLocalImageEngine();
  return createProviderRegistry<ImageProvider>(deps, {
    label: 'image',
    local: local,
    upstream: createOpenAiCompatibleImageProvider,
    defaultTimeoutMs: DEFAULT_IMAGE_UPSTREAM_TIMEOUT_MS,
  });
}
