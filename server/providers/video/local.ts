/**
 * The embedded local video engine: the default backend, needing nothing outside the process but the ffmpeg
 * binary that ships inside the `@ffmpeg-installer/ffmpeg` npm package. It is not a generative model and does
 * not pretend to be one: it renders an abstract animation whose palette, shapes and motion are derived from the
 * prompt, the negative prompt and the seed (same inputs, same bytes), and encodes it as a real H.264 MP4 (with an
 * AAC soundtrack synthesised from the same inputs when audio is asked for). For image-to-video the first frame
 * is the supplied image (a data URL), slowly zoomed, with the animation drawn over it.
 *
 * Frames are computed in JavaScript as raw RGB and piped to ffmpeg; the output is written to a scratch file
 * (the MP4 muxer needs a seekable output to put the index first) and read back.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { mulberry32 } from '../random.ts';
import {
  type VideoGenerationRequest,
  type VideoProvider,
  VideoProviderError,
  type VideoResult,
  type VideoRunContext,
} from './types.ts';

export type LocalVideoEngineOptions = {
  /** The ffmpeg binary; by default the one shipped in `@ffmpeg-installer/ffmpeg`. */
  ffmpegPath?: string;
  /** Frames per second of the output (default 24). */
  fps?: number;
  /** Largest accepted decoded input image, in bytes of its data URL payload (default 16 MB). */
  maxImageBytes?: number;
};

/** Finds the ffmpeg binary of the npm package; undefined when this platform has none. */
export function bundledFfmpegPath(): string | undefined {
  try {
    const require = createRequire(import.meta.url);
    return (require('@ffmpeg-installer/ffmpeg') as { path: string }).path;
  } catch {
    return undefined;
  }
}

/** Pixel height of a resolution tier. */
export function tierHeight(resolution: string): number {
  const named: Record<string, number> = { '2K': 1440, '4k': 2160, true_1080p: 1080, '768P': 768 };
  const height = named[resolution] ?? Number.parseInt(resolution, 10);
  if (!Number.isSafeInteger(height) || height < 16 || height > 4320) {
    throw new VideoProviderError('bad_request', `The local engine cannot render resolution ${resolution}`);
  }
  return height;
}

const even = (n: number) => Math.max(2, Math.round(n / 2) * 2);

/** Frame size of a tier and aspect ratio (`16:9` at 720p is 1280x720; portrait ratios keep the short side). */
export function frameSize(
  resolution: string,
  aspectRatio: string | undefined,
): { width: number; height: number } {
  const side = tierHeight(resolution);
  const match = /^(\d+):(\d+)$/.exec(aspectRatio ?? '16:9');
  const w = match ? Number(match[1]) : 16;
  const h = match ? Number(match[2]) : 9;
  return w >= h
    ? { width: even((side * w) / h), height: even(side) }
    : { width: even(side), height: even((side * h) / w) };
}

type Rgb = [number, number, number];

function hsl(h: number, s: number, l: number): Rgb {
  const a = s * Math.min(l, 1 - l);
  const f = (n: number) => {
    const k = (n + h * 12) % 12;
    return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
  };
  return [f(0), f(8), f(4)];
}

type Blob = {
  color: Rgb;
  radius: number;
  ax: number;
  ay: number;
  fx: number;
  fy: number;
  px: number;
  py: number;
};

