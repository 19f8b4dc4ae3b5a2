/**
 * The model catalogue: the shipped file loads and agrees with the contract (schemas and the spec's own
 * examples), money is parsed exactly, overrides merge as documented and bad files are refused with every
 * problem located, model names resolve (ids, suffixes, traits, aliases, deprecation), and characters filter,
 * sort and page.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import type { Character, Model, ModelType, ModelTypeFilter } from '../../generated/api.d.ts';
import { buildCatalog, CatalogError, DEFAULT_CATALOG_PATH, loadCatalog } from '../../server/catalog/load.ts';
import { MODEL_TYPES } from '../../server/catalog/schema.ts';
import { createCatalogService, parseModelSuffix } from '../../server/catalog/service.ts';
import { formatNanoUsd, nanoToUsdNumber, parseUsdToNano } from '../../server/money.ts';
import {
  ContractValidator,
  deref,
  listOperations,
  loadBundle,
  mediaExamples,
  mediaOf,
} from '../support/contract.ts';

type Json = Record<string, unknown>;

const doc = loadBundle();
const validator = new ContractValidator(doc);
const operations = listOperations(doc);
const NOW = Date.parse('2026-11-21T06:00:00.000Z');
const catalog = loadCatalog();
const service = createCatalogService(catalog, { now: () => NOW });
const FILTERS: ModelTypeFilter[] = [...MODEL_TYPES, 'all', 'code'];

/** The named examples of the JSON 200 response of an operation. */
function responseExamples(operationId: string): Map<string, Json> {
  const op = operations.find((o) => o.operationId === operationId);
  if (!op) throw new Error(`no operation ${operationId}`);
  const media = mediaOf(deref(doc, op.responses['200']), 'application/json');
  return new Map(mediaExamples(doc, media).map((e) => [e.name, e.value as Json]));
}

function example(operationId: string, name: string): Json {
  const value = responseExamples(operationId).get(name);
  if (!value) throw new Error(`no example ${name} of ${operationId}`);
  return value;
}

const tempDir = mkdtempSync(join(tmpdir(), 'catalog-test-'));
afterAll(() => rmSync(tempDir, { recursive: true, force: true }));
let fileCount = 0;

/** Writes an override file and returns its path. */
function overrideFile(text: string): string {
  const path = join(tempDir, `override-${++fileCount}.yaml`);
  writeFileSync(path, text);
  return path;
}

/** The problems of a catalogue that must fail to load. */
function problemsOf(load: () => unknown): string[] {
  try {
    load();
  } catch (error) {
    if (error instanceof CatalogError) return [...error.problems];
    throw error;
  }
  throw new Error('the catalogue loaded');
}

/** A valid whole model entry, for overrides. */
const textEntry = (name: string, price: string) => `
    type: text
    created: 1767225600
    provider:
      - { kind: openai-compatible, baseUrl: 'https://inference.example.net/v1', apiKeyEnv: EXAMPLE_KEY }
      - { kind: local }
    rateLimits:
      paid: { requestsPerMinute: 10 }
      partner: { requestsPerMinute: 40 }
    maxConcurrency: 2
    model_spec:
      name: ${name}
      privacy: anonymized
      availableContextTokens: 8192
      maxCompletionTokens: 4096
      pricing: { input: '${price}', output: '1' }
      constraints: { temperature: { default: 0.7 }, top_p: { default: 1 } }
      capabilities:
        optimizedForCode: false
        quantization: not-available
        supportsFunctionCalling: false
        supportsAudioInput: false
        supportsReasoning: false
        supportsReasoningEffort: false
        supportsResponseSchema: false
        supportsMultipleImages: false
        supportsVision: false
        supportsVideoInput: false
        supportsWebSearch: false
        supportsLogProbs: false
        supportsTeeAttestation: false
        supportsE2EE: false
        supportsXSearch: false
`;

describe('parseUsdToNano', () => {
  test('behavior: decimal strings become exact nano-USD', () => {
    expect(parseUsdToNano('0.000000001')).toBe(1n);
    expect(parseUsdToNano('0.7')).toBe(700_000_000n);
    expect(parseUsdToNano('2.8')).toBe(2_800_000_000n);
    expect(parseUsdToNano('12')).toBe(12_000_000_000n);
    expect(parseUsdToNano('0')).toBe(0n);
    expect(parseUsdToNano('123456789.123456789')).toBe(123_456_789_123_456_789n);
  });

  test('behavior: no floating point error (0.1 + 0.2 is 0.3)', () => {
    expect(parseUsdToNano('0.1') + parseUsdToNano('0.2')).toBe(parseUsdToNano('0.3'));
  });

  test.each([
    ['0.0000000001', /more than 9 decimal places/],
    ['1e-10', /not a plain/],
    ['1.5e3', /not a plain/],
    ['-1', /not a plain/],
    ['+1', /not a plain/],
    ['', /not a plain/],
    [' 1', /not a plain/],
    ['01', /not a plain/],
    ['1.', /not a plain/],
    ['.5', /not a plain/],
    ['0x10', /not a plain/],
    ['NaN', /not a plain/],
    ['Infinity', /not a plain/],
    ['1,5', /not a plain/],
  ])('behavior: %j is refused', (input, message) => {
    expect(() => parseUsdToNano(input)).toThrow(message);
  });

  test('behavior: nano-USD formats back to the shortest exact decimal and JSON number', () => {
    expect(formatNanoUsd(700_000_000n)).toBe('0.7');
    expect(formatNanoUsd(1n)).toBe('0.000000001');
    expect(formatNanoUsd(9_000_000_000n)).toBe('9');
    expect(formatNanoUsd(-5n)).toBe('-0.000000005');
    expect(nanoToUsdNumber(parseUsdToNano('0.000049'))).toBe(0.000049);
    expect(nanoToUsdNumber(parseUsdToNano('0.3'))).toBe(0.3);
  });
});

