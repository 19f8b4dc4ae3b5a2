/**
 * Which provider serves a catalogue backend for speech: the embedded eSpeak NG engine (its worker starts on
 * first use), or one OpenAI-compatible adapter per upstream (created once), with its key read from the
 * variable the catalogue names.
 */
import type { Backend } from '../../catalog/types.ts';
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createEspeakEngine } from '../../providers/audio/espeak.ts';
import { createOpenAiCompatibleSpeech } from '../../providers/audio/openai-compatible-speech.ts';
import { createOpenAiCompatibleTranscription } from '../../providers/audio/openai-compatible-transcription.ts';
import type { SpeechProvider } from '../../providers/audio/speech-types.ts';
import type { TranscriptionProvider } from '../../providers/audio/transcription-types.ts';
import { ChatProviderError } from '../../providers/chat/types.ts';

export function createSpeechProviders(deps: { config: Config; metrics?: Metrics; fetch?: typeof fetch }) {
  const local = createEspeakEngine();
  const upstreams = new Map<string, SpeechProvider>();
  return (backend: Backend): SpeechProvider => {
    if (backend.kind === 'local') return local;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = createOpenAiCompatibleSpeech({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        timeoutMs: backend.timeoutMs ?? deps.config.chat.upstreamTimeoutMs,
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
        observe: (outcome, seconds) =>
          deps.metrics?.observeUpstream(`speech:${backend.name}`, outcome, seconds),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}

/**
 * Which provider serves a catalogue backend for transcription: only OpenAI-compatible upstreams (no recogniser
 * is embedded; the domain never routes to a `local` backend).
 */
export function createTranscriptionProviders(deps: {
  config: Config;
  metrics?: Metrics;
  fetch?: typeof fetch;
}) {
  const upstreams = new Map<string, TranscriptionProvider>();
  const none: TranscriptionProvider = {
    name: 'local',
    transcribe: async () => {
      throw new ChatProviderError('failed', 'No speech recogniser is embedded');
    },
  };
  return (backend: Backend): TranscriptionProvider => {
    if (backend.kind === 'local') return none;
    const key = `${backend.name}\u0000${backend.baseUrl}\u0000${backend.upstreamModel}`;
    let provider = upstreams.get(key);
    if (!provider) {
      const apiKey = backend.apiKeyEnv ? deps.config.readSecret(backend.apiKeyEnv) : undefined;
      provider = createOpenAiCompatibleTranscription({
        name: backend.name,
        baseUrl: backend.baseUrl,
        upstreamModel: backend.upstreamModel,
        timeoutMs: backend.timeoutMs ?? deps.config.chat.upstreamTimeoutMs,
        ...(apiKey ? { apiKey } : {}),
        ...(deps.fetch ? { fetch: deps.fetch } : {}),
        observe: (outcome, seconds) =>
          deps.metrics?.observeUpstream(`transcription:${backend.name}`, outcome, seconds),
      });
      upstreams.set(key, provider);
    }
    return provider;
  };
}