/** What the animation looks like, derived from the request alone. */
export function sceneOf(request: VideoGenerationRequest) {
  const digest = createHash('sha256')
    .update(JSON.stringify([request.prompt, request.negativePrompt ?? '', request.seed]))
    .digest();
  const random = mulberry32(digest.readUInt32BE(0));
  const hue = random();
  const top = hsl(hue, 0.55, 0.25);
  const bottom = hsl((hue + 0.33 + random() * 0.2) % 1, 0.6, 0.55);
  const words = request.prompt.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
  const count = Math.min(8, Math.max(3, words.length));
  const blobs: Blob[] = [];
  for (let i = 0; i < count; i++) {
    const word = words[i % Math.max(1, words.length)] ?? '';
    const wordHue = createHash('sha256').update(word).digest().readUInt16BE(0) / 65536;
    blobs.push({
      color: hsl((wordHue + random() * 0.1) % 1, 0.75, 0.6),
      radius: 0.05 + random() * 0.12,
      ax: 0.15 + random() * 0.3,
      ay: 0.15 + random() * 0.3,
      fx: 0.05 + random() * 0.3,
      fy: 0.05 + random() * 0.3,
      px: random() * Math.PI * 2,
      py: random() * Math.PI * 2,
    });
  }
  const tones = [110, 130.81, 146.83, 164.81, 196, 220, 261.63];
  const chord = [0, 1, 2].map(() => tones[Math.floor(random() * tones.length)] ?? 220);
  return { top, bottom, blobs, chord, drift: random() };
}

/** Renders frame `index` of `frames` into `out` (RGB, width x height). */
export function renderFrame(
  scene: ReturnType<typeof sceneOf>,
  size: { width: number; height: number },
  index: number,
  fps: number,
  out: Buffer,
  base?: Buffer,
): void {
  const { width, height } = size;
  const t = index / fps;
  const row = width * 3;
  if (base) {
    // Ken Burns: a slow zoom into the centre of the input image (nearest neighbour, exact and cheap).
    const zoom = 1 + 0.02 * t;
    const columns = new Int32Array(width);
    for (let x = 0; x < width; x++) {
      columns[x] = Math.min(width - 1, Math.floor(width / 2 + (x - width / 2) / zoom)) * 3;
    }
    for (let y = 0; y < height; y++) {
      const source = Math.min(height - 1, Math.floor(height / 2 + (y - height / 2) / zoom)) * row;
      const target = y * row;
      for (let x = 0; x < width; x++) {
        const from = source + (columns[x] ?? 0);
        const to = target + x * 3;
        out[to] = base[from] ?? 0;
        out[to + 1] = base[from + 1] ?? 0;
        out[to + 2] = base[from + 2] ?? 0;
      }
    }
  } else {
    const shift = 0.5 + 0.5 * Math.sin(t * 0.8 + scene.drift * 6);
    for (let y = 0; y < height; y++) {
      const k = Math.min(1, Math.max(0, y / height + (shift - 0.5) * 0.3));
      const color = Buffer.from([
        Math.round(scene.top[0] + (scene.bottom[0] - scene.top[0]) * k),
        Math.round(scene.top[1] + (scene.bottom[1] - scene.top[1]) * k),
        Math.round(scene.top[2] + (scene.bottom[2] - scene.top[2]) * k),
      ]);
      out.fill(color, y * row, (y + 1) * row);
    }
  }
  const short = Math.min(width, height);
  const alpha = base ? 0.35 : 0.85;
  for (const blob of scene.blobs) {
    const cx = width * (0.5 + blob.ax * Math.sin(2 * Math.PI * blob.fx * t + blob.px));
    const cy = height * (0.5 + blob.ay * Math.sin(2 * Math.PI * blob.fy * t + blob.py));
    const r = short * blob.radius * (1 + 0.15 * Math.sin(t * 2 + blob.px));
    const r2 = r * r;
    const x0 = Math.max(0, Math.floor(cx - r));
    const x1 = Math.min(width - 1, Math.ceil(cx + r));
    const y0 = Math.max(0, Math.floor(cy - r));
    const y1 = Math.min(height - 1, Math.ceil(cy + r));
    for (let y = y0; y <= y1; y++) {
      const dy = y - cy;
      for (let x = x0; x <= x1; x++) {
        const dx = x - cx;
        if (dx * dx + dy * dy > r2) continue;
        const o = y * row + x * 3;
        out[o] = Math.round((out[o] ?? 0) * (1 - alpha) + blob.color[0] * alpha);
        out[o + 1] = Math.round((out[o + 1] ?? 0) * (1 - alpha) + blob.color[1] * alpha);
        out[o + 2] = Math.round((out[o + 2] ?? 0) * (1 - alpha) + blob.color[2] * alpha);
      }
    }
  }
}

