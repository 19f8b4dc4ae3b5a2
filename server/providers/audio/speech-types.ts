/**
 * The speech provider port: what the speech domain asks of a text-to-speech backend (the embedded eSpeak NG
 * engine, an OpenAI-compatible upstream). A provider yields the encoded audio in the requested format, in
 * pieces as they are ready. Failures are thrown as `ChatProviderError` with a kind the domain maps.
 */

export type SpeechFormat = 'mp3' | 'opus' | 'aac' | 'flac' | 'wav' | 'pcm';

export const SPEECH_CONTENT_TYPES: Record<SpeechFormat, string> = {
  mp3: 'audio/mpeg',
  opus: 'audio/opus',
  aac: 'audio/aac',
  flac: 'audio/flac',
  wav: 'audio/wav',
  pcm: 'audio/pcm',
};

export type SpeechProviderRequest = {
  /** The model name the backend knows (the catalogue id, or the upstream's own name). */
  model: string;
  input: string;
  voice: string;
  format: SpeechFormat;
  /** 0.25 to 4. */
  speed: number;
  /** Sample rate of the output (the catalogue's `sampleRateHz`). */
  sampleRate: number;
  language?: string;
  prompt?: string;
  temperature?: number;
  topP?: number;
  signal?: AbortSignal;
};

export type SpeechProvider = {
  /** Stable backend name (the `x-service-model-router` header). */
  readonly name: string;
  /** The formats this backend can produce (undefined: whatever the model lists). */
  readonly formats?: ReadonlySet<SpeechFormat>;
  /** The encoded audio, in pieces; concatenated they are the whole file. */
  synthesize(request: SpeechProviderRequest): AsyncIterable<Buffer>;
};
