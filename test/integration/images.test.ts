/**
 * Image generation end to end on the embedded engine: the official `openai` SDK against the server, every rule
 * of `POST /image/generate` with a test that fails if the rule is dropped, real files checked with a decoder
 * (sharp) and an EXIF parser, determinism by seed, and exact billing through the ledger. Response validation
 * is on, so every JSON body was checked against the contract.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import exifReader from 'exif-reader';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parse, stringify } from 'yaml';
import type { ImageGenerateResponse } from '../../generated/api.d.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { repoRoot } from '../support/contract.ts';

const defaults = parse(readFileSync(join(repoRoot, 'server/catalog/default-catalog.yaml'), 'utf8')) as {
  models: Record<string, Record<string, unknown>>;
};
/** The shipped image models with rate limits that a test suite's burst of requests does not reach. */
const IMAGE_CATALOG = stringify({
  models: Object.fromEntries(
    ['z-image-turbo', 'nano-banana-pro', 'gpt-image-2'].map((id) => [
      id,
      {
        ...defaults.models[id],
        rateLimits: { paid: { requestsPerMinute: 10_000 }, partner: { requestsPerMinute: 10_000 } },
      },
    ]),
  ),
});

let server: ChatServer;
let key = '';
let accountId = '';
beforeAll(async () => {
  server = await startChatServer({ catalogYaml: IMAGE_CATALOG });
  ({ key, accountId } = await server.account('100'));
});
afterAll(async () => {
  await server?.close();
});

const PROMPT = 'A lighthouse on a basalt cliff at dawn, soft golden light';
const SMALL = { model: 'z-image-turbo', width: 256, height: 256 };