describe('loadCatalog', () => {
  test('behavior: the shipped catalogue has models of every type and a default for each', () => {
    for (const type of MODEL_TYPES) {
      const models = [...catalog.models.values()].filter((m) => m.type === type);
      expect(models.length, type).toBeGreaterThan(0);
      expect(
        models.map((m) => m.id),
        type,
      ).toContain(catalog.traits[type]?.default);
    }
    expect(catalog.sources).toEqual([DEFAULT_CATALOG_PATH]);
  });

  test('behavior: prices are held in nano-USD and DIEM', () => {
    const llama = catalog.models.get('llama-3.3-70b');
    expect(llama?.pricing?.input).toEqual({ usd: 700_000_000n, diem: 700_000_000n });
    expect(catalog.models.get('gpt-image-2')?.pricing?.quality?.['2K']?.medium?.usd).toBe(84_000_000n);
    expect(catalog.models.get('jev-latest')?.pricing?.output?.usd).toBe(0n);
  });

  test('behavior: internal fields are normalised for the server', () => {
    const llama = catalog.models.get('llama-3.3-70b');
    expect(llama?.backends).toEqual([{ kind: 'local', name: 'local' }]);
    expect(llama?.rateLimits.paid).toEqual({
      requestsPerMinute: 50,
      requestsPerDay: 100000,
      tokensPerMinute: 750000,
    });
    expect(llama?.maxConcurrency).toBeGreaterThan(0);
    expect(llama?.pro).toBe(false);
    expect(catalog.models.get('qwen3-coder-480b')?.pro).toBe(true);
    expect(catalog.models.get('openai/whisper-large-v3')?.backends).toEqual([]);
    expect(catalog.models.get('tts-kokoro')?.sampleRateHz).toBe(24000);
    expect(catalog.models.get('wan-2-7-image-to-video')?.video).toMatchObject({
      consentFlow: 'face_media',
      downloadUrl: true,
    });
  });

  test('behavior: reasoning flags follow the capabilities (reasoning_content vs the older <think> tags)', () => {
    const pick = (id: string) => {
      const m = catalog.models.get(id);
      return {
        reasoning: m?.reasoning,
        thinkingTags: m?.thinkingTags,
        canDisableThinking: m?.canDisableThinking,
      };
    };
    expect(pick('llama-3.3-70b')).toEqual({
      reasoning: false,
      thinkingTags: false,
      canDisableThinking: false,
    });
    expect(pick('qwen3-235b')).toEqual({ reasoning: true, thinkingTags: false, canDisableThinking: true });
    expect(pick('deepseek-r1-671b')).toEqual({
      reasoning: true,
      thinkingTags: true,
      canDisableThinking: false,
    });
  });

  test('behavior: the video quotes of the spec follow from the per-second prices', () => {
    // POST /video/quote examples: 5 s at 720p with audio = 0.5; 10 s at 1080p without audio = 1.35.
    const t2v = catalog.models.get('wan-2-7-text-to-video')?.video;
    const i2v = catalog.models.get('wan-2-7-image-to-video')?.video;
    expect(t2v && formatNanoUsd(5n * ((t2v.pricePerSecond['720p'] ?? 0n) + t2v.audioPricePerSecond))).toBe(
      '0.5',
    );
    expect(i2v && formatNanoUsd(10n * (i2v.pricePerSecond['1080p'] ?? 0n))).toBe('1.35');
  });
});

