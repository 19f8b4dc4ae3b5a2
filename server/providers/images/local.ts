/**
 * The embedded image engine: draws real, deterministic pictures from the prompt and the seed, with no model
 * weights, so that image generation works on a fresh machine. It is honest about what it is: a procedural
 * landscape painter, not a diffusion model. What it draws follows the request:
 *
 * - the prompt picks the palette (colour and mood words such as `sunset`, `forest`, `ocean`, `night`, or a
 *   hash of the prompt when it names none), the time of day and the composition; the negative prompt pushes
 *   the palette away from what it names;
 * - the seed drives every random choice (sun position, ridges, clouds, grain), so one seed gives one picture;
 *   variant `i` uses `seed + i`;
 * - `steps` is the number of noise octaves (detail), `cfg_scale` the contrast and saturation, `lora_strength`
 *   the weight of a fine texture layer, `quality` the internal drawing resolution, `style_preset` a look
 *   (greyscale, posterised, film tint, …), and style references pull the palette toward their mean colour.
 *
 * Pixels are drawn at an internal size (long side 256/384/512 for low/medium/high quality) and resized with
 * sharp's Lanczos kernel to the asked size; both steps are deterministic, so the same request always gives
 * the same pixels.
 */
import sharp from 'sharp';
import { mulberry32 } from '../random.ts';
import type { ImageProvider, ImageProviderRequest, ImageProviderResult, ProviderImage } from './types.ts';

/** The internal long side per quality tier. */
const INTERNAL_SIZE = { low: 256, medium: 384, high: 512 } as const;

type Rgb = [number, number, number];

/** Colour and mood words -> hue (degrees) or a lightness mood. */
const HUE_WORDS: Record<string, number> = {
  red: 0,
  crimson: 350,
  rose: 340,
  pink: 330,
  magenta: 300,
  purple: 275,
  violet: 270,
  lavender: 260,
  indigo: 240,
  blue: 215,
  sky: 205,
  ocean: 200,
  sea: 195,
  water: 195,
  river: 190,
  lake: 190,
  ice: 190,
  teal: 175,
  cyan: 180,
  turquoise: 170,
  mint: 150,
  green: 120,
  forest: 110,
  jungle: 105,
  grass: 95,
  meadow: 90,
  olive: 70,
  lime: 80,
  yellow: 55,
  gold: 48,
  golden: 45,
  sand: 40,
  desert: 35,
  amber: 40,
  orange: 28,
  sunset: 20,
  dawn: 25,
  autumn: 25,
  fire: 12,
  lava: 8,
  brown: 25,
  copper: 22,
};
const DARK_WORDS = new Set(['night', 'midnight', 'dark', 'noir', 'storm', 'shadow', 'space', 'moon']);
const LIGHT_WORDS = new Set([
  'snow',
  'white',
  'winter',
  'fog',
  'mist',
  'cloud',
  'clouds',
  'pastel',
  'bright',
]);

