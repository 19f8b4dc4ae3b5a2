/**
 * Style references as images: raw base64 or a `data:image/...;base64,` URL, each under 8 MB and readable by an
 * image decoder (PNG, JPEG, WebP, GIF, AVIF, TIFF). Remote `https://` references are not fetched by this
 * server (it would make the server fetch arbitrary URLs on a caller's behalf): they are refused with 400, and
 * the caller sends the image data instead.
 */
import sharp from 'sharp';
import { ApiError, badRequest } from '../../http/errors.ts';
import type { ProviderStyleReference } from '../../providers/images/types.ts';

export const MAX_REFERENCE_BYTES = 8 * 1024 * 1024;
const READABLE = new Set(['png', 'jpeg', 'webp', 'gif', 'avif', 'heif', 'tiff']);

function refuse(index: number, message: string, code = 'INVALID_REQUEST'): never {
  throw badRequest(message, code, {
    _errors: [],
    style_references: { _errors: [], [String(index)]: { _errors: [], image: { _errors: [message] } } },
  });
}

export async function decodeStyleReferences(
  references: readonly { image: string; strength: number }[],
): Promise<ProviderStyleReference[]> {
  const decoded: ProviderStyleReference[] = [];
  for (const [index, reference] of references.entries()) {
    const text = reference.image.trim();
    if (/^https?:\/\//i.test(text))
      refuse(
        index,
        'Style reference URLs are not fetched by this server; send the image as base64 or a data: URL',
      );
    const dataUrl = /^data:image\/[a-z0-9.+-]+;base64,/i.exec(text);
    const payload = dataUrl ? text.slice(dataUrl[0].length) : text;
    if (!/^[A-Za-z0-9+/=\s_-]+$/.test(payload))
      refuse(index, 'Style reference is not base64 image data', 'CORRUPTED_IMAGE');
    const image = Buffer.from(payload, 'base64');
    if (image.byteLength >= MAX_REFERENCE_BYTES)
      throw new ApiError(422, `Style reference ${index} is larger than 8 MB`, { code: 'IMAGE_TOO_LARGE' });
    let format: string | undefined;
    try {
      const meta = await sharp(image).metadata();
      format = meta.format;
    } catch {
      format = undefined;
    }
    if (!format || !READABLE.has(format))
      refuse(index, `Style reference ${index} is not a readable image`, 'CORRUPTED_IMAGE');
    decoded.push({ image, strength: reference.strength });
  }
  return decoded;
}
