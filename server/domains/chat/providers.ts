/**
 * Which provider serves a catalogue backend: the one embedded local engine, or one OpenAI-compatible adapter
 * per upstream (created once, keyed by name and URL), with its key read from the variable the catalogue names.
 */
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createLocalChatEngine } from '../../providers/chat/local.ts';
import { createOpenAiCompatibleProvider } from '../../providers/chat/openai-compatible.ts';
import type { ChatProvider } from '../../providers/chat/types.ts';
import { createProviderRegistry } from '../../providers/registry.ts';

export function createChatProviders(deps: { config: Config; metrics?: Metrics; fetch?: typeof fetch }) {
  const local = createLocalChatEngine({ tokenDelayMs: deps.config.chat.localTokenDelayMs });
  return createProviderRegistry<ChatProvider>(deps, {
    label: 'chat',
    local: local,
    upstream: createOpenAiCompatibleProvider,
    defaultTimeoutMs: deps.config.chat.upstreamTimeoutMs,
  });
}