/** FNV-1a, 32 bits. */
export function hash32(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

function words(text: string | undefined): string[] {
  return (text ?? '').toLowerCase().match(/[a-z]+/g) ?? [];
}

function hslToRgb(h: number, s: number, l: number): Rgb {
  const hue = (((h % 360) + 360) % 360) / 360;
  const q = l < 0.5 ? l * (1 + s) : l + s - l * s;
  const p = 2 * l - q;
  const channel = (t0: number) => {
    let t = t0;
    if (t < 0) t += 1;
    if (t > 1) t -= 1;
    if (t < 1 / 6) return p + (q - p) * 6 * t;
    if (t < 1 / 2) return q;
    if (t < 2 / 3) return p + (q - p) * (2 / 3 - t) * 6;
    return p;
  };
  return [channel(hue + 1 / 3) * 255, channel(hue) * 255, channel(hue - 1 / 3) * 255];
}

function rgbToHue([r, g, b]: Rgb): number {
  const max = Math.max(r, g, b);
  const min = Math.min(r, g, b);
  if (max === min) return 0;
  const d = max - min;
  let h: number;
  if (max === r) h = ((g - b) / d) % 6;
  else if (max === g) h = (b - r) / d + 2;
  else h = (r - g) / d + 4;
  return (h * 60 + 360) % 360;
}

const mix = (a: Rgb, b: Rgb, t: number): Rgb => [
  a[0] + (b[0] - a[0]) * t,
  a[1] + (b[1] - a[1]) * t,
  a[2] + (b[2] - a[2]) * t,
];

/** 2D value noise on a lattice hashed from the seed, smoothly interpolated. */
function valueNoise(seed: number) {
  const at = (x: number, y: number) => {
    let h = (Math.imul(x, 374761393) + Math.imul(y, 668265263) + Math.imul(seed, 1274126177)) >>> 0;
    h = Math.imul(h ^ (h >>> 13), 1274126177) >>> 0;
    return ((h ^ (h >>> 16)) >>> 0) / 4294967296;
  };
  return (x: number, y: number) => {
    const x0 = Math.floor(x);
    const y0 = Math.floor(y);
    const fx = x - x0;
    const fy = y - y0;
    const sx = fx * fx * (3 - 2 * fx);
    const sy = fy * fy * (3 - 2 * fy);
    const a = at(x0, y0);
    const b = at(x0 + 1, y0);
    const c = at(x0, y0 + 1);
    const d = at(x0 + 1, y0 + 1);
    return a + (b - a) * sx + (c - a) * sy + (a - b - c + d) * sx * sy;
  };
}

function fbm(noise: (x: number, y: number) => number, x: number, y: number, octaves: number): number {
  let sum = 0;
  let amplitude = 0.5;
  let frequency = 1;
  let norm = 0;
  for (let i = 0; i < octaves; i++) {
    sum += noise(x * frequency, y * frequency) * amplitude;
    norm += amplitude;
    amplitude *= 0.5;
    frequency *= 2;
  }
  return sum / norm;
}

/** The palette and mood a prompt asks for. */
export function paletteOf(prompt: string, negativePrompt: string | undefined, styleHues: [number, number][]) {
  const list = words(prompt);
  const hues = list.filter((w) => w in HUE_WORDS).map((w) => HUE_WORDS[w] as number);
  const banned = words(negativePrompt)
    .filter((w) => w in HUE_WORDS)
    .map((w) => HUE_WORDS[w] as number);
  const promptHash = hash32(prompt.toLowerCase());
  let base = hues.length > 0 ? (hues[0] as number) : promptHash % 360;
  let accent = hues.length > 1 ? (hues[1] as number) : (base + 150 + ((promptHash >>> 9) % 60)) % 360;
  const near = (a: number, b: number) => Math.min(Math.abs(a - b), 360 - Math.abs(a - b)) < 35;
  // A hue the negative prompt names is rotated away.
  if (banned.some((h) => near(h, base))) base = (base + 180) % 360;
  if (banned.some((h) => near(h, accent))) accent = (accent + 180) % 360;
  // Style references pull both hues toward theirs, by strength.
  for (const [hue, strength] of styleHues) {
    const toward = (from: number) => {
      let d = hue - from;
      if (d > 180) d -= 360;
      if (d < -180) d += 360;
      return (from + d * strength + 360) % 360;
    };
    base = toward(base);
    accent = toward(accent);
  }
  const dark = list.some((w) => DARK_WORDS.has(w));
  const light = list.some((w) => LIGHT_WORDS.has(w));
  return { base, accent, dark, light, hash: promptHash };
}

type StyleLook = { grey: boolean; levels: number; tint: Rgb | null; tintAmount: number; hueShift: number };

/** The look of a style preset: a few named ones, the rest derived from the name's hash. */
export function styleLook(name: string | undefined): StyleLook {
  const none: StyleLook = { grey: false, levels: 0, tint: null, tintAmount: 0, hueShift: 0 };
  if (!name) return none;
  const key = name.toLowerCase();
  if (/(monochrome|line art|film noir|silhouette)/.test(key)) return { ...none, grey: true };
  if (/(pixel|lowpoly|retro|8-bit|minecraft|comic|pop art|flat)/.test(key)) return { ...none, levels: 5 };
  if (/(analog|film|vintage|sepia)/.test(key)) return { ...none, tint: [226, 180, 120], tintAmount: 0.22 };
  const h = hash32(key);
  return { ...none, hueShift: (h % 120) - 60, levels: h % 3 === 0 ? 7 : 0 };
}

/** Mean colour of an image file (a style reference). */
async function meanHue(image: Buffer): Promise<number> {
  const stats = await sharp(image).removeAlpha().stats();
  const [r, g, b] = stats.channels.map((c) => c.mean) as [number, number, number];
  return rgbToHue([r, g, b]);
}

export type RenderInput = {
  prompt: string;
  negativePrompt?: string;
  seed: number;
  steps: number;
  cfgScale?: number;
  loraStrength?: number;
  stylePreset?: string;
  styleHues: [number, number][];
  width: number;
  height: number;
};

/** Draws one picture as raw RGB at `width` × `height`. */
export function renderPixels(input: RenderInput): Buffer {
  const { width, height } = input;
  const random = mulberry32(hash32(String(input.seed), hash32(input.prompt)));
  const palette = paletteOf(input.prompt, input.negativePrompt, input.styleHues);
  const look = styleLook(input.stylePreset);
  const octaves = Math.max(1, Math.min(8, Math.round(input.steps / 2) + 1));
  const contrast = 0.7 + Math.min(20, input.cfgScale ?? 7) / 20; // 0.7 .. 1.7
  const grain = (input.loraStrength ?? 0) / 100;
  const base = palette.base + look.hueShift;
  const accent = palette.accent + look.hueShift;
  const lightness = palette.dark ? 0.18 : palette.light ? 0.78 : 0.55;

  const skyTop = hslToRgb(base + 200, 0.55, Math.max(0.08, lightness - 0.25));
  const skyHorizon = hslToRgb(accent, 0.75, Math.min(0.9, lightness + 0.15));
  const sunColour = hslToRgb(accent + 20, 0.9, palette.dark ? 0.85 : 0.7);
  const ridgeCount = 2 + Math.min(4, Math.floor(input.steps / 4) + (palette.hash % 2));
  const ridges = Array.from({ length: ridgeCount }, (_, i) => {
    const depth = (i + 1) / ridgeCount; // far -> near
    return {
      level: 0.45 + depth * 0.35 + (random() - 0.5) * 0.08,
      amplitude: 0.06 + random() * 0.12 * (1 - depth * 0.4),
      frequency: 1.5 + random() * 3,
      offset: random() * 1000,
      colour: mix(
        skyHorizon,
        hslToRgb(base, 0.5, Math.max(0.05, lightness * (1 - depth * 0.8))),
        0.35 + depth * 0.65,
      ),
    };
  });
  const sun = { x: 0.15 + random() * 0.7, y: 0.18 + random() * 0.25, r: 0.05 + random() * 0.07 };
  const cloudNoise = valueNoise(Math.floor(random() * 2 ** 31));
  const ridgeNoise = valueNoise(Math.floor(random() * 2 ** 31));
  const grainNoise = valueNoise(Math.floor(random() * 2 ** 31));
  const aspect = width / height;

  const out = Buffer.alloc(width * height * 3);
  for (let y = 0; y < height; y++) {
    const v = y / height;
    for (let x = 0; x < width; x++) {
      const u = x / width;
      // Sky: vertical gradient, sun disc with a glow, drifting clouds.
      let colour = mix(skyTop, skyHorizon, Math.min(1, v / 0.6));
      const dx = (u - sun.x) * aspect;
      const dy = v - sun.y;
      const d = Math.sqrt(dx * dx + dy * dy);
      if (d < sun.r) colour = sunColour;
      else colour = mix(colour, sunColour, Math.max(0, 0.5 - (d - sun.r) * 2.5));
      const cloud = fbm(cloudNoise, u * 4 * aspect, v * 8, octaves);
      if (v < 0.6) colour = mix(colour, [245, 245, 250], Math.max(0, cloud - 0.55) * 1.6 * (1 - v / 0.6));
      // Ridges, far to near: the nearest ridge above this pixel paints it.
      for (const ridge of ridges) {
        const line =
          ridge.level -
          ridge.amplitude *
            fbm(ridgeNoise, ridge.offset + u * ridge.frequency * aspect, ridge.offset, octaves);
        if (v > line) {
          const shade = fbm(ridgeNoise, u * 12 * aspect + ridge.offset, v * 12, Math.min(octaves, 4));
          colour = mix(ridge.colour, [0, 0, 0], (shade - 0.5) * 0.35);
        }
      }
      if (grain > 0) {
        const g = (grainNoise(x * 0.9, y * 0.9) - 0.5) * 90 * grain;
        colour = [colour[0] + g, colour[1] + g, colour[2] + g];
      }
      // cfg_scale: contrast around mid-grey.
      colour = [
        (colour[0] - 128) * contrast + 128,
        (colour[1] - 128) * contrast + 128,
        (colour[2] - 128) * contrast + 128,
      ];
      if (look.tint) colour = mix(colour, look.tint, look.tintAmount);
      if (look.grey) {
        const l = colour[0] * 0.299 + colour[1] * 0.587 + colour[2] * 0.114;
        colour = [l, l, l];
      }
      if (look.levels > 0) {
        const step = 255 / (look.levels - 1);
        colour = [
          Math.round(colour[0] / step) * step,
          Math.round(colour[1] / step) * step,
          Math.round(colour[2] / step) * step,
        ];
      }
      const i = (y * width + x) * 3;
      out[i] = Math.max(0, Math.min(255, Math.round(colour[0])));
      out[i + 1] = Math.max(0, Math.min(255, Math.round(colour[1])));
      out[i + 2] = Math.max(0, Math.min(255, Math.round(colour[2])));
    }
  }
  return out;
}

/** The internal drawing size: the asked shape with its long side at the quality's size (never larger). */
export function internalSize(width: number, height: number, quality: keyof typeof INTERNAL_SIZE = 'high') {
  const long = Math.min(INTERNAL_SIZE[quality], Math.max(width, height));
  const scale = long / Math.max(width, height);
  return {
    width: Math.max(1, Math.round(width * scale)),
    height: Math.max(1, Math.round(height * scale)),
  };
}

export function createLocalImageEngine(): ImageProvider {
  return {
    name: 'local',
    async generate(request: ImageProviderRequest): Promise<ImageProviderResult> {
      const styleHues: [number, number][] = [];
      for (const reference of request.styleReferences)
        styleHues.push([await meanHue(reference.image), reference.strength]);
      const size = internalSize(request.width, request.height, request.quality ?? 'high');
      const images: ProviderImage[] = [];
      for (let i = 0; i < request.variants; i++) {
        request.signal?.throwIfAborted();
        const pixels = renderPixels({
          prompt: request.prompt,
          ...(request.negativePrompt ? { negativePrompt: request.negativePrompt } : {}),
          seed: request.seed + i,
          steps: request.steps,
          ...(request.cfgScale !== undefined ? { cfgScale: request.cfgScale } : {}),
          ...(request.loraStrength !== undefined ? { loraStrength: request.loraStrength } : {}),
          ...(request.stylePreset ? { stylePreset: request.stylePreset } : {}),
          styleHues,
          width: size.width,
          height: size.height,
        });
        const data =
          size.width === request.width && size.height === request.height
            ? pixels
            : await sharp(pixels, { raw: { width: size.width, height: size.height, channels: 3 } })
                .resize(request.width, request.height, { fit: 'fill', kernel: 'lanczos3' })
                .raw()
                .toBuffer();
        images.push({ kind: 'raw', data, width: request.width, height: request.height, channels: 3 });
        // Let other requests run between variants: drawing is synchronous.
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
      return { images };
    },
  };
}