describe('listModels', () => {
  test.each(FILTERS)('behavior: type=%s validates against ModelList', (type) => {
    for (const includeBeta of [false, true]) {
      const list = service.listModels(type, { includeBeta });
      expect(validator.validate(validator.schema('ModelList'), list)).toEqual([]);
      expect(list.type).toBe(type);
      expect(list.data.length).toBeGreaterThan(0);
    }
  });

  test('behavior: without a type only text models are listed; a type selects its models only', () => {
    expect(service.listModels().type).toBe('text');
    expect(new Set(service.listModels().data.map((m) => m.type))).toEqual(new Set(['text']));
    for (const type of MODEL_TYPES) {
      expect(new Set(service.listModels(type).data.map((m) => m.type))).toEqual(new Set([type]));
    }
    expect(service.listModels('all').data.length).toBe(
      MODEL_TYPES.reduce((n, type) => n + service.listModels(type).data.length, 0),
    );
  });

  test('behavior: code lists exactly the text models optimized for code', () => {
    const code = service.listModels('code', { includeBeta: true }).data;
    expect(code.map((m) => m.id).sort()).toEqual(['qwen3-235b', 'qwen3-coder-480b']);
    expect(code.every((m) => m.model_spec.capabilities?.optimizedForCode === true)).toBe(true);
  });

  test('behavior: beta models are listed only for beta accounts', () => {
    expect(service.listModels('text').data.map((m) => m.id)).not.toContain('qwen3-next-80b');
    expect(service.listModels('text', { includeBeta: true }).data.map((m) => m.id)).toContain(
      'qwen3-next-80b',
    );
  });

  test("behavior: the spec's ModelList examples are what the catalogue serves", () => {
    const examples = responseExamples('listModels');
    expect([...examples.keys()].sort()).toEqual(['embedding', 'image', 'text', 'tts']);
    for (const [name, value] of examples) {
      const served = new Map(service.listModels(value.type as ModelTypeFilter).data.map((m) => [m.id, m]));
      for (const model of value.data as Model[]) {
        expect(served.get(model.id), `${name}: ${model.id}`).toEqual(model);
      }
    }
  });

  test('behavior: prices come out as USD numbers, traits and pro from the catalogue', () => {
    const all = new Map(service.listModels('all', { includeBeta: true }).data.map((m) => [m.id, m]));
    expect(all.get('llama-3.3-70b')?.model_spec.pricing?.input).toEqual({ usd: 0.7, diem: 0.7 });
    expect(all.get('gpt-image-2')?.model_spec.pricing?.quality?.['4K']?.medium).toEqual({
      usd: 0.168,
      diem: 0.168,
    });
    expect(all.get('llama-3.3-70b')?.model_spec.traits).toEqual([
      'default',
      'function_calling_default',
      'fastest',
    ]);
    expect(all.get('qwen3-coder-480b')?.model_spec.pro).toBe(true);
    expect(all.get('llama-3.3-70b')?.model_spec).not.toHaveProperty('pro');
    expect(all.get('llama-3.3-70b')?.context_length).toBe(131072);
    expect(all.get('z-image-turbo')).not.toHaveProperty('context_length');
  });

  test('behavior: internal fields never appear in the output', () => {
    const list = service.listModels('all', { includeBeta: true });
    const modelKeys = Object.keys((validator.schema('Model').properties ?? {}) as Json);
    const specKeys = Object.keys((validator.schema('ModelSpec').properties ?? {}) as Json);
    for (const model of list.data) {
      expect(
        Object.keys(model).filter((k) => !modelKeys.includes(k)),
        model.id,
      ).toEqual([]);
      expect(
        Object.keys(model.model_spec).filter((k) => !specKeys.includes(k)),
        model.id,
      ).toEqual([]);
    }
    const text = JSON.stringify(list);
    for (const internal of [
      'provider',
      'backends',
      'rateLimits',
      'maxConcurrency',
      'canDisableThinking',
      'sampleRateHz',
      'pricePerSecond',
      'baseUrl',
      'apiKeyEnv',
      'systemPrompt',
    ]) {
      expect(text).not.toContain(`"${internal}"`);
    }
  });

  test('behavior: a caller cannot change a listed model (the list is shared and read-only)', () => {
    const [first] = service.listModels().data as Model[];
    if (!first) throw new Error('no text model');
    expect(() => {
      first.model_spec.name = 'changed';
    }).toThrow(TypeError);
    expect(() => first.model_spec.traits.push('changed')).toThrow(TypeError);
    expect(service.listModels()).toBe(service.listModels());
    expect(service.toPublicModel(service.getModel(first.id) as never)).not.toBe(first);
    const [again] = service.listModels().data;
    expect(again?.model_spec.name).toBe('Llama 3.3 70B');
    expect(again?.model_spec.traits).not.toContain('changed');
  });
});

describe('traits, compatibility and styles', () => {
  test.each(FILTERS)('behavior: traits of %s validate against ModelTraitList', (type) => {
    const traits = service.listTraits(type);
    expect(validator.validate(validator.schema('ModelTraitList'), traits)).toEqual([]);
    expect(traits.type).toBe(type);
  });

  test("behavior: the spec's trait examples hold", () => {
    for (const [, value] of responseExamples('listModelTraits')) {
      const served = service.listTraits(value.type as ModelTypeFilter);
      expect(served.data).toMatchObject(value.data as Json);
    }
    expect(service.listTraits().type).toBe('text');
    expect(service.listTraits('image').data.default).toBe('z-image-turbo');
    expect(service.listTraits('all').data.default).toBe('llama-3.3-70b');
    expect(Object.values(service.listTraits('code').data)).toEqual(['qwen3-235b', 'qwen3-235b']);
  });

  test.each(MODEL_TYPES)(
    'behavior: compatibility of %s validates against ModelCompatibilityMapping',
    (type) => {
      const mapping = service.listCompatibility(type);
      expect(validator.validate(validator.schema('ModelCompatibilityMapping'), mapping)).toEqual([]);
    },
  );

  test("behavior: the spec's compatibility examples hold and map to models of the same type", () => {
    for (const [, value] of responseExamples('listModelCompatibilityMapping')) {
      expect(service.listCompatibility(value.type as ModelType).data).toMatchObject(value.data as Json);
    }
    expect(service.listCompatibility('asr').data['whisper-1']).toBe('openai/whisper-large-v3');
    for (const type of MODEL_TYPES) {
      for (const id of Object.values(service.listCompatibility(type).data)) {
        expect(catalog.models.get(id)?.type).toBe(type);
      }
    }
  });

  test("behavior: image styles are the spec's list and validate against ImageStyleList", () => {
    const styles = service.imageStyles();
    expect(validator.validate(validator.schema('ImageStyleList'), styles)).toEqual([]);
    expect(styles).toEqual(example('listImageStyles', 'styles'));
  });
});

