/**
 * Audio encoders for the embedded speech engine, from 16-bit mono samples: raw PCM (little-endian), WAV
 * (RIFF/PCM), MP3 (LAME, via the pure-JavaScript `@breezystack/lamejs`) and FLAC (a small encoder written
 * here: fixed linear predictors with Rice-coded residuals, CRC-checked frames, the MD5 of the samples in
 * STREAMINFO). PCM and MP3 encode as samples arrive (streamable); WAV and FLAC need the sample count up front,
 * so they are written once the last sample is in. Every encoder is deterministic.
 */
import { createHash } from 'node:crypto';
import { Mp3Encoder } from '@breezystack/lamejs';

export type StreamEncoder = {
  /** Encoded bytes for these samples (possibly empty). */
  push(samples: Int16Array): Buffer;
  /** The rest of the file. */
  end(): Buffer;
};

const le16 = (samples: Int16Array) => {
  const out = Buffer.alloc(samples.length * 2);
  for (let i = 0; i < samples.length; i++) out.writeInt16LE(samples[i] ?? 0, i * 2);
  return out;
};

export function pcmEncoder(): StreamEncoder {
  return { push: le16, end: () => Buffer.alloc(0) };
}

/** A canonical 44-byte-header WAV file. */
export function wavFile(samples: Int16Array, sampleRate: number): Buffer {
  const data = le16(samples);
  const header = Buffer.alloc(44);
  header.write('RIFF', 0, 'ascii');
  header.writeUInt32LE(36 + data.length, 4);
  header.write('WAVE', 8, 'ascii');
  header.write('fmt ', 12, 'ascii');
  header.writeUInt32LE(16, 16); // fmt chunk size
  header.writeUInt16LE(1, 20); // PCM
  header.writeUInt16LE(1, 22); // mono
  header.writeUInt32LE(sampleRate, 24);
  header.writeUInt32LE(sampleRate * 2, 28); // byte rate
  header.writeUInt16LE(2, 32); // block align
  header.writeUInt16LE(16, 34); // bits per sample
  header.write('data', 36, 'ascii');
  header.writeUInt32LE(data.length, 40);
  return Buffer.concat([header, data]);
}

/** Collects every sample, then writes the whole file. */
function wholeFile(write: (samples: Int16Array) => Buffer): StreamEncoder {
  const parts: Int16Array[] = [];
  return {
    push(samples) {
      parts.push(samples);
      return Buffer.alloc(0);
    },
    end() {
      const all = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
      let offset = 0;
      for (const part of parts) {
        all.set(part, offset);
        offset += part.length;
      }
      return write(all);
    },
  };
}

export function wavEncoder(sampleRate: number): StreamEncoder {
  return wholeFile((samples) => wavFile(samples, sampleRate));
}

/** MP3 at 64 kbit/s mono (MPEG-2 layer III at 16-24 kHz, MPEG-1 above). */
export function mp3Encoder(sampleRate: number, kbps = 64): StreamEncoder {
  const encoder = new Mp3Encoder(1, sampleRate, kbps);
  return {
    push: (samples) => Buffer.from(encoder.encodeBuffer(samples)),
    end: () => Buffer.from(encoder.flush()),
  };
}

export function flacEncoder(sampleRate: number): StreamEncoder {
  return wholeFile((samples) => flacFile(samples, sampleRate));
}

// ---------------------------------------------------------------------------------------------------- FLAC

class BitWriter {
  private bytes: number[] = [];
  private current = 0;
  private filled = 0;

  write(value: number, bits: number) {
    for (let i = bits - 1; i >= 0; i--) {
      this.current = (this.current << 1) | (Math.floor(value / 2 ** i) & 1);
      if (++this.filled === 8) {
        this.bytes.push(this.current);
        this.current = 0;
        this.filled = 0;
      }
    }
  }

  /** Zigzag-free unary: `n` zeros then a one. */
  unary(n: number) {
    for (let i = 0; i < n; i++) this.write(0, 1);
    this.write(1, 1);
  }

  align() {
    if (this.filled > 0) this.write(0, 8 - this.filled);
  }

  toBuffer(): Buffer {
    return Buffer.from(this.bytes);
  }
}

function crc8(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte;
    for (let i = 0; i < 8; i++) crc = crc & 0x80 ? ((crc << 1) ^ 0x07) & 0xff : (crc << 1) & 0xff;
  }
  return crc;
}

function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x8005) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** FLAC's UTF-8-like coding of the frame number. */
function utf8Number(n: number): number[] {
  if (n < 0x80) return [n];
  const out: number[] = [];
  let bytes = 2;
  while (n >= 2 ** (5 * bytes + 1)) bytes++;
  for (let i = bytes - 1; i > 0; i--) {
    out.unshift(0x80 | (n & 0x3f));
    n = Math.floor(n / 64);
  }
  out.unshift(((0xff00 >> bytes) & 0xff) | n);
  return out;
}

const BLOCK = 4096;

/** Residuals of the fixed predictor of `order` (0-4) over one block. */
function residuals(block: Int16Array, order: number): number[] {
  const out: number[] = [];
  for (let i = order; i < block.length; i++) {
    const s = (k: number) => block[i - k] ?? 0;
    const predicted = [
      0,
      s(1),
      2 * s(1) - s(2),
      3 * s(1) - 3 * s(2) + s(3),
      4 * s(1) - 6 * s(2) + 4 * s(3) - s(4),
    ][order] as number;
    out.push((block[i] ?? 0) - predicted);
  }
  return out;
}

const zigzag = (v: number) => (v >= 0 ? 2 * v : -2 * v - 1);

