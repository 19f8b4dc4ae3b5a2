/**
 * Which provider serves a catalogue backend for speech: the embedded eSpeak NG engine (its worker starts on
 * first use), or one OpenAI-compatible adapter per upstream (created once), with its key read from the
 * variable the catalogue names.
 */
import type { Config } from '../../config.ts';
import type { Metrics } from '../../observability/metrics.ts';
import { createEspeakEngine } from '../../providers/audio/espeak.ts';
import { createOpenAiCompatibleSpeech } from '../../providers/audio/openai-compatible-speech.ts';
import { createOpenAiCompatibleTranscription } from '../../providers/audio/openai-compatible-transcription.ts';
import type { SpeechProvider } from '../../providers/audio/speech-types.ts';
import type { TranscriptionProvider } from '../../providers/audio/transcription-types.ts';
import { ChatProviderError } from '../../providers/chat/types.ts';
import { createProviderRegistry } from '../../providers/registry.ts';

export function createSpeechProviders(deps: { config: Config; metrics?: Metrics; fetch?: typeof fetch }) {
  const local = createEspeakEngine();
  return createProviderRegistry<SpeechProvider>(deps, {
    label: 'speech',
    local: local,
    upstream: createOpenAiCompatibleSpeech,
    defaultTimeoutMs: deps.config.chat.upstreamTimeoutMs,
  });
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
  const none: TranscriptionProvider = {
    name: 'local',
    transcribe: async () => {
      throw new ChatProviderError('failed', 'No speech recogniser is embedded');
    },
  };
  return createProviderRegistry<TranscriptionProvider>(deps, {
    label: 'transcription',
    local: none,
    upstream: createOpenAiCompatibleTranscription,
    defaultTimeoutMs: deps.config.chat.upstreamTimeoutMs,
  });
}