describe('model ids of the spec', () => {
  /** Every string under a model-naming key anywhere in the bundle (examples, parameters, headers). */
  function modelNames(node: unknown, out = new Set<string>()): Set<string> {
    if (Array.isArray(node)) for (const item of node) modelNames(item, out);
    else if (node && typeof node === 'object') {
      for (const [key, value] of Object.entries(node)) {
        if (
          ['model', 'modelId', 'replacementModelId', 'apiModelId'].includes(key) &&
          typeof value === 'string'
        ) {
          out.add(value);
        } else modelNames(value, out);
      }
    }
    return out;
  }

  test('behavior: every model the spec names resolves in the catalogue', () => {
    const names = modelNames(doc.paths);
    for (const header of ['XServiceModelId']) names.add(String(doc.components.headers?.[header]?.example));
    expect(names.size).toBeGreaterThan(10);
    const unresolved = [...names].filter((name) => !service.resolveModel(name));
    expect(unresolved).toEqual([]);
    for (const id of [
      'llama-3.3-70b',
      'qwen3-235b',
      'deepseek-r1-671b',
      'mistral-31-24b',
      'z-image-turbo',
      'nano-banana-pro',
      'gpt-image-2',
      'text-embedding-bge-m3',
      'tts-kokoro',
      'openai/whisper-large-v3',
      'wan-2-7-text-to-video',
      'wan-2-7-image-to-video',
      'jev-latest',
    ]) {
      expect(names.has(id) || catalog.models.has(id), id).toBe(true);
      expect(catalog.models.has(id), id).toBe(true);
    }
  });
});

describe('resolveModel', () => {
  test('behavior: an id resolves to itself', () => {
    expect(service.resolveModel('llama-3.3-70b', 'text')).toMatchObject({
      model: { id: 'llama-3.3-70b' },
      requestedAs: 'id',
      requestedName: 'llama-3.3-70b',
      suffixOptions: {},
    });
  });

  test('behavior: the option suffix is split off and parsed', () => {
    const resolved = service.resolveModel(
      'llama-3.3-70b:enable_web_search=auto&enable_web_citations=true',
      'text',
    );
    expect(resolved?.model.id).toBe('llama-3.3-70b');
    expect(resolved?.suffixOptions).toEqual({ enable_web_search: 'auto', enable_web_citations: 'true' });
  });

  test('behavior: ids with / and . resolve, with or without a suffix', () => {
    expect(service.resolveModel('openai/whisper-large-v3', 'asr')?.model.id).toBe('openai/whisper-large-v3');
    expect(service.resolveModel('openai/whisper-large-v3:language=en', 'asr')).toMatchObject({
      model: { id: 'openai/whisper-large-v3' },
      suffixOptions: { language: 'en' },
    });
  });

  test('behavior: the suffix starts at the first : followed by key=', () => {
    expect(parseModelSuffix('org/model:v2:a=1&b=2')).toEqual({
      name: 'org/model:v2',
      options: { a: '1', b: '2' },
    });
    expect(parseModelSuffix('plain-model')).toEqual({ name: 'plain-model', options: {} });
    expect(parseModelSuffix('m:character_slug=the%20archivist&a=1&a=2&flag')).toEqual({
      name: 'm',
      options: { character_slug: 'the archivist', a: '2', flag: '' },
    });
    expect(Object.getPrototypeOf(parseModelSuffix('m:__proto__=x').options)).toBe(Object.prototype);
  });

  test('behavior: traits resolve per type', () => {
    expect(service.resolveModel('default', 'text')).toMatchObject({
      model: { id: 'llama-3.3-70b' },
      requestedAs: 'trait',
    });
    expect(service.resolveModel('default_reasoning', 'text')?.model.id).toBe('qwen3-235b');
    expect(service.resolveModel('default', 'image')?.model.id).toBe('z-image-turbo');
    expect(service.resolveModel('highest_quality', 'image')?.model.id).toBe('gpt-image-2');
    expect(service.resolveModel('default:enable_web_search=on', 'text')).toMatchObject({
      model: { id: 'llama-3.3-70b' },
      suffixOptions: { enable_web_search: 'on' },
    });
  });

  test('behavior: compatibility aliases resolve per type', () => {
    expect(service.resolveModel('gpt-4o', 'text')).toMatchObject({
      model: { id: 'llama-3.3-70b' },
      requestedAs: 'alias',
    });
    expect(service.resolveModel('o3-mini', 'text')?.model.id).toBe('qwen3-235b');
    expect(service.resolveModel('text-embedding-ada-002', 'embedding')?.model.id).toBe(
      'text-embedding-bge-m3',
    );
    expect(service.resolveModel('dall-e-3', 'image')?.model.id).toBe('z-image-turbo');
    expect(service.resolveModel('tts-1', 'tts')?.model.id).toBe('tts-kokoro');
    expect(service.resolveModel('whisper-1', 'asr')?.model.id).toBe('openai/whisper-large-v3');
  });

  test('behavior: without a type, a name resolves only when it is unambiguous', () => {
    expect(service.resolveModel('gpt-4o')?.model.id).toBe('llama-3.3-70b');
    expect(service.resolveModel('z-image-turbo')?.model.id).toBe('z-image-turbo');
    expect(service.resolveModel('default')).toBeUndefined();
  });

  test('behavior: unknown names and models of another type do not resolve', () => {
    expect(service.resolveModel('no-such-model', 'text')).toBeUndefined();
    expect(service.resolveModel('z-image-turbo', 'text')).toBeUndefined();
    expect(service.resolveModel('gpt-4o', 'image')).toBeUndefined();
    expect(service.resolveModel('', 'text')).toBeUndefined();
  });

  test('behavior: a deprecated model resolves until its date, then to its replacement, then not at all', () => {
    const at = (iso: string) => createCatalogService(catalog, { now: () => Date.parse(iso) });
    expect(at('2027-02-28T23:59:59Z').resolveModel('deepseek-r1-671b', 'text')?.model.id).toBe(
      'deepseek-r1-671b',
    );
    const remapped = at('2027-03-01T00:00:00Z').resolveModel(
      'deepseek-r1-671b:strip_thinking_response=true',
      'text',
    );
    expect(remapped?.model.id).toBe('qwen3-235b');
    expect(remapped?.remappedFrom?.id).toBe('deepseek-r1-671b');
    expect(remapped?.suffixOptions).toEqual({ strip_thinking_response: 'true' });
    const removed = at('2027-06-01T00:00:00Z');
    expect(removed.resolveModel('deepseek-r1-671b', 'text')).toBeUndefined();
    expect(removed.listModels('text').data.map((m) => m.id)).not.toContain('deepseek-r1-671b');
    expect(service.listModels('text').data.map((m) => m.id)).toContain('deepseek-r1-671b');
  });

  test('behavior: the listed models, built once, change when a removal date passes on a running clock', () => {
    let clock = Date.parse('2027-05-31T23:59:59.999Z');
    const running = createCatalogService(catalog, { now: () => clock });
    const ids = () => running.listModels('text').data.map((m) => m.id);
    expect(ids()).toContain('deepseek-r1-671b');
    expect(running.listModels('text')).toBe(running.listModels('text'));
    clock = Date.parse('2027-06-01T00:00:00.000Z');
    expect(ids()).not.toContain('deepseek-r1-671b');
    clock = Date.parse('2027-05-01T00:00:00.000Z');
    expect(ids()).toContain('deepseek-r1-671b');
  });
});

