import { describe, expect, test } from 'vitest';
import { loadCatalog } from '../../server/catalog/load.ts';
import type { CatalogModel } from '../../server/catalog/types.ts';
import { resolveVideoOptions } from '../../server/domains/video/options.ts';
import { failureOf } from '../../server/domains/video/worker.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { looksLikeMp4 } from '../../server/providers/video/http.ts';
import { frameSize, renderFrame, sceneOf, tierHeight } from '../../server/providers/video/local.ts';
import { VideoProviderError } from '../../server/providers/video/types.ts';

const catalog = loadCatalog();
const t2v = catalog.models.get('wan-2-7-text-to-video') as CatalogModel;
const i2v = catalog.models.get('wan-2-7-image-to-video') as CatalogModel;

describe('resolveVideoOptions', () => {
  test('behavior: price = seconds × resolution price + seconds × audio price, as charge lines', () => {
    const options = resolveVideoOptions(t2v, { duration: '10s', resolution: '1080p', audio: true });
    expect(options.priceNano).toBe(parseUsdToNano('1.4'));
    expect(options.items.map((i) => [i.sku, i.units, i.amountNano])).toEqual([
      ['video.seconds.1080p', 10, parseUsdToNano('1.2')],
      ['video.audio_seconds', 10, parseUsdToNano('0.2')],
    ]);
    expect(resolveVideoOptions(t2v, { duration: '10s', resolution: '1080p', audio: false }).priceNano).toBe(
      parseUsdToNano('1.2'),
    );
  });

  test('behavior: defaults: 720p, 16:9, audio on; auto duration is the first listed', () => {
    const options = resolveVideoOptions(t2v, { duration: 'auto' });
    expect(options).toMatchObject({
      duration: '5s',
      durationSeconds: 5,
      resolution: '720p',
      aspectRatio: '16:9',
      audio: true,
    });
    expect(resolveVideoOptions(t2v, { duration: '5s', aspect_ratio: '9:16' }).aspectRatio).toBe('9:16');
  });

  test('behavior: image-to-video takes its shape from the image (no aspect ratio)', () => {
    expect(resolveVideoOptions(i2v, { duration: '5s', aspect_ratio: '1:1' }).aspectRatio).toBeUndefined();
  });

  test('behavior: a duration, resolution or aspect ratio the model lacks is a 400', () => {
    for (const input of [
      { duration: '7s' },
      { duration: '5s', resolution: '4k' },
      { duration: '5s', aspect_ratio: '21:9' },
    ]) {
      expect(() => resolveVideoOptions(t2v, input)).toThrow(expect.objectContaining({ status: 400 }));
    }
  });

  test('behavior: a model whose soundtrack cannot be turned off always charges audio', () => {
    const fixed = {
      ...t2v,
      spec: { ...t2v.spec, constraints: { ...t2v.spec.constraints, audio_configurable: false } },
    } as CatalogModel;
    expect(resolveVideoOptions(fixed, { duration: '5s', resolution: '480p', audio: false }).audio).toBe(true);
  });
});

describe('local video engine', () => {
  test('behavior: frame sizes follow the tier and the aspect ratio (even sides)', () => {
    expect(frameSize('720p', '16:9')).toEqual({ width: 1280, height: 720 });
    expect(frameSize('480p', '16:9')).toEqual({ width: 854, height: 480 });
    expect(frameSize('1080p', '9:16')).toEqual({ width: 1080, height: 1920 });
    expect(frameSize('480p', '1:1')).toEqual({ width: 480, height: 480 });
    expect(tierHeight('2K')).toBe(1440);
    expect(() => tierHeight('2x')).toThrow(VideoProviderError);
  });

  test('behavior: the scene depends on prompt and seed; frames move over time', () => {
    const base = {
      model: 'm',
      prompt: 'a red kite over hills',
      duration: '5s',
      durationSeconds: 5,
      resolution: '480p',
      audio: false,
      seed: 1,
    };
    expect(sceneOf(base)).toEqual(sceneOf({ ...base }));
    expect(sceneOf(base)).not.toEqual(sceneOf({ ...base, seed: 2 }));
    expect(sceneOf(base)).not.toEqual(sceneOf({ ...base, prompt: 'a blue boat' }));
    const size = { width: 64, height: 36 };
    const scene = sceneOf(base);
    const first = Buffer.alloc(64 * 36 * 3);
    const later = Buffer.alloc(64 * 36 * 3);
    renderFrame(scene, size, 0, 24, first);
    renderFrame(scene, size, 48, 24, later);
    expect(first.equals(later)).toBe(false);
    const again = Buffer.alloc(64 * 36 * 3);
    renderFrame(scene, size, 0, 24, again);
    expect(again.equals(first)).toBe(true);
  });
});

describe('video failures', () => {
  test('behavior: provider error kinds map to the stored failure codes', () => {
    expect(failureOf(new VideoProviderError('content_policy', 'no', { recommendedModel: 'x' }))).toEqual({
      code: 'CONTENT_POLICY_VIOLATION',
      message: 'no',
      recommendedModel: 'x',
    });
    expect(failureOf(new VideoProviderError('timeout', 't')).code).toBe('REQUEST_TIMEOUT');
    expect(failureOf(new VideoProviderError('bad_request', 'b')).code).toBe('INVALID_REQUEST');
    expect(failureOf(new Error('boom')).code).toBe('INFERENCE_FAILED');
  });

  test('behavior: only bytes with an ftyp box pass as MP4', () => {
    expect(looksLikeMp4(Buffer.from('\u0000\u0000\u0000\u0018ftypisom0000'))).toBe(true);
    expect(looksLikeMp4(Buffer.from('<html>not a video</html>'))).toBe(false);
  });
});