async function post(body: unknown, options: { key?: string; path?: string } = {}) {
  return fetch(`${server.base}${options.path ?? '/image/generate'}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${options.key ?? key}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
}

type Generated = ImageGenerateResponse & { error?: string; details?: unknown };

async function generate(body: Record<string, unknown>, options: { key?: string } = {}) {
  const response = await post({ ...SMALL, prompt: PROMPT, ...body }, options);
  const json = (await response.json()) as Generated;
  if (response.status !== 200) throw new Error(`${response.status}: ${JSON.stringify(json)}`);
  const images = json.images.map((b64) => Buffer.from(b64, 'base64'));
  return { response, json, images, first: images[0] as Buffer };
}

async function refused(body: Record<string, unknown>, status = 400) {
  const response = await post({ ...SMALL, prompt: PROMPT, ...body });
  const json = (await response.json()) as { error?: string; details?: unknown };
  expect(response.status, JSON.stringify(json)).toBe(status);
  expect(typeof json.error).toBe('string');
  return json;
}

async function pixels(image: Buffer) {
  return sharp(image).removeAlpha().raw().toBuffer({ resolveWithObject: true });
}

async function charges(account: string) {
  const entries = await server.services.ledger.listEntries(account, { limit: 1000 });
  return entries.filter((e) => e.type === 'CHARGE');
}

const nano = (usd: string) => parseUsdToNano(usd);

describe('the openai SDK against the server', () => {
  test('behavior: images.generate returns a PNG that decodes, charged per image', async () => {
    const { key: own, accountId: account } = await server.account('5');
    const client = new OpenAI({ apiKey: own, baseURL: server.base, maxRetries: 0 });
    const result = await client.images.generate({
      model: 'dall-e-3',
      prompt: 'A watercolor fox curled up asleep in fresh snow',
      size: '256x256',
      n: 2,
    });
    expect(result.data).toHaveLength(2);
    for (const item of result.data ?? []) {
      const meta = await sharp(Buffer.from(item.b64_json as string, 'base64')).metadata();
      expect(meta.format).toBe('png');
      expect([meta.width, meta.height]).toEqual([256, 256]);
    }
    const lines = await charges(account);
    expect(lines.map((l) => [l.sku, l.modelId])).toEqual([['image.generation', 'z-image-turbo']]);
    expect(lines[0]?.amountNano).toBe(-2n * nano('0.01'));
  });

  test('behavior: response_format url gives data: URLs in the asked output_format', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    const result = await client.images.generate({
      prompt: 'A watercolor fox',
      size: '1792x1024',
      response_format: 'url',
      output_format: 'webp',
    });
    const url = result.data?.[0]?.url as string;
    expect(url).toMatch(/^data:image\/webp;base64,/);
    const meta = await sharp(Buffer.from(url.split(',')[1] as string, 'base64')).metadata();
    expect(meta.format).toBe('webp');
    // 1792x1024 capped at 1280 on the long side, same shape, multiples of 16.
    expect([meta.width, meta.height]).toEqual([1280, 720]);
  });

  test('behavior: an unknown model is 404, an OpenAI name maps through the compatibility table', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: server.base, maxRetries: 0 });
    await expect(client.images.generate({ model: 'no-such-model', prompt: 'x' })).rejects.toMatchObject({
      status: 404,
    });
    const response = await post(
      { model: 'gpt-image-1', prompt: 'x', size: '256x256' },
      { path: '/images/generations' },
    );
    expect(response.status).toBe(200);
    expect(response.headers.get('x-service-model-id')).toBe('z-image-turbo');
  });

  test('behavior: quality hd is read as high on tiered models and priced so', async () => {
    const { key: own, accountId: account } = await server.account('5');
    const response = await post(
      { model: 'gpt-image-2', prompt: 'x', size: '1024x1024', quality: 'standard' },
      { key: own, path: '/images/generations' },
    );
    expect(response.status).toBe(200);
    expect((await charges(account))[0]?.amountNano).toBe(-nano('0.042'));
  });

  test('behavior: moderation low turns safe mode off', async () => {
    const body = { prompt: 'a nude figure study in charcoal', size: '256x256' };
    const auto = await post(body, { path: '/images/generations' });
    expect(auto.headers.get('x-service-is-blurred')).toBe('true');
    const low = await post({ ...body, moderation: 'low' }, { path: '/images/generations' });
    expect(low.headers.get('x-service-is-blurred')).toBe('false');
  });
});

describe('generateImage: files', () => {
  test('behavior: webp by default; png, jpeg and webp decode as their content type says', async () => {
    const byDefault = await generate({});
    expect((await sharp(byDefault.first).metadata()).format).toBe('webp');
    for (const format of ['png', 'jpeg', 'webp'] as const) {
      const response = await post({ ...SMALL, prompt: PROMPT, format, return_binary: true });
      expect(response.status).toBe(200);
      const type = response.headers.get('content-type') ?? '';
      const bytes = Buffer.from(await response.arrayBuffer());
      const meta = await sharp(bytes).metadata();
      expect(type).toBe(`image/${format}`);
      expect(meta.format).toBe(format);
      expect([meta.width, meta.height]).toEqual([256, 256]);
    }
  });

  test('behavior: the same seed gives the same bytes; another seed another image', async () => {
    const a = await generate({ seed: 42, format: 'png' });
    const b = await generate({ seed: 42, format: 'png' });
    const c = await generate({ seed: 43, format: 'png' });
    expect(a.first.equals(b.first)).toBe(true);
    expect(a.first.equals(c.first)).toBe(false);
    for (const format of ['jpeg', 'webp'] as const) {
      const x = await generate({ seed: 5, format, embed_exif_metadata: true });
      const y = await generate({ seed: 5, format, embed_exif_metadata: true });
      expect(x.first.equals(y.first)).toBe(true);
    }
  });

  test('behavior: an omitted seed is random, and the echoed seed reproduces the image', async () => {
    const a = await generate({ format: 'png' });
    const b = await generate({ format: 'png' });
    const seedA = (a.json.request as { seed: number }).seed;
    expect(Number.isInteger(seedA)).toBe(true);
    expect(seedA).not.toBe((b.json.request as { seed: number }).seed);
    expect(a.first.equals(b.first)).toBe(false);
    const again = await generate({ format: 'png', seed: seedA });
    expect(again.first.equals(a.first)).toBe(true);
  });

  test('behavior: EXIF holds the generation info when asked, in every format, and is absent otherwise', async () => {
    for (const format of ['png', 'jpeg', 'webp'] as const) {
      const withExif = await generate({ seed: 9, format, embed_exif_metadata: true, negative_prompt: 'fog' });
      const meta = await sharp(withExif.first).metadata();
      expect(meta.exif, format).toBeDefined();
      const exif = exifReader(meta.exif as Buffer);
      expect(exif.Image?.ImageDescription).toBe(PROMPT);
      expect(exif.Image?.Model).toBe('z-image-turbo');
      const comment = JSON.parse(
        (exif.Photo as { UserComment: Buffer }).UserComment.subarray(8).toString('ascii'),
      ) as Record<string, unknown>;
      expect(comment).toMatchObject({ seed: 9, steps: 8, width: 256, height: 256, negative_prompt: 'fog' });

      const without = await generate({ seed: 9, format });
      expect((await sharp(without.first).metadata()).exif, format).toBeUndefined();
    }
  });

  test('behavior: return_binary gives the file itself; variants > 1 with it is refused', async () => {
    const response = await post({ ...SMALL, prompt: PROMPT, seed: 3, format: 'png', return_binary: true });
    const bytes = Buffer.from(await response.arrayBuffer());
    const json = await generate({ seed: 3, format: 'png' });
    expect(bytes.equals(json.first)).toBe(true);
    await refused({ return_binary: true, variants: 2 });
  });

  test('behavior: variants 1 to 4 give distinct images, each charged', async () => {
    const { key: own, accountId: account } = await server.account('5');
    const { images } = await generate({ variants: 3, seed: 1, format: 'png' }, { key: own });
    expect(images).toHaveLength(3);
    expect(new Set(images.map((i) => i.toString('base64'))).size).toBe(3);
    const lines = await charges(account);
    expect(lines).toHaveLength(1);
    expect(lines[0]?.amountNano).toBe(-3n * nano('0.01'));
    await refused({ variants: 5 });
    await refused({ variants: 0 });
  });

  test('behavior: timing is filled from measurements', async () => {
    const { json } = await generate({});
    const t = json.timing;
    for (const value of Object.values(t)) expect(value).toBeGreaterThanOrEqual(0);
    expect(t.inferenceDuration).toBeGreaterThan(0);
    expect(t.total).toBeGreaterThanOrEqual(
      t.inferenceDuration + t.inferencePreprocessingTime + t.inferenceQueueTime - 0.5,
    );
  });
});

describe('generateImage: sizing', () => {
  test('behavior: pixel models default to 1024 x 1024 and honour width and height', async () => {
    const byDefault = await generate({ width: undefined, height: undefined, format: 'png' });
    expect(await sharp(byDefault.first).metadata()).toMatchObject({ width: 1024, height: 1024 });
    const sized = await generate({ width: 320, height: 192 });
    expect(await sharp(sized.first).metadata()).toMatchObject({ width: 320, height: 192 });
  });

  test('behavior: width and height must be in (0, 1280] and a multiple of the divisor', async () => {
    await refused({ width: 1281 });
    await refused({ height: 0 });
    const json = await refused({ width: 250 });
    expect(json.details).toMatchObject({ width: { _errors: [expect.stringContaining('multiple of 16')] } });
  });

  test('behavior: aspect-ratio models refuse width and height, and draw the asked ratio', async () => {
    await refused({ model: 'nano-banana-pro', width: 256, height: undefined });
    await refused({ model: 'nano-banana-pro', width: undefined, height: 256 });
    await refused({ model: 'nano-banana-pro', width: undefined, height: undefined, aspect_ratio: '5:4' });
    const wide = await generate({
      model: 'nano-banana-pro',
      width: undefined,
      height: undefined,
      aspect_ratio: '16:9',
    });
    expect(await sharp(wide.first).metadata()).toMatchObject({ width: 1024, height: 576 });
  });

  test('behavior: resolution-tier models take aspect_ratio and resolution', async () => {
    const base = { model: 'gpt-image-2', width: undefined, height: undefined, quality: 'low' };
    const oneK = await generate({ ...base, aspect_ratio: '3:2' });
    expect(await sharp(oneK.first).metadata()).toMatchObject({ width: 1024, height: 680 });
    const twoK = await generate({ ...base, aspect_ratio: '1:1', resolution: '2K' });
    expect(await sharp(twoK.first).metadata()).toMatchObject({ width: 2048, height: 2048 });
    await refused({ ...base, resolution: '8K' });
    await refused({ ...base, aspect_ratio: '9:16' });
  });
});

describe('generateImage: prices', () => {
  test('behavior: quality tiers are priced from model_spec.pricing.quality, the default tier when omitted', async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ quality: 'low' }, '0.011'],
      [{ quality: 'medium', resolution: '2K' }, '0.084'],
      [{}, '0.167'],
    ];
    for (const [extra, price] of cases) {
      const { key: own, accountId: account } = await server.account('5');
      await generate({ model: 'gpt-image-2', width: undefined, height: undefined, ...extra }, { key: own });
      const lines = await charges(account);
      expect(
        lines.map((l) => l.amountNano),
        JSON.stringify(extra),
      ).toEqual([-nano(price)]);
      const balance = await server.services.ledger.getBalance(account);
      expect(balance.usdNano).toBe(nano('5') - nano(price));
    }
  });

  test('behavior: a balance below the worst case is refused with 402 before any work', async () => {
    const { key: poor, accountId: account } = await server.account('0.015');
    const response = await post({ ...SMALL, prompt: PROMPT, variants: 2 }, { key: poor });
    expect(response.status).toBe(402);
    expect(await charges(account)).toEqual([]);
    const one = await post({ ...SMALL, prompt: PROMPT }, { key: poor });
    expect(one.status).toBe(200);
  });
});

describe('generateImage: the model rules', () => {
  test('behavior: prompt and negative prompt are bounded by the model promptCharacterLimit', async () => {
    const long = 'a'.repeat(5001);
    await refused({ model: 'nano-banana-pro', width: undefined, height: undefined, prompt: long });
    await refused({ model: 'nano-banana-pro', width: undefined, height: undefined, negative_prompt: long });
    // The same prompt fits z-image-turbo's 7500.
    await generate({ prompt: long });
    await refused({ prompt: 'a'.repeat(7501) });
  });

  test('behavior: cfg_scale in (0, 20] steers the image', async () => {
    const low = await generate({ seed: 4, format: 'png', cfg_scale: 2 });
    const high = await generate({ seed: 4, format: 'png', cfg_scale: 15 });
    expect(low.first.equals(high.first)).toBe(false);
    await refused({ cfg_scale: 0 });
    await refused({ cfg_scale: 20.5 });
  });

  test('behavior: steps add detail and are bounded by the model', async () => {
    const few = await generate({ seed: 4, format: 'png', steps: 2 });
    const many = await generate({ seed: 4, format: 'png', steps: 12 });
    expect(few.first.equals(many.first)).toBe(false);
    await refused({ steps: 13 });
  });

  test('behavior: lora_strength 0 to 100 weighs the texture layer', async () => {
    const none = await generate({ seed: 4, format: 'png', lora_strength: 0 });
    const full = await generate({ seed: 4, format: 'png', lora_strength: 100 });
    expect(none.first.equals(full.first)).toBe(false);
    await refused({ lora_strength: 101 });
  });

  test('behavior: negative_prompt steers the palette away', async () => {
    const plain = await generate({ seed: 4, format: 'png', prompt: 'a red barn' });
    const steered = await generate({ seed: 4, format: 'png', prompt: 'a red barn', negative_prompt: 'red' });
    expect(plain.first.equals(steered.first)).toBe(false);
  });

  test('behavior: style_preset comes from GET /image/styles; unknown names are refused', async () => {
    const styles = (await (await fetch(`${server.base}/image/styles`)).json()) as { data: string[] };
    expect(styles.data).toContain('Analog Film');
    const plain = await generate({ seed: 4, format: 'png' });
    const styled = await generate({ seed: 4, format: 'png', style_preset: 'Analog Film' });
    expect(plain.first.equals(styled.first)).toBe(false);
    expect(styled.json.request).toMatchObject({ style_preset: 'Analog Film' });
    await refused({ style_preset: 'Not A Style' });
  });

  test('behavior: style_references only on models that support them, up to maxStyleReferences', async () => {
    const swatch = async (rgb: [number, number, number]) =>
      `data:image/png;base64,${(
        await sharp({
          create: { width: 16, height: 16, channels: 3, background: { r: rgb[0], g: rgb[1], b: rgb[2] } },
        })
          .png()
          .toBuffer()
      ).toString('base64')}`;
    const red = await swatch([220, 20, 20]);
    const blue = await swatch([20, 40, 230]);
    const nano = { model: 'nano-banana-pro', width: undefined, height: undefined, seed: 8, format: 'png' };
    await refused({ style_references: [{ image: red }] }); // z-image-turbo has no style references
    await refused({ ...nano, style_references: [red, red, red, red].map((image) => ({ image })) });
    await refused({ ...nano, style_references: [{ image: 'data:image/png;base64,bm90IGFuIGltYWdl' }] });
    await refused({ ...nano, style_references: [{ image: 'https://example.com/ref.png' }] });
    const reddish = await generate({ ...nano, style_references: [{ image: red, strength: 1 }] });
    const bluish = await generate({ ...nano, style_references: [{ image: blue, strength: 1 }] });
    const mean = async (image: Buffer) => (await sharp(image).stats()).channels.map((c) => c.mean);
    const [r1, , b1] = await mean(reddish.first);
    const [r2, , b2] = await mean(bluish.first);
    expect((r1 as number) - (b1 as number)).toBeGreaterThan((r2 as number) - (b2 as number));
  });

  test('behavior: anon_user_id is printable ASCII without ||', async () => {
    await generate({ anon_user_id: 'user-48213' });
    await refused({ anon_user_id: 'a||b' });
    await refused({ anon_user_id: 'naïve' });
    await refused({ anon_user_id: 'x'.repeat(129) });
  });

  test('behavior: inpaint is disabled: only null is accepted', async () => {
    await generate({ inpaint: null });
    await refused({ inpaint: { mask: 'x' } });
  });
});

describe('generateImage: content', () => {
  test('behavior: safe_mode blurs adult content and says so; safe_mode false does not', async () => {
    const adult = {
      seed: 6,
      format: 'png',
      prompt: 'a nude figure on a beach at sunset',
      hide_watermark: true,
    };
    const blurred = await generate(adult);
    expect(blurred.response.headers.get('x-service-is-blurred')).toBe('true');
    const clear = await generate({ ...adult, safe_mode: false });
    expect(clear.response.headers.get('x-service-is-blurred')).toBe('false');
    const sharpness = async (image: Buffer) => (await sharp(image).stats()).sharpness;
    expect(await sharpness(blurred.first)).toBeLessThan((await sharpness(clear.first)) / 2);
    const harmless = await generate({ seed: 6, format: 'png', prompt: 'a figure on a beach at sunset' });
    expect(harmless.response.headers.get('x-service-is-blurred')).toBe('false');
  });

  test('behavior: adult content involving minors is refused with 422 and not charged', async () => {
    const { key: own, accountId: account } = await server.account('5');
    const response = await post({ ...SMALL, prompt: 'nude child' }, { key: own });
    expect(response.status).toBe(422);
    expect(await response.json()).toMatchObject({ code: 'CONTENT_POLICY_VIOLATION' });
    expect(await charges(account)).toEqual([]);
  });

  test('behavior: the watermark marks the bottom-right corner unless hide_watermark', async () => {
    const marked = await pixels((await generate({ seed: 2, format: 'png' })).first);
    const hidden = await pixels((await generate({ seed: 2, format: 'png', hide_watermark: true })).first);
    const { width, height } = marked.info;
    const differs = (x0: number, y0: number, x1: number, y1: number) => {
      let count = 0;
      for (let y = y0; y < y1; y++)
        for (let x = x0; x < x1; x++) {
          const i = (y * width + x) * 3;
          if (marked.data[i] !== hidden.data[i] || marked.data[i + 1] !== hidden.data[i + 1]) count++;
        }
      return count;
    };
    expect(differs(width - 48, height - 32, width, height)).toBeGreaterThan(100);
    expect(differs(0, 0, width / 2, height / 2)).toBe(0);
  });

  test('behavior: enhance_prompt rewrites, sends the final prompt URL-encoded, and charges only a rewrite', async () => {
    const { key: own, accountId: account } = await server.account('5');
    const rewritten = await generate({ prompt: 'a lighthouse', enhance_prompt: true }, { key: own });
    const header = rewritten.response.headers.get('x-service-enhanced-prompt');
    expect(header).not.toBeNull();
    expect(decodeURIComponent(header as string)).toBe(
      'A lighthouse, soft natural lighting, highly detailed, balanced composition',
    );
    let lines = await charges(account);
    expect(lines.map((l) => [l.sku, l.amountNano])).toEqual(
      expect.arrayContaining([
        ['image.generation', -nano('0.01')],
        ['image.enhance_prompt', -nano('0.002')],
      ]),
    );
    const plain = await generate({ prompt: 'a lighthouse', seed: 1, format: 'png' }, { key: own });
    const enhanced = await generate(
      { prompt: 'a lighthouse', seed: 1, format: 'png', enhance_prompt: true },
      { key: own },
    );
    expect(plain.first.equals(enhanced.first)).toBe(false);

    // A prompt that already names lighting, detail and composition is not rewritten, and not charged.
    const before = (await charges(account)).length;
    const enhancements = (await charges(account)).filter((l) => l.sku === 'image.enhance_prompt').length;
    const kept = await generate(
      { prompt: 'A lighthouse at dawn, highly detailed, wide view', enhance_prompt: true },
      { key: own },
    );
    expect(kept.response.headers.get('x-service-enhanced-prompt')).toBeNull();
    lines = await charges(account);
    expect(lines.length - before).toBe(1);
    expect(lines.filter((l) => l.sku === 'image.enhance_prompt')).toHaveLength(enhancements);
  });
});

describe('GET /image/styles', () => {
  test('behavior: public, the catalogue list', async () => {
    const response = await fetch(`${server.base}/image/styles`);
    expect(response.status).toBe(200);
    const body = (await response.json()) as { object: string; data: string[] };
    expect(body.object).toBe('list');
    expect(body.data).toEqual(server.services.catalog.imageStyles().data);
  });
});

test('the account used by the shared key exists', () => {
  expect(accountId).not.toBe('');
});