describe('deprecationHeaders', () => {
  test('behavior: a deprecated model carries the warning and the date', () => {
    const deepseek = service.getModel('deepseek-r1-671b');
    if (!deepseek) throw new Error('deepseek-r1-671b is missing');
    const headers = service.deprecationHeaders(deepseek);
    expect(headers).toEqual({
      'x-service-model-deprecation-warning':
        'This model is deprecated and will be removed on 2027-03-01. Use qwen3-235b instead.',
      'x-service-model-deprecation-date': '2027-03-01',
    });
    for (const [name, value] of Object.entries(headers)) {
      const component =
        name === 'x-service-model-deprecation-date'
          ? 'XServiceModelDeprecationDate'
          : 'XServiceModelDeprecationWarning';
      const schema = doc.components.headers?.[component]?.schema as Json;
      expect(validator.validate(schema, value)).toEqual([]);
    }
  });

  test('behavior: other models carry none', () => {
    const llama = service.getModel('llama-3.3-70b');
    if (!llama) throw new Error('llama-3.3-70b is missing');
    expect(service.deprecationHeaders(llama)).toEqual({});
  });
});

describe('rateLimits', () => {
  test("behavior: a tier's limits match the spec's example and its schema", () => {
    expect(service.rateLimitTiers()).toEqual(['paid', 'partner']);
    const limits = service.rateLimits('paid');
    const schema = { type: 'array', items: validator.schema('ApiKeyModelRateLimits') };
    expect(validator.validate(schema, limits)).toEqual([]);
    const spec = (example('getApiKeyRateLimits', 'paidTier').data as Json).rateLimits;
    expect(limits).toEqual(expect.arrayContaining(spec as unknown[]));
    expect(service.rateLimits('gold')).toBeUndefined();
  });
});

