/**
 * Which provider serves a catalogue backend: the one embedded local engine, or one OpenAI-compatible adapter
 * per upstream (created once, keyed by name and URL), with its key read from the variable the catalogue names.
 */
import type { Backend } from '../../catalog/types.ts';
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createLocalChatEngine } from '../../providers/chat/local.ts';
import { createOpenAiCompatibleProvider } from '../../providers/chat/openai-compatible.ts';
import type { ChatProvider } from '../../providers/chat/types.ts';

export function createChatProviders(deps: { config: Config; metrics?: Metrics; fetch?: typeof fetch }) {
  const local = createLocalChatEngine({ tokenDelayMs: deps.config.chat.localTokenDelayMs });
  const upstreams = new Map<string, ChatProvider>();
  return (backend: Backend): ChatProvider => {
    if (backend.kind === 'local') return local;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = createOpenAiCompatibleProvider({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        timeoutMs: backend.timeoutMs ?? deps.config.chat.upstreamTimeoutMs,
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
        observe: (outcome, seconds) =>
          deps.metrics?.observeUpstream(`chat:${backend.name}`, outcome, seconds),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}