function riceBits(values: number[], k: number): number {
  let bits = 0;
  for (const v of values) bits += Math.floor(zigzag(v) / 2 ** k) + 1 + k;
  return bits;
}

/** Sample rates with a code of their own in a frame header. */
const RATE_CODES: Record<number, number> = {
  8000: 0b0100,
  16000: 0b0101,
  22050: 0b0110,
  24000: 0b0111,
  32000: 0b1000,
  44100: 0b1001,
  48000: 0b1010,
  96000: 0b1011,
};

function writeFrame(block: Int16Array, frameNumber: number, sampleRate: number): Buffer {
  const header = new BitWriter();
  header.write(0b11111111111110, 14); // sync
  header.write(0, 1);
  header.write(0, 1); // fixed block size
  header.write(0b0111, 4); // block size: 16 bits at the end of the header, minus one
  const rateCode = RATE_CODES[sampleRate] ?? 0b1101; // 0b1101: 16-bit rate in Hz at the end of the header
  header.write(rateCode, 4);
  header.write(0b0000, 4); // mono
  header.write(0b100, 3); // 16 bits per sample
  header.write(0, 1);
  for (const byte of utf8Number(frameNumber)) header.write(byte, 8);
  header.write(block.length - 1, 16);
  if (rateCode === 0b1101) header.write(sampleRate, 16);
  const headerBytes = header.toBuffer();
  const body = new BitWriter();
  for (const byte of headerBytes) body.write(byte, 8);
  body.write(crc8(headerBytes), 8);

  // The cheapest fixed predictor and Rice parameter (one partition), or verbatim when that is smaller.
  let best: { order: number; k: number; bits: number; values: number[] } | undefined;
  for (let order = 0; order <= Math.min(4, block.length - 1); order++) {
    const values = residuals(block, order);
    // The best Rice parameter is near log2 of the mean residual: try around it.
    const mean = values.reduce((sum, v) => sum + zigzag(v), 0) / Math.max(1, values.length);
    const guess = Math.max(0, Math.min(14, Math.floor(Math.log2(mean + 1))));
    for (let k = Math.max(0, guess - 1); k <= Math.min(14, guess + 1); k++) {
      const bits = order * 16 + 6 + riceBits(values, k);
      if (!best || bits < best.bits) best = { order, k, bits, values };
    }
  }
  body.write(0, 1); // subframe padding
  if (!best || best.bits >= block.length * 16) {
    body.write(0b000001, 6); // verbatim
    body.write(0, 1);
    for (const s of block) body.write(s & 0xffff, 16);
  } else {
    body.write(0b001000 | best.order, 6); // fixed, order
    body.write(0, 1); // no wasted bits
    for (let i = 0; i < best.order; i++) body.write((block[i] ?? 0) & 0xffff, 16);
    body.write(0b00, 2); // Rice, 4-bit parameters
    body.write(0, 4); // partition order 0
    body.write(best.k, 4);
    for (const v of best.values) {
      const u = zigzag(v);
      body.unary(Math.floor(u / 2 ** best.k));
      if (best.k > 0) body.write(u % 2 ** best.k, best.k);
    }
  }
  body.align();
  const frame = body.toBuffer();
  const footer = Buffer.alloc(2);
  footer.writeUInt16BE(crc16(frame));
  return Buffer.concat([frame, footer]);
}

/** A FLAC file: `fLaC`, STREAMINFO (last metadata block), then frames of 4096 samples. */
export function flacFile(samples: Int16Array, sampleRate: number): Buffer {
  const frames: Buffer[] = [];
  for (let start = 0, n = 0; start < samples.length; start += BLOCK, n++)
    frames.push(writeFrame(samples.subarray(start, start + BLOCK), n, sampleRate));
  const sizes = frames.map((f) => f.length);
  const info = new BitWriter();
  info.write(1, 1); // last metadata block
  info.write(0, 7); // STREAMINFO
  info.write(34, 24);
  const blockSize = samples.length >= BLOCK ? BLOCK : Math.max(16, samples.length);
  info.write(blockSize, 16); // min block size
  info.write(blockSize, 16); // max block size
  info.write(sizes.length ? Math.min(...sizes) : 0, 24);
  info.write(sizes.length ? Math.max(...sizes) : 0, 24);
  info.write(sampleRate, 20);
  info.write(0, 3); // channels - 1
  info.write(15, 5); // bits per sample - 1
  info.write(samples.length, 36);
  const md5 = createHash('md5').update(le16(samples)).digest();
  return Buffer.concat([Buffer.from('fLaC', 'ascii'), info.toBuffer(), md5, ...frames]);
}

// --------------------------------------------------------------------------------------------- resampling

/** Linear-interpolation resampler for a stream of chunks (continuous across chunk boundaries). */
export function createResampler(from: number, to: number) {
  const step = from / to;
  let t = 0; // position of the next output sample, in input samples from the stream start
  let offset = 0; // stream position of the current chunk's first sample
  let previous = 0;
  return (chunk: Int16Array): Int16Array => {
    if (from === to) return chunk;
    const out: number[] = [];
    for (;;) {
      const position = t - offset;
      const i0 = Math.floor(position);
      if (i0 + 1 >= chunk.length) break;
      const a = i0 < 0 ? previous : (chunk[i0] ?? 0);
      const b = chunk[i0 + 1] ?? 0;
      const f = position - i0;
      out.push(Math.round(a + (b - a) * f));
      t += step;
    }
    if (chunk.length > 0) previous = chunk[chunk.length - 1] ?? 0;
    offset += chunk.length;
    return Int16Array.from(out);
  };
}