describe('overrides', () => {
  test('behavior: an entry replaces the whole model; new ids are added', () => {
    const path = overrideFile(`
models:
  llama-3.3-70b:${textEntry('Llama via upstream', '0.65')}
  my-model:${textEntry('My Model', '0.000000001')}
`);
    const overridden = loadCatalog({ overridePath: path });
    const llama = overridden.models.get('llama-3.3-70b');
    expect(llama?.spec.name).toBe('Llama via upstream');
    expect(llama?.pricing?.input?.usd).toBe(650_000_000n);
    expect(llama?.spec.capabilities?.supportsFunctionCalling).toBe(false);
    expect(llama?.backends).toEqual([
      {
        kind: 'openai-compatible',
        name: 'inference.example.net',
        baseUrl: 'https://inference.example.net/v1',
        apiKeyEnv: 'EXAMPLE_KEY',
        upstreamModel: 'llama-3.3-70b',
      },
      { kind: 'local', name: 'local' },
    ]);
    expect(overridden.models.get('my-model')?.pricing?.input?.usd).toBe(1n);
    expect(overridden.sources).toEqual([DEFAULT_CATALOG_PATH, path]);
    const listed = createCatalogService(overridden)
      .listModels('text')
      .data.map((m) => m.id);
    expect(listed).toContain('my-model');
    expect(listed.indexOf('llama-3.3-70b')).toBe(0);
  });

  test('behavior: enabled: false removes a model and a character', () => {
    const overridden = loadCatalog({
      overridePath: overrideFile(`
models:
  deepseek-r1-671b: { enabled: false }
characters:
  midnight-noir: { enabled: false }
`),
    });
    expect(overridden.models.has('deepseek-r1-671b')).toBe(false);
    expect(overridden.characters.has('midnight-noir')).toBe(false);
    const svc = createCatalogService(overridden);
    expect(svc.listModels('text').data.map((m) => m.id)).not.toContain('deepseek-r1-671b');
    expect(svc.resolveModel('deepseek-r1-671b', 'text')).toBeUndefined();
  });

  test('behavior: traits and compatibility merge by name; null removes a name; styles are replaced', () => {
    const overridden = loadCatalog({
      overridePath: overrideFile(`
traits:
  text:
    fastest: mistral-31-24b
    most_uncensored: null
compatibility:
  text:
    gpt-5: qwen3-235b
imageStyles: [Cinematic, Watercolor]
`),
    });
    const svc = createCatalogService(overridden);
    expect(svc.listTraits('text').data).toMatchObject({
      default: 'llama-3.3-70b',
      fastest: 'mistral-31-24b',
    });
    expect(svc.listTraits('text').data).not.toHaveProperty('most_uncensored');
    expect(svc.listTraits('image').data.default).toBe('z-image-turbo');
    expect(svc.listCompatibility('text').data).toMatchObject({
      'gpt-4o': 'llama-3.3-70b',
      'gpt-5': 'qwen3-235b',
    });
    expect(svc.imageStyles().data).toEqual(['Cinematic', 'Watercolor']);
    expect(svc.listModels().data.find((m) => m.id === 'mistral-31-24b')?.model_spec.traits).toEqual([
      'default_vision',
      'fastest',
    ]);
  });

  test('behavior: characters merge by slug', () => {
    const overridden = loadCatalog({
      overridePath: overrideFile(`
characters:
  night-owl:
    id: 430ca206-5d5d-442c-b243-17fda1e13d5c
    name: Night Owl
    description: null
    author: n0w1l
    adult: false
    tags: [sleep]
    modelId: llama-3.3-70b
    systemPrompt: You help people who cannot sleep.
    createdAt: '2026-11-01T00:00:00Z'
    updatedAt: '2026-11-01T00:00:00Z'
    stats: { imports: 0, ratingCount: 0, ratingSum: 0 }
`),
    });
    expect([...overridden.characters.keys()]).toContain('the-archivist');
    const owl = createCatalogService(overridden).getCharacter('night-owl');
    expect(validator.validate(validator.schema('Character'), owl)).toEqual([]);
    expect(owl).toMatchObject({
      featured: false,
      webEnabled: false,
      shareUrl: null,
      stats: { averageRating: 0 },
    });
  });

  test('behavior: sections owned by other parts of the server are passed through in extra', () => {
    const overridden = loadCatalog({
      overridePath: overrideFile(`
rpc:
  networks: { ethereum-mainnet: { url: 'http://127.0.0.1:8545' } }
providers:
  search: { kind: searxng }
`),
    });
    expect(overridden.extra).toEqual({
      rpc: { networks: { 'ethereum-mainnet': { url: 'http://127.0.0.1:8545' } } },
      providers: { search: { kind: 'searxng' } },
    });
    expect(catalog.extra).toEqual({});
  });

  test('behavior: an empty override changes nothing', () => {
    const overridden = loadCatalog({ overridePath: overrideFile('# nothing yet\n') });
    expect([...overridden.models.keys()]).toEqual([...catalog.models.keys()]);
  });
});

