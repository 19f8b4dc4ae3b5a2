/**
 * The OpenAI-compatible speech adapter: `POST <baseUrl>/audio/speech` with the text, voice, format and speed
 * (and the optional style and sampling fields when given). The answer is distrusted: it must be audio (an
 * audio or octet-stream content type), within the size cap, and start like the asked format (RIFF/WAVE,
 * fLaC, OggS, an MP3 frame or ID3 tag), else the call failed.
 */

import { ChatProviderError } from '../chat/types.ts';
import type { UpstreamAdapterOptions } from '../http.ts';
import type { SpeechFormat, SpeechProvider, SpeechProviderRequest } from './speech-types.ts';
import { postUpstream } from './upstream-http.ts';

export type OpenAiCompatibleSpeechOptions = UpstreamAdapterOptions;

/** Whether `bytes` begin as a file of `format` does (formats without a signature pass when not empty). */
export function looksLike(format: SpeechFormat, bytes: Buffer): boolean {
  if (bytes.length === 0) return false;
  switch (format) {
    case 'wav':
      return (
        bytes.subarray(0, 4).toString('latin1') === 'RIFF' &&
        bytes.subarray(8, 12).toString('latin1') === 'WAVE'
      );
    case 'flac':
      return bytes.subarray(0, 4).toString('latin1') === 'fLaC';
    case 'opus':
      return bytes.subarray(0, 4).toString('latin1') === 'OggS';
    case 'mp3':
      return (
        bytes.subarray(0, 3).toString('latin1') === 'ID3' ||
        (bytes[0] === 0xff && ((bytes[1] ?? 0) & 0xe0) === 0xe0)
      );
    default:
      return true;
  }
}

export function createOpenAiCompatibleSpeech(options: OpenAiCompatibleSpeechOptions): SpeechProvider {
  const url = `${options.baseUrl.replace(/\/+$/, '')}/audio/speech`;
  return {
    name: options.name,
    async *synthesize(request: SpeechProviderRequest): AsyncGenerator<Buffer> {
      const answer = await postUpstream({
        name: options.name,
        url,
        timeoutMs: options.timeoutMs,
        maxBytes: options.maxBytes ?? 64 * 1024 * 1024,
        accept: 'audio/*, application/octet-stream',
        body: JSON.stringify({
          model: options.upstreamModel,
          input: request.input,
          voice: request.voice,
          response_format: request.format,
          speed: request.speed,
          ...(request.language ? { language: request.language } : {}),
          ...(request.prompt ? { prompt: request.prompt } : {}),
          ...(request.temperature !== undefined ? { temperature: request.temperature } : {}),
          ...(request.topP !== undefined ? { top_p: request.topP } : {}),
        }),
        ...(options.apiKey ? { apiKey: options.apiKey } : {}),
        ...(request.signal ? { signal: request.signal } : {}),
        ...(options.fetch ? { fetch: options.fetch } : {}),
        ...(options.observe ? { observe: options.observe } : {}),
      });
      if (!/^(audio\/|application\/octet-stream)/.test(answer.contentType))
        throw new ChatProviderError(
          'failed',
          `Upstream ${options.name} did not answer with audio (${answer.contentType || 'no content type'})`,
        );
      if (!looksLike(request.format, answer.body))
        throw new ChatProviderError(
          'failed',
          `Upstream ${options.name} did not answer with ${request.format} audio`,
        );
      yield answer.body;
    },
  };
}
