/**
 * The embedded speech engine: eSpeak NG (compiled to JavaScript, in a worker thread) speaks the text, the
 * samples are resampled to the model's rate and encoded as they arrive. Deterministic: the same text, voice,
 * speed and format give the same bytes. Catalogue voices map onto eSpeak voices by their Kokoro-style names:
 * the first letter is the accent (`a` American, `b` British), the second the gender (`f`, `m`), and the name
 * picks one of eSpeak's voice variants and a pitch, so every voice sounds different.
 */
import { Worker } from 'node:worker_threads';
import { ChatProviderError } from '../chat/types.ts';
import {
  createResampler,
  flacEncoder,
  mp3Encoder,
  pcmEncoder,
  type StreamEncoder,
  wavEncoder,
} from './encode.ts';
import type { SpeechFormat, SpeechProvider, SpeechProviderRequest } from './speech-types.ts';

/** eSpeak's normal rate, words per minute, and the range it accepts. */
const BASE_RATE = 175;
const MIN_RATE = 80;
const MAX_RATE = 450;

export const LOCAL_SPEECH_FORMATS: ReadonlySet<SpeechFormat> = new Set(['mp3', 'flac', 'wav', 'pcm']);

type Job = {
  push(samples: Int16Array): void;
  done(sampleRate: number): void;
  fail(message: string): void;
};

function hash(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** The eSpeak voice, variant and pitch of a catalogue voice name. */
export function espeakVoice(voice: string): { voice: string; variant: string; pitch: number } {
  const accent = voice[0] === 'b' ? 'gmw/en' : 'gmw/en-US';
  const female = voice[1] !== 'm';
  const h = hash(voice);
  const variant = female ? `+f${(h % 4) + 1}` : `+m${(h % 6) + 1}`;
  return { voice: accent, variant, pitch: 40 + ((h >>> 8) % 21) };
}

/** eSpeak's rate for a speed (clamped to what eSpeak can do: about 0.46× to 2.57×). */
export function espeakRate(speed: number): number {
  return Math.max(MIN_RATE, Math.min(MAX_RATE, Math.round(BASE_RATE * speed)));
}

function encoderFor(format: SpeechFormat, sampleRate: number): StreamEncoder {
  switch (format) {
    case 'mp3':
      return mp3Encoder(sampleRate);
    case 'wav':
      return wavEncoder(sampleRate);
    case 'flac':
      return flacEncoder(sampleRate);
    case 'pcm':
      return pcmEncoder();
    default:
      throw new ChatProviderError('bad_request', `The embedded speech engine cannot encode ${format}`);
  }
}

export function createEspeakEngine(): SpeechProvider & { close(): Promise<void> } {
  let worker: Worker | undefined;
  let ready: Promise<void> | undefined;
  let nextId = 1;
  const jobs = new Map<number, Job>();

  function start(): Promise<void> {
    if (ready) return ready;
    const w = new Worker(new URL('./espeak-worker.mjs', import.meta.url));
    worker = w;
    w.unref();
    ready = new Promise<void>((resolve, reject) => {
      w.on(
        'message',
        (message: {
          ready?: true;
          id?: number;
          samples?: Int16Array;
          done?: true;
          sampleRate?: number;
          error?: string;
        }) => {
          if (message.ready) return resolve();
          const job = jobs.get(message.id ?? -1);
          if (!job) return;
          if (message.samples) job.push(message.samples);
          else if (message.done) {
            jobs.delete(message.id as number);
            job.done(message.sampleRate ?? 22050);
          } else if (message.error !== undefined) {
            jobs.delete(message.id as number);
            job.fail(message.error);
          }
        },
      );
      w.on('error', (error) => {
        reject(error);
        for (const job of jobs.values()) job.fail(String(error.message));
        jobs.clear();
        ready = undefined;
        worker = undefined;
      });
      w.on('exit', () => {
        for (const job of jobs.values()) job.fail('speech engine stopped');
        jobs.clear();
        ready = undefined;
        worker = undefined;
      });
    });
    return ready;
  }

  return {
    name: 'local',
    formats: LOCAL_SPEECH_FORMATS,
    async *synthesize(request: SpeechProviderRequest): AsyncGenerator<Buffer> {
      const encoder = encoderFor(request.format, request.sampleRate);
      try {
        await start();
      } catch (error) {
        throw new ChatProviderError('failed', 'The embedded speech engine failed to start', { cause: error });
      }
      // Samples and the end arrive as messages; the generator waits for them in order.
      const queue: (Int16Array | { end: number } | { error: string })[] = [];
      let wake: (() => void) | undefined;
      const notify = () => {
        wake?.();
        wake = undefined;
      };
      const id = nextId++;
      jobs.set(id, {
        push: (samples) => {
          queue.push(samples);
          notify();
        },
        done: (sampleRate) => {
          queue.push({ end: sampleRate });
          notify();
        },
        fail: (message) => {
          queue.push({ error: message });
          notify();
        },
      });
      const { voice, variant, pitch } = espeakVoice(request.voice);
      worker?.postMessage({
        id,
        voice,
        fallbackVoice: voice,
        variant,
        ...(request.language ? { language: request.language } : {}),
        rate: espeakRate(request.speed),
        pitch,
        text: request.input,
      });
      let resample: ((chunk: Int16Array) => Int16Array) | undefined;
      const ENGINE_RATE = 22050;
      try {
        for (;;) {
          if (request.signal?.aborted) throw request.signal.reason;
          const item = queue.shift();
          if (!item) {
            await new Promise<void>((resolve) => {
              wake = resolve;
            });
            continue;
          }
          if (item instanceof Int16Array) {
            resample ??= createResampler(ENGINE_RATE, request.sampleRate);
            const bytes = encoder.push(resample(item));
            if (bytes.length > 0) yield bytes;
          } else if ('error' in item) {
            throw new ChatProviderError('failed', `The embedded speech engine failed: ${item.error}`);
          } else {
            const rest = encoder.end();
            if (rest.length > 0) yield rest;
            return;
          }
        }
      } finally {
        jobs.delete(id);
      }
    },
    async close() {
      await worker?.terminate();
    },
  };
}