/** Decodes a `data:image/…;base64,…` URL's payload; throws a bad_request for anything else. */
function dataUrlBytes(url: string, maxBytes: number): Buffer {
  const match = /^data:image\/(png|jpeg|jpg|webp);base64,([A-Za-z0-9+/=\s]+)$/i.exec(url);
  if (!match?.[2]) {
    throw new VideoProviderError(
      'bad_request',
      'The local video engine takes image_url as a data URL of a PNG, JPEG or WebP image',
    );
  }
  const bytes = Buffer.from(match[2], 'base64');
  if (bytes.length === 0 || bytes.length > maxBytes) {
    throw new VideoProviderError('bad_request', 'image_url is empty or too large');
  }
  return bytes;
}

/** Runs ffmpeg to completion, feeding `input`; kills it (by its pid) when `signal` aborts. */
async function runFfmpeg(
  ffmpeg: string,
  args: string[],
  signal: AbortSignal,
  feed: (child: ChildProcess) => Promise<void>,
): Promise<Buffer> {
  const child = spawn(ffmpeg, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  const stdout: Buffer[] = [];
  const stderr: Buffer[] = [];
  child.stdout?.on('data', (chunk: Buffer) => stdout.push(chunk));
  child.stderr?.on('data', (chunk: Buffer) => {
    if (stderr.length < 64) stderr.push(chunk);
  });
  child.stdin?.on('error', () => {}); // EPIPE when ffmpeg exits early; the exit code tells why
  const exited = new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve(code));
  });
  const abort = () => child.kill('SIGKILL');
  signal.addEventListener('abort', abort, { once: true });
  try {
    await feed(child).catch(() => undefined);
    child.stdin?.end();
    const code = await exited;
    if (signal.aborted) throw new VideoProviderError('failed', 'Video rendering was stopped');
    if (code !== 0) {
      const tail = Buffer.concat(stderr).toString('utf8').trim().split('\n').slice(-3).join(' | ');
      throw new VideoProviderError('failed', `ffmpeg exited with code ${code}: ${tail}`);
    }
    return Buffer.concat(stdout);
  } catch (error) {
    if (error instanceof VideoProviderError) throw error;
    throw new VideoProviderError('failed', 'ffmpeg could not be run', { cause: error });
  } finally {
    signal.removeEventListener('abort', abort);
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

/** Parses a binary PPM (P6, maxval 255) as ffmpeg writes it. */
function parsePpm(data: Buffer): { width: number; height: number; pixels: Buffer } {
  const header = /^P6\s+(\d+)\s+(\d+)\s+255\s/.exec(data.subarray(0, 64).toString('latin1'));
  if (!header?.[1] || !header[2])
    throw new VideoProviderError('bad_request', 'image_url could not be decoded');
  const width = Number(header[1]);
  const height = Number(header[2]);
  const pixels = data.subarray(header[0].length, header[0].length + width * height * 3);
  if (pixels.length !== width * height * 3) {
    throw new VideoProviderError('bad_request', 'image_url could not be decoded');
  }
  return { width, height, pixels };
}

export function createLocalVideoEngine(options: LocalVideoEngineOptions = {}): VideoProvider {
  const fps = options.fps ?? 24;
  const maxImageBytes = options.maxImageBytes ?? 16 * 1024 * 1024;

  function ffmpegBinary(): string {
    const path = options.ffmpegPath ?? bundledFfmpegPath();
    if (!path) throw new VideoProviderError('failed', 'No ffmpeg binary is available on this platform');
    return path;
  }

  /** The input image scaled to the tier's height (width follows its shape), as raw RGB. */
  async function baseImage(url: string, resolution: string, signal: AbortSignal) {
    const bytes = dataUrlBytes(url, maxImageBytes);
    const height = even(tierHeight(resolution));
    const ppm = await runFfmpeg(
      ffmpegBinary(),
      [
        '-hide_banner',
        '-loglevel',
        'error',
        '-i',
        'pipe:0',
        '-frames:v',
        '1',
        '-vf',
        `scale=-2:${height}:flags=bicubic`,
        '-f',
        'image2pipe',
        '-c:v',
        'ppm',
        'pipe:1',
      ],
      signal,
      async (child) => {
        child.stdin?.end(bytes);
      },
    ).catch((error: unknown) => {
      throw error instanceof VideoProviderError && error.kind === 'failed' && !signal.aborted
        ? new VideoProviderError('bad_request', 'image_url is not a readable image', { cause: error })
        : error;
    });
    return parsePpm(ppm);
  }

  return {
    name: 'local',
    async generate(request: VideoGenerationRequest, context: VideoRunContext): Promise<VideoResult> {
      const { signal } = context;
      const ffmpeg = ffmpegBinary();
      const base = request.imageUrl
        ? await baseImage(request.imageUrl, request.resolution, signal)
        : undefined;
      const size = base
        ? { width: base.width, height: base.height }
        : frameSize(request.resolution, request.aspectRatio);
      const scene = sceneOf(request);
      const frames = Math.max(1, Math.round(request.durationSeconds * fps));
      const scratch = await mkdtemp(join(tmpdir(), 'video-local-'));
      const output = join(scratch, 'out.mp4');
      const [a, b, c] = scene.chord;
      const audioArgs = request.audio
        ? [
            '-f',
            'lavfi',
            '-i',
            `aevalsrc=0.12*sin(2*PI*${a}*t)*(0.6+0.4*sin(2*PI*0.5*t))+0.08*sin(2*PI*${b}*t)+0.06*sin(2*PI*${c}*t):s=44100:d=${request.durationSeconds}`,
          ]
        : [];
      const args = [
        '-hide_banner',
        '-loglevel',
        'error',
        '-y',
        '-f',
        'rawvideo',
        '-pix_fmt',
        'rgb24',
        '-s',
        `${size.width}x${size.height}`,
        '-r',
        String(fps),
        '-i',
        'pipe:0',
        ...audioArgs,
        '-map',
        '0:v',
        ...(request.audio ? ['-map', '1:a', '-c:a', 'aac', '-b:a', '96k', '-ac', '1'] : []),
        '-c:v',
        'libx264',
        '-preset',
        'veryfast',
        '-crf',
        '26',
        '-pix_fmt',
        'yuv420p',
        '-threads',
        '1',
        '-x264-params',
        'threads=1:sliced-threads=0',
        '-movflags',
        '+faststart',
        '-map_metadata',
        '-1',
        '-fflags',
        '+bitexact',
        '-flags',
        '+bitexact',
        '-frames:v',
        String(frames),
        '-t',
        String(request.durationSeconds),
        output,
      ];
      try {
        await runFfmpeg(ffmpeg, args, signal, async (child) => {
          const stdin = child.stdin;
          if (!stdin) return;
          const closed = once(child, 'close').catch(() => undefined);
          const frame = Buffer.alloc(size.width * size.height * 3);
          for (let i = 0; i < frames; i++) {
            if (signal.aborted) return;
            renderFrame(scene, size, i, fps, frame, base?.pixels);
            // A copy per write: the stream may still hold the previous buffer.
            if (!stdin.write(Buffer.from(frame))) {
              await Promise.race([once(stdin, 'drain'), closed]);
              if (child.exitCode !== null) return;
            }
          }
        });
        return { contentType: 'video/mp4', bytes: await readFile(output) };
      } finally {
        await rm(scratch, { recursive: true, force: true });
      }
    },
  };
}
