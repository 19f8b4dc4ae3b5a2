/**
 * The transcription provider port: what the transcription domain asks of a speech-recognition backend (an
 * OpenAI-compatible upstream; no recogniser is embedded). Failures are thrown as `ChatProviderError`.
 */

export type TranscriptionProviderRequest = {
  /** The model name the backend knows. */
  model: string;
  file: { buffer: Buffer; filename: string; mimetype: string };
  language?: string;
  /** Ask for word and segment timings. */
  timestamps: boolean;
  signal?: AbortSignal;
};

export type TimedWord = { word: string; start: number; end: number };
export type TimedSegment = { text: string; start: number; end: number };

export type TranscriptionResult = {
  text: string;
  /** Seconds of audio, when the backend reports it. */
  duration?: number;
  words?: TimedWord[];
  segments?: TimedSegment[];
};

export type TranscriptionProvider = {
  /** Stable backend name (the `x-service-model-router` header). */
  readonly name: string;
  transcribe(request: TranscriptionProviderRequest): Promise<TranscriptionResult>;
};
