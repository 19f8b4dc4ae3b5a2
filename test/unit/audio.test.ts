/**
 * Audio building blocks: WAV durations read for billing, the FLAC and WAV writers, the streaming resampler,
 * the signature check of upstream audio, the eSpeak rate and voice mapping, and the typing of multipart fields.
 */
import { describe, expect, test } from 'vitest';
import { coerceMultipartFields } from '../../server/domains/audio/multipart-fields.ts';
import { wavDuration } from '../../server/domains/audio/transcription.ts';
import { createResampler, flacFile, wavFile } from '../../server/providers/audio/encode.ts';
import { espeakRate, espeakVoice } from '../../server/providers/audio/espeak.ts';
import { looksLike } from '../../server/providers/audio/openai-compatible-speech.ts';

describe('wavDuration', () => {
  test('behavior: seconds from the header; not a WAV file is undefined', () => {
    expect(wavDuration(wavFile(new Int16Array(24000 * 3), 24000))).toBe(3);
    expect(wavDuration(wavFile(new Int16Array(8000), 16000))).toBe(0.5);
    expect(wavDuration(Buffer.from('ID3 not a wave file'))).toBeUndefined();
  });
});

describe('flacFile', () => {
  test('behavior: fLaC marker, STREAMINFO with rate, sample count and MD5, frames with sync codes', () => {
    const samples = Int16Array.from({ length: 10000 }, (_, i) => Math.round(1000 * Math.sin(i / 10)));
    const flac = flacFile(samples, 24000);
    expect(flac.subarray(0, 4).toString('latin1')).toBe('fLaC');
    expect(flac[4]).toBe(0x80); // last metadata block, STREAMINFO
    const info = flac.subarray(8, 42);
    expect((info.readUInt32BE(10) >>> 12) & 0xfffff).toBe(24000);
    expect(info.readUInt32BE(14)).toBe(10000); // low 32 bits of the sample count
    expect(flac.readUInt16BE(42) & 0xfffe).toBe(0xfff8);
    expect(flac.length).toBeLessThan(samples.length * 2); // the predictor compresses a smooth signal
  });
});

describe('createResampler', () => {
  test('behavior: continuous across chunks, the right number of samples', () => {
    const input = Int16Array.from({ length: 22050 }, (_, i) => i % 1000);
    const whole = createResampler(22050, 24000)(input);
    const chunked = createResampler(22050, 24000);
    const parts = [input.subarray(0, 700), input.subarray(700, 5000), input.subarray(5000)].map((c) =>
      chunked(c),
    );
    const joined = Int16Array.from(parts.flatMap((p) => Array.from(p)));
    expect(Array.from(joined)).toEqual(Array.from(whole));
    expect(Math.abs(whole.length - 24000)).toBeLessThanOrEqual(2);
  });
});

describe('looksLike', () => {
  test('behavior: checks the signature of the asked format', () => {
    expect(looksLike('wav', wavFile(new Int16Array(10), 8000))).toBe(true);
    expect(looksLike('wav', Buffer.from('{"not":"audio"}'))).toBe(false);
    expect(looksLike('mp3', Buffer.from([0xff, 0xf3, 0x64, 0xc4]))).toBe(true);
    expect(looksLike('flac', Buffer.from('OggS'))).toBe(false);
    expect(looksLike('pcm', Buffer.alloc(0))).toBe(false);
  });
});

describe('eSpeak mapping', () => {
  test('behavior: speed maps to a clamped rate; voices map to accent, gender variant and pitch', () => {
    expect(espeakRate(1)).toBe(175);
    expect(espeakRate(2)).toBe(350);
    expect(espeakRate(0.25)).toBe(80);
    expect(espeakRate(4)).toBe(450);
    expect(espeakVoice('bf_emma')).toMatchObject({
      voice: 'gmw/en',
      variant: expect.stringMatching(/^\+f\d$/),
    });
    expect(espeakVoice('am_adam')).toMatchObject({
      voice: 'gmw/en-US',
      variant: expect.stringMatching(/^\+m\d$/),
    });
  });
});

describe('coerceMultipartFields', () => {
  const document = {
    components: {
      schemas: {
        Form: {
          type: 'object',
          properties: { flag: { type: 'boolean' }, count: { type: 'integer' }, name: { type: 'string' } },
        },
      },
    },
  };
  const run = (body: Record<string, unknown>, contentType = 'multipart/form-data; boundary=x') => {
    const req = {
      body,
      openapi: {
        schema: {
          requestBody: {
            content: { 'multipart/form-data': { schema: { $ref: '#/components/schemas/Form' } } },
          },
        },
      },
      is: (type: string) => (contentType.startsWith(type) ? type : false),
    };
    coerceMultipartFields(document)(req as never, {} as never, () => {});
    return req.body;
  };
  test('behavior: typed fields are read as their types; other text and bad values stay as sent', () => {
    expect(run({ flag: 'true', count: '12', name: 'true' })).toEqual({ flag: true, count: 12, name: 'true' });
    expect(run({ flag: 'yes', count: '1x' })).toEqual({ flag: 'yes', count: '1x' });
    expect(run({ flag: 'true' }, 'application/json')).toEqual({ flag: 'true' });
  });
});