describe('invalid catalogues', () => {
  test('behavior: every problem is reported at once, with file, line and YAML path', () => {
    const path = overrideFile(`models:
  llama-3.3-70b:${textEntry('Llama', '0.7').replace("input: '0.7'", 'input: 0.7').replace('maxConcurrency: 2', 'maxConcurrency: 2\n    colour: blue')}
traits:
  image:
    fastest: no-such-model
`);
    const problems = problemsOf(() => loadCatalog({ overridePath: path }));
    expect(problems).toHaveLength(2);
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(
          new RegExp(
            `^${path}:\\d+:\\d+: models\\["llama-3\\.3-70b"\\]\\.model_spec\\.pricing\\.input: write prices as quoted decimal strings`,
          ),
        ),
        expect.stringMatching(
          new RegExp(`^${path}:12:5: models\\["llama-3\\.3-70b"\\]\\.colour: unknown key$`),
        ),
      ]),
    );
  });

  test('behavior: a price finer than a nano-USD is refused', () => {
    const problems = problemsOf(() =>
      loadCatalog({ overridePath: overrideFile(`models:\n  m:${textEntry('M', '0.0000000001')}`) }),
    );
    expect(problems).toEqual([
      expect.stringMatching(/models\.m\.model_spec\.pricing\.input: .*more than 9 decimal places/),
    ]);
  });

  test('behavior: cross-references are checked after merging', () => {
    const path = overrideFile(`
models:
  llama-3.3-70b: { enabled: false }
traits:
  image:
    fastest: no-such-model
    highest_quality: llama-3.3-70b
characters:
  the-archivist: { enabled: false }
`);
    const problems = problemsOf(() => loadCatalog({ overridePath: path }));
    const text = problems.join('\n');
    expect(text).toMatch(
      new RegExp(`traits\\.text\\.default: model 'llama-3\\.3-70b' does not exist \\(disabled by ${path}\\)`),
    );
    expect(text).toMatch(/traits\.image\.fastest: model 'no-such-model' does not exist/);
    expect(text).toMatch(/traits\.image\.highest_quality: .*model 'llama-3\.3-70b' does not exist/);
    expect(text).toMatch(/compatibility\.text\["gpt-4o"\]: model 'llama-3\.3-70b' does not exist/);
  });

  test('behavior: a trait must name a model of its own type, and every type with models needs a default', () => {
    const problems = problemsOf(() =>
      loadCatalog({
        overridePath: overrideFile('traits:\n  image:\n    default: null\n    fastest: llama-3.3-70b\n'),
      }),
    );
    expect(problems.join('\n')).toMatch(
      /traits\.image\.fastest: 'llama-3\.3-70b' is a text model, not image/,
    );
    expect(problems.join('\n')).toMatch(
      /traits\.image\.default: every model type with models needs a default/,
    );
  });

  test('behavior: a character must run on an existing text model', () => {
    const archivist = readFileSync(DEFAULT_CATALOG_PATH, 'utf8');
    const problems = problemsOf(() =>
      buildCatalog([
        { path: 'default.yaml', text: archivist },
        { path: 'override.yaml', text: 'models:\n  qwen3-235b: { enabled: false }\n' },
      ]),
    );
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(
          /^default\.yaml:\d+:\d+: characters\["professor-tempus"\]\.modelId: model 'qwen3-235b' does not exist \(disabled by override\.yaml\)/,
        ),
      ]),
    );
    const wrongType = archivist.replace('modelId: mistral-31-24b', 'modelId: z-image-turbo');
    expect(problemsOf(() => buildCatalog([{ path: 'default.yaml', text: wrongType }]))).toEqual([
      expect.stringMatching(
        /characters\["chef-marguerite"\]\.modelId: 'z-image-turbo' is a image model, not text/,
      ),
    ]);
  });

  test('behavior: disabling what does not exist is refused (a typo, most likely)', () => {
    const problems = problemsOf(() =>
      buildCatalog([
        { path: DEFAULT_CATALOG_PATH, text: readFileSync(DEFAULT_CATALOG_PATH, 'utf8') },
        {
          path: 'override.yaml',
          text: 'characters:\n  the-archivist:\n    enabled: false\n  x: { enabled: false }\n',
        },
      ]),
    );
    expect(problems).toEqual([
      expect.stringMatching(/^override\.yaml:4:3: characters\.x: nothing to disable/),
    ]);
  });

  test('behavior: unknown sections, bad YAML and unreadable files are refused', () => {
    expect(problemsOf(() => loadCatalog({ overridePath: overrideFile('modles: {}\n') }))).toEqual([
      expect.stringMatching(/modles: unknown key \(the sections are models, traits/),
    ]);
    expect(problemsOf(() => loadCatalog({ overridePath: overrideFile('models: {\n') }))[0]).toMatch(
      /override-\d+\.yaml:\d+:\d+: /,
    );
    expect(problemsOf(() => loadCatalog({ overridePath: join(tempDir, 'missing.yaml') }))).toEqual([
      `${join(tempDir, 'missing.yaml')}: cannot be read (ENOENT)`,
    ]);
  });

  test('behavior: an override entry is a whole entry, not a patch', () => {
    const problems = problemsOf(() =>
      loadCatalog({ overridePath: overrideFile('models:\n  llama-3.3-70b:\n    maxConcurrency: 4\n') }),
    );
    expect(problems.join('\n')).toMatch(/models\["llama-3\.3-70b"\]\.type: /);
    expect(problems.join('\n')).toMatch(/models\["llama-3\.3-70b"\]\.model_spec: /);
  });

  test('behavior: type rules are enforced (a text model without capabilities, traits inside model_spec)', () => {
    const entry = textEntry('T', '1')
      .replace(/ {6}capabilities:[\s\S]*$/, '')
      .replace('privacy: anonymized', 'privacy: anonymized\n      traits: [default]');
    const problems = problemsOf(() => loadCatalog({ overridePath: overrideFile(`models:\n  t:${entry}`) }));
    expect(problems.join('\n')).toMatch(
      /models\.t\.model_spec\.traits: traits are assigned in the top-level `traits` section/,
    );
  });

  test('behavior: upstream credentials cannot be written into a URL', () => {
    const entry = textEntry('T', '1').replace(
      'https://inference.example.net/v1',
      'https://user:secret@inference.example.net/v1',
    );
    const problems = problemsOf(() => loadCatalog({ overridePath: overrideFile(`models:\n  t:${entry}`) }));
    expect(problems).toEqual([
      expect.stringMatching(/models\.t\.provider\[0\]\.baseUrl: no credentials in baseUrl/),
    ]);
  });
});

