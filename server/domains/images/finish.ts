/**
 * Finishing, the same for every backend: a provider's image is brought to the exact size asked (cover, centred),
 * blurred when safe mode caught adult content, marked with the service watermark unless `hide_watermark`, and
 * encoded in the asked format, with the generation parameters in EXIF only when `embed_exif_metadata` (sharp
 * strips every other metadata). No step reads the clock or a random source, so the same pixels give the same
 * bytes.
 *
 * The watermark is drawn from shapes, not text (no font is needed): a translucent dark rounded badge in the
 * bottom-right corner holding a light diamond and a bar, about 1/8 of the short side.
 */
import sharp from 'sharp';
import type { ProviderImage } from '../../providers/images/types.ts';

export type ImageFormat = 'png' | 'jpeg' | 'webp';

export const CONTENT_TYPES: Record<ImageFormat, string> = {
  png: 'image/png',
  jpeg: 'image/jpeg',
  webp: 'image/webp',
};

export type FinishOptions = {
  width: number;
  height: number;
  format: ImageFormat;
  blur: boolean;
  watermark: boolean;
  /** Encoder quality 1..100 for jpeg and webp (the default: 90). */
  quality?: number;
  /** EXIF to embed: IFD0 text fields and a JSON comment; absent: no metadata at all. */
  exif?: { description: string; model: string; software: string; comment: Record<string, unknown> };
};

/** Printable ASCII only: EXIF ASCII fields cannot hold anything else. */
function ascii(text: string): string {
  return text.replace(/[^\x20-\x7e]/g, '?');
}

/** JSON with every non-ASCII character escaped, so it survives an ASCII EXIF comment intact. */
function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}

export function watermarkSvg(width: number, height: number): { svg: Buffer; left: number; top: number } {
  const size = Math.max(16, Math.round(Math.min(width, height) / 8));
  const w = Math.min(width, Math.round(size * 1.8));
  const h = Math.min(height, size);
  const margin = Math.max(0, Math.round(size / 4));
  const r = Math.round(h / 5);
  const cy = h / 2;
  const d = h * 0.3;
  const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}">
<rect x="0" y="0" width="${w}" height="${h}" rx="${r}" ry="${r}" fill="#101418" fill-opacity="0.55"/>
<path d="M ${h * 0.5} ${cy - d} L ${h * 0.5 + d} ${cy} L ${h * 0.5} ${cy + d} L ${h * 0.5 - d} ${cy} Z" fill="#f4f1ea" fill-opacity="0.9"/>
<rect x="${h * 0.95}" y="${cy - h * 0.08}" width="${Math.max(1, w - h * 1.2)}" height="${h * 0.16}" rx="${h * 0.08}" fill="#f4f1ea" fill-opacity="0.9"/>
</svg>`;
  return {
    svg: Buffer.from(svg),
    left: Math.max(0, width - w - margin),
    top: Math.max(0, height - h - margin),
  };
}

export async function finishImage(image: ProviderImage, options: FinishOptions): Promise<Buffer> {
  let pipeline =
    image.kind === 'raw'
      ? sharp(image.data, { raw: { width: image.width, height: image.height, channels: image.channels } })
      : sharp(image.data);
  pipeline = pipeline
    .removeAlpha()
    .resize(options.width, options.height, { fit: 'cover', position: 'centre' });
  if (options.blur) {
    // Strong enough that no detail survives: sigma of 1/30 of the long side. Blur needs its own pass so that
    // the watermark drawn next stays sharp.
    const sigma = Math.max(2, Math.max(options.width, options.height) / 30);
    const blurred = await pipeline.blur(sigma).raw().toBuffer({ resolveWithObject: true });
    pipeline = sharp(blurred.data, {
      raw: { width: blurred.info.width, height: blurred.info.height, channels: blurred.info.channels as 3 },
    });
  }
  if (options.watermark) {
    const mark = watermarkSvg(options.width, options.height);
    pipeline = pipeline.composite([{ input: mark.svg, left: mark.left, top: mark.top }]);
  }
  if (options.exif) {
    pipeline = pipeline.withExif({
      IFD0: {
        ImageDescription: ascii(options.exif.description),
        Make: ascii(options.exif.software),
        Model: ascii(options.exif.model),
        Software: ascii(options.exif.software),
      },
      IFD2: { UserComment: asciiJson(options.exif.comment) },
    });
  }
  const quality = options.quality ?? 90;
  switch (options.format) {
    case 'png':
      return pipeline.png({ compressionLevel: 6 }).toBuffer();
    case 'jpeg':
      return pipeline.jpeg({ quality, mozjpeg: true }).toBuffer();
    default:
      return pipeline.webp({ quality }).toBuffer();
  }
}
