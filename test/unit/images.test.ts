/**
 * The pure parts of image generation: the documented content check, the deterministic prompt rewrite, prices
 * from the catalogue, the OpenAI size translations, and the embedded engine's determinism.
 */
import { describe, expect, test } from 'vitest';
import { loadCatalog } from '../../server/catalog/load.ts';
import { fitPixels, nearestRatio, toGenerateRequest } from '../../server/domains/images/compat.ts';
import { checkPromptContent } from '../../server/domains/images/content.ts';
import { enhancePrompt } from '../../server/domains/images/enhance.ts';
import { chargeItems, imagePriceNano, worstCaseNano } from '../../server/domains/images/pricing.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { renderPixels } from '../../server/providers/images/local.ts';
import { nearestOpenAiSize } from '../../server/providers/images/openai-compatible.ts';

const catalog = loadCatalog();
const model = (id: string) => {
  const found = catalog.models.get(id);
  if (!found) throw new Error(id);
  return found;
};

describe('checkPromptContent', () => {
  test('behavior: adult terms as whole words, case-insensitive, plural too', () => {
    expect(checkPromptContent('A NUDE study').adult).toBe(true);
    expect(checkPromptContent('two nudes in charcoal').adult).toBe(true);
    expect(checkPromptContent('a sextant on a desk').adult).toBe(false);
    expect(checkPromptContent('a lighthouse').adult).toBe(false);
  });
  test('behavior: adult content with a minor is a violation; either alone is not', () => {
    expect(checkPromptContent('nude child').violation).toBe(true);
    expect(checkPromptContent('a child flying a kite').violation).toBe(false);
    expect(checkPromptContent('nude adult').violation).toBe(false);
  });
});

describe('enhancePrompt', () => {
  test('behavior: adds what the prompt lacks, in order', () => {
    expect(enhancePrompt('a  lighthouse.', 7500)).toBe(
      'A lighthouse, soft natural lighting, highly detailed, balanced composition',
    );
    expect(enhancePrompt('a lighthouse at dawn', 7500)).toBe(
      'A lighthouse at dawn, highly detailed, balanced composition',
    );
  });
  test('behavior: no rewrite when nothing is missing or nothing fits', () => {
    expect(enhancePrompt('A lighthouse at dawn, highly detailed, wide view', 7500)).toBeUndefined();
    expect(enhancePrompt('A lighthouse', 20)).toBeUndefined();
  });
  test('behavior: the rewrite never exceeds the limit', () => {
    const out = enhancePrompt('A lighthouse', 40) as string;
    expect(out).toBe('A lighthouse, soft natural lighting');
    expect(out.length).toBeLessThanOrEqual(40);
  });
});

describe('image prices', () => {
  const usd = parseUsdToNano;
  test('behavior: quality tier, resolution tier, generation', () => {
    expect(imagePriceNano(model('gpt-image-2'), { resolution: '4K', quality: 'medium' })).toBe(usd('0.168'));
    expect(imagePriceNano(model('gpt-image-2'), { resolution: '2K' })).toBe(usd('0.334'));
    expect(imagePriceNano(model('z-image-turbo'), {})).toBe(usd('0.01'));
  });
  test('behavior: worst case counts variants and the asked enhancement; charges only a real rewrite', () => {
    const m = model('z-image-turbo');
    expect(worstCaseNano(m, { tier: {}, variants: 4, enhance: true })).toBe(usd('0.042'));
    expect(chargeItems(m, { tier: {}, images: 4, enhanced: false }).map((i) => i.amountNano)).toEqual([
      usd('0.04'),
    ]);
    expect(chargeItems(m, { tier: {}, images: 1, enhanced: true }).map((i) => [i.sku, i.amountNano])).toEqual(
      [
        ['image.generation', usd('0.01')],
        ['image.enhance_prompt', usd('0.002')],
      ],
    );
  });
});

describe('OpenAI sizes', () => {
  test('behavior: pixel sizes are capped at 1280 keeping the shape, on the divisor', () => {
    expect(fitPixels(1792, 1024, 16)).toEqual({ width: 1280, height: 720 });
    expect(fitPixels(1024, 1024, 16)).toEqual({ width: 1024, height: 1024 });
    expect(fitPixels(256, 256, 16)).toEqual({ width: 256, height: 256 });
  });
  test('behavior: the nearest offered ratio', () => {
    expect(nearestRatio(1792, 1024, ['1:1', '3:2', '16:9'])).toBe('16:9');
    expect(nearestRatio(1024, 1536, ['1:1', '2:3', '9:16'])).toBe('2:3');
  });
  test('behavior: the nearest OpenAI size sent upstream', () => {
    expect(nearestOpenAiSize(256, 256)).toBe('256x256');
    expect(nearestOpenAiSize(1024, 576)).toBe('1792x1024');
    expect(nearestOpenAiSize(680, 1024)).toBe('1024x1536');
  });
  test('behavior: the OpenAI request becomes a generate request', () => {
    expect(
      toGenerateRequest(model('gpt-image-2'), { prompt: 'x', size: '1536x1024', quality: 'hd', n: 2 }),
    ).toMatchObject({ aspect_ratio: '3:2', quality: 'high', variants: 2, format: 'png', safe_mode: true });
    expect(
      toGenerateRequest(model('z-image-turbo'), { prompt: 'x', moderation: 'low', quality: 'auto' }),
    ).toEqual({
      model: 'z-image-turbo',
      prompt: 'x',
      variants: 1,
      format: 'png',
      safe_mode: false,
    });
  });
});

describe('renderPixels', () => {
  const input = { prompt: 'a forest at night', seed: 1, steps: 8, styleHues: [], width: 48, height: 32 };
  test('behavior: deterministic per seed and prompt', () => {
    expect(renderPixels(input).equals(renderPixels(input))).toBe(true);
    expect(renderPixels(input).equals(renderPixels({ ...input, seed: 2 }))).toBe(false);
    expect(renderPixels(input).equals(renderPixels({ ...input, prompt: 'a desert at noon' }))).toBe(false);
    expect(renderPixels(input)).toHaveLength(48 * 32 * 3);
  });
  test('behavior: a greyscale style preset draws grey', () => {
    const grey = renderPixels({ ...input, stylePreset: 'Monochrome' });
    for (let i = 0; i < grey.length; i += 3) {
      expect(grey[i]).toBe(grey[i + 1]);
      expect(grey[i + 1]).toBe(grey[i + 2]);
    }
  });
});
