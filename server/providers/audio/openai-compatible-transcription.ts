/**
 * The OpenAI-compatible transcription adapter: forwards the recording to `<baseUrl>/audio/transcriptions` as
 * a multipart form, always asking for `verbose_json` (which carries the duration billed, and with
 * `timestamp_granularities[]` the word and segment timings). The answer is distrusted: `text` must be a
 * string, `duration` a finite number when present, and only well-formed timings are kept.
 */

import { ChatProviderError } from '../chat/types.ts';
import type { UpstreamAdapterOptions } from '../http.ts';
import type {
  TimedSegment,
  TimedWord,
  TranscriptionProvider,
  TranscriptionProviderRequest,
  TranscriptionResult,
} from './transcription-types.ts';
import { postUpstream } from './upstream-http.ts';

export type OpenAiCompatibleTranscriptionOptions = UpstreamAdapterOptions;

const isTime = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x) && x >= 0;

export function createOpenAiCompatibleTranscription(
  options: OpenAiCompatibleTranscriptionOptions,
): TranscriptionProvider {
  const url = `${options.baseUrl.replace(/\/+$/, '')}/audio/transcriptions`;
  return {
    name: options.name,
    async transcribe(request: TranscriptionProviderRequest): Promise<TranscriptionResult> {
      const form = new FormData();
      form.append(
        'file',
        new Blob([new Uint8Array(request.file.buffer)], { type: request.file.mimetype }),
        request.file.filename,
      );
      form.append('model', options.upstreamModel);
      form.append('response_format', 'verbose_json');
      if (request.language) form.append('language', request.language);
      if (request.timestamps) {
        form.append('timestamp_granularities[]', 'word');
        form.append('timestamp_granularities[]', 'segment');
      }
      const answer = await postUpstream({
        name: options.name,
        url,
        timeoutMs: options.timeoutMs,
        maxBytes: options.maxBytes ?? 16 * 1024 * 1024,
        body: form,
        ...(options.apiKey ? { apiKey: options.apiKey } : {}),
        ...(request.signal ? { signal: request.signal } : {}),
        ...(options.fetch ? { fetch: options.fetch } : {}),
        ...(options.observe ? { observe: options.observe } : {}),
      });
      let parsed: { text?: unknown; duration?: unknown; words?: unknown; segments?: unknown };
      try {
        parsed = JSON.parse(answer.body.toString('utf8')) as typeof parsed;
      } catch (error) {
        throw new ChatProviderError('failed', `Upstream ${options.name} did not answer with JSON`, {
          cause: error,
        });
      }
      if (typeof parsed.text !== 'string')
        throw new ChatProviderError('failed', `Upstream ${options.name} sent a transcript without text`);
      const words: TimedWord[] = Array.isArray(parsed.words)
        ? (parsed.words as Record<string, unknown>[])
            .filter((w) => typeof w?.word === 'string' && isTime(w.start) && isTime(w.end))
            .map((w) => ({ word: (w.word as string).trim(), start: w.start as number, end: w.end as number }))
        : [];
      const segments: TimedSegment[] = Array.isArray(parsed.segments)
        ? (parsed.segments as Record<string, unknown>[])
            .filter((s) => typeof s?.text === 'string' && isTime(s.start) && isTime(s.end))
            .map((s) => ({ text: (s.text as string).trim(), start: s.start as number, end: s.end as number }))
        : [];
      return {
        text: parsed.text.trim(),
        ...(isTime(parsed.duration) ? { duration: parsed.duration } : {}),
        ...(words.length > 0 ? { words } : {}),
        ...(segments.length > 0 ? { segments } : {}),
      };
    },
  };
}