describe('characters', () => {
  const slugs = (items: Character[]) => items.map((c) => c.slug);

  test('behavior: the listing validates against CharacterList and holds the spec examples', () => {
    const { items, total } = service.listCharacters();
    expect(validator.validate(validator.schema('CharacterList'), { object: 'list', data: items })).toEqual(
      [],
    );
    expect(total).toBe(catalog.characters.size);
    const served = new Map(items.map((c) => [c.slug, c]));
    for (const character of example('listCharacters', 'page').data as Character[]) {
      expect(served.get(character.slug)).toEqual({
        ...character,
        stats: { ...character.stats, userRating: null },
      });
    }
  });

  test('behavior: the private system prompt never leaves the listing or the lookup', () => {
    expect(JSON.stringify(service.listCharacters({ limit: 100 }))).not.toContain('systemPrompt');
    expect(service.getCharacter('the-archivist')).not.toHaveProperty('systemPrompt');
    expect(service.getCharacterPersona('the-archivist')?.systemPrompt).toMatch(/^You are The Archivist/);
    expect(service.getCharacterPersona('ada-the-engineer')?.pro).toBe(true);
    expect(service.getCharacterPersona('no-such-character')).toBeUndefined();
  });

  test('behavior: search looks in name, description and tags, case-insensitively', () => {
    expect(slugs(service.listCharacters({ search: 'LIBRARIAN' }).items)).toEqual(['the-archivist']);
    expect(slugs(service.listCharacters({ search: 'cooking' }).items)).toEqual(['chef-marguerite']);
    expect(service.listCharacters({ search: 'zzz-nothing' })).toEqual({ items: [], total: 0 });
  });

  test('behavior: categories, tags and modelId keep characters matching any of the values', () => {
    expect(slugs(service.listCharacters({ tags: ['history'], sortBy: 'imports' }).items)).toEqual([
      'the-archivist',
      'professor-tempus',
    ]);
    expect(
      slugs(service.listCharacters({ categories: ['food', 'fiction'], sortBy: 'imports' }).items),
    ).toEqual(['chef-marguerite', 'midnight-noir']);
    expect(slugs(service.listCharacters({ modelId: ['qwen3-235b'] }).items)).toEqual(['professor-tempus']);
  });

  test('behavior: the flags accept booleans and the query strings', () => {
    expect(slugs(service.listCharacters({ isAdult: 'true' }).items)).toEqual(['midnight-noir']);
    expect(slugs(service.listCharacters({ isAdult: false }).items)).not.toContain('midnight-noir');
    expect(slugs(service.listCharacters({ isPro: 'true' }).items)).toEqual(['ada-the-engineer']);
    expect(slugs(service.listCharacters({ isWebEnabled: 'false', sortBy: 'imports' }).items)).toEqual([
      'chef-marguerite',
      'midnight-noir',
    ]);
  });

  test('behavior: each sort key orders as described, in both directions', () => {
    expect(slugs(service.listCharacters({ sortBy: 'imports' }).items)).toEqual([
      'chef-marguerite',
      'the-archivist',
      'midnight-noir',
      'professor-tempus',
      'ada-the-engineer',
    ]);
    expect(slugs(service.listCharacters({ sortBy: 'imports', sortOrder: 'asc' }).items)[0]).toBe(
      'ada-the-engineer',
    );
    expect(slugs(service.listCharacters({ sortBy: 'mostRecent' }).items)).toEqual([
      'ada-the-engineer',
      'the-archivist',
      'professor-tempus',
      'chef-marguerite',
      'midnight-noir',
    ]);
    expect(slugs(service.listCharacters({ sortBy: 'highestRating' }).items)).toEqual([
      'ada-the-engineer',
      'the-archivist',
      'chef-marguerite',
      'professor-tempus',
      'midnight-noir',
    ]);
    expect(slugs(service.listCharacters({ sortBy: 'ratingCount' }).items)[0]).toBe('chef-marguerite');
    // Recent and well rated first; the oldest, lowest-rated last.
    const recent = slugs(service.listCharacters({ sortBy: 'highlyRatedAndRecent' }).items);
    expect(recent[0]).toBe('ada-the-engineer');
    expect(recent.at(-1)).toBe('midnight-noir');
    expect(
      slugs(service.listCharacters({ sortBy: 'featured' }).items)
        .slice(0, 2)
        .sort(),
    ).toEqual(['chef-marguerite', 'the-archivist']);
    expect(slugs(service.listCharacters().items)).toEqual(
      slugs(service.listCharacters({ sortBy: 'featured', sortOrder: 'desc' }).items),
    );
  });

  test('behavior: highlyRated weighs the mean by the number of ratings; highestRating does not', () => {
    const oneRating = readFileSync(DEFAULT_CATALOG_PATH, 'utf8').replace(
      'stats: { imports: 341, ratingCount: 41, ratingSum: 197 }',
      'stats: { imports: 341, ratingCount: 1, ratingSum: 5 }',
    );
    const svc = createCatalogService(buildCatalog([{ path: 'default.yaml', text: oneRating }]));
    expect(slugs(svc.listCharacters({ sortBy: 'highestRating' }).items)[0]).toBe('ada-the-engineer');
    const weighted = slugs(svc.listCharacters({ sortBy: 'highlyRated' }).items);
    expect(weighted.slice(0, 2)).toEqual(['the-archivist', 'chef-marguerite']);
    expect(weighted.at(-1)).toBe('midnight-noir');
  });

  test('behavior: limit and offset page through the matches; total counts them all', () => {
    const all = slugs(service.listCharacters({ sortBy: 'imports' }).items);
    const page = service.listCharacters({ sortBy: 'imports', limit: 2, offset: 1 });
    expect(slugs(page.items)).toEqual(all.slice(1, 3));
    expect(page.total).toBe(all.length);
    expect(service.listCharacters({ offset: 50 })).toEqual({ items: [], total: all.length });
  });

  test('behavior: a character is found by slug or by id; unknown is undefined', () => {
    const bySlug = service.getCharacter('the-archivist');
    expect(validator.validate(validator.schema('Character'), bySlug)).toEqual([]);
    expect(service.getCharacter('3f6c1b2e-8a4d-4c7e-9b1a-5d2e7f0c4a91')).toEqual(bySlug);
    expect(service.getCharacter('3F6C1B2E-8A4D-4C7E-9B1A-5D2E7F0C4A91')).toEqual(bySlug);
    expect(bySlug).toEqual({ ...(example('getCharacter', 'theArchivist').data as Character) });
    expect(service.getCharacter('nobody')).toBeUndefined();
  });

  test('behavior: link paths are resolved against the public base URL', () => {
    const svc = createCatalogService(catalog, { publicBaseUrl: 'https://chat.example.org/' });
    expect(svc.getCharacter('the-archivist')).toMatchObject({
      shareUrl: 'https://chat.example.org/c/the-archivist',
      photoUrl: 'https://chat.example.org/static/characters/the-archivist.webp',
    });
    expect(svc.getCharacter('professor-tempus')?.photoUrl).toBeNull();
  });
});
