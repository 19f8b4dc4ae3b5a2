/**
 * The catalogue file format: one strict zod schema shared by the file shipped with the server
 * (`default-catalog.yaml`) and the operator's override (`SERVICE_CONFIG`). Unknown keys are errors, prices are
 * quoted decimal strings parsed exactly into nano-USD, and every model entry is checked against the rules of
 * its type, so a mistake is reported with its path instead of surfacing later as a wrong answer or price.
 */
import { z } from 'zod';
import type {
  ModelCapabilities,
  ModelConstraints,
  ModelDeprecation,
  ModelPrice,
  ModelPricing,
  ModelSpec,
  ModelType,
} from '../../generated/api.d.ts';
import { parseUsdToNano } from '../money.ts';

/** Every model type, in the order the catalogue lists them. */
export const MODEL_TYPES = [
  'text',
  'embedding',
  'image',
  'inpaint',
  'upscale',
  'tts',
  'asr',
  'video',
  'music',
  'decision',
] as const satisfies readonly ModelType[];

/**
 * Top-level sections of a catalogue file owned by other parts of the server. They are accepted without
 * inspection and handed back in `Catalog.extra`; any other unknown section is an error (a typo, most likely).
 */
export const EXTRA_SECTIONS = ['rpc', 'providers', 'search', 'x402'] as const;
export type ExtraSection = (typeof EXTRA_SECTIONS)[number];

/** A price in nano-USD and nano-DIEM. */
export interface NanoPrice {
  usd: bigint;
  diem: bigint;
}

/** `ModelPricing` with every `ModelPrice` leaf held exactly, in nano units. */
export type NanoPricing = ToNano<ModelPricing>;
type ToNano<T> = T extends ModelPrice
  ? NanoPrice
  : T extends readonly unknown[]
    ? T
    : T extends object
      ? { [K in keyof T]: ToNano<T[K]> }
      : T;

// ---------------------------------------------------------------------------------------------------------
// Scalars

const MODEL_ID = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$/;
const modelId = z
  .string()
  .regex(MODEL_ID, 'a model id is letters, digits, `.`, `_`, `/` and `-` (no `:`, which starts a suffix)');
const traitName = z
  .string()
  .regex(/^[a-z][a-z0-9_-]{0,63}$/, 'a trait name is lower-case letters, digits, `_`, `-`');
const aliasName = z.string().regex(MODEL_ID, 'an alias has the form of a model id');
const slug = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9-]{0,127}$/, 'a slug is letters, digits and `-`');
const tierName = z
  .string()
  .regex(/^[a-z][a-z0-9_-]{0,31}$/, 'a tier name is lower-case letters, digits, `_`, `-`');
const dateTime = z.iso.datetime({
  offset: true,
  error: 'expected an ISO 8601 date-time such as 2027-03-01T00:00:00.000Z',
});
const positiveInt = z.int().min(1);
const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * Re-raises the issues of a nested parse from inside a transform, relative to the current path. An unknown-key
 * issue becomes one issue per key whose path ends at the key, so every stray key is located on its own.
 */
function reraise(ctx: z.RefinementCtx, issues: readonly z.core.$ZodIssue[]): void {
  for (const issue of issues) {
    if (issue.code === 'unrecognized_keys') {
      for (const key of issue.keys)
        ctx.addIssue({ code: 'custom', path: [...issue.path, key], message: 'unknown key' });
    } else {
      ctx.addIssue({ code: 'custom', path: [...issue.path], message: issue.message });
    }
  }
}

/** A USD amount: a quoted decimal string, parsed into nano-USD without floating point. */
export const usdSchema = z.unknown().transform((value, ctx): bigint => {
  if (typeof value !== 'string') {
    ctx.addIssue({
      code: 'custom',
      message:
        typeof value === 'number'
          ? `write prices as quoted decimal strings (${/^[0-9.]+$/.test(String(value)) ? `'${value}'` : "such as '0.7'"}, not a YAML number) so that no floating point is involved`
          : "expected a quoted decimal USD string such as '0.7'",
    });
    return z.NEVER;
  }
  try {
    return parseUsdToNano(value);
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: (error as Error).message });
    return z.NEVER;
  }
});

const priceObject = z.strictObject({ usd: usdSchema, diem: usdSchema });

/** A price: `'0.7'` (the same in USD and DIEM, as 1 DIEM pays for 1 USD) or `{ usd: '0.7', diem: '0.7' }`. */
export const priceSchema = z.unknown().transform((value, ctx): NanoPrice => {
  if (isObject(value)) {
    const parsed = priceObject.safeParse(value);
    if (parsed.success) return parsed.data;
    reraise(ctx, parsed.error.issues);
    return z.NEVER;
  }
  const parsed = usdSchema.safeParse(value);
  if (parsed.success) return { usd: parsed.data, diem: parsed.data };
  reraise(ctx, parsed.error.issues);
  return z.NEVER;
});

// ---------------------------------------------------------------------------------------------------------
// The public model_spec (the contract's ModelSpec, less what the catalogue derives: traits, pro, pricing)

const qualityPrices = z.strictObject({
  low: priceSchema.optional(),
  medium: priceSchema.optional(),
  high: priceSchema.optional(),
});

export const pricingSchema = z.strictObject({
  input: priceSchema.optional(),
  output: priceSchema.optional(),
  cache_input: priceSchema.optional(),
  cache_write: priceSchema.optional(),
  extended: z
    .strictObject({
      context_token_threshold: positiveInt,
      input: priceSchema,
      output: priceSchema,
      cache_input: priceSchema.optional(),
      cache_write: priceSchema.optional(),
    })
    .optional(),
  web_search: priceSchema.optional(),
  web_scraping: priceSchema.optional(),
  x_search: priceSchema.optional(),
  generation: priceSchema.optional(),
  resolutions: z
    .strictObject({
      '1K': priceSchema.optional(),
      '2K': priceSchema.optional(),
      '4K': priceSchema.optional(),
    })
    .optional(),
  quality: z
    .strictObject({
      '1K': qualityPrices.optional(),
      '2K': qualityPrices.optional(),
      '4K': qualityPrices.optional(),
    })
    .optional(),
  upscale: z.strictObject({ '2x': priceSchema.optional(), '4x': priceSchema.optional() }).optional(),
  per_audio_second: priceSchema.optional(),
  per_second: priceSchema.optional(),
  enhance_prompt: priceSchema.optional(),
});

const constraintDefault = z.strictObject({ default: z.number() });
const quality = z.enum(['low', 'medium', 'high']);
const audioFormat = z.enum(['mp3', 'opus', 'aac', 'flac', 'wav', 'pcm']);
const reasoningEffort = z.enum(['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max']);
const nonEmptyUnique = <T extends z.ZodType<string>>(item: T) =>
  z
    .array(item)
    .min(1)
    .refine((list) => new Set(list).size === list.length, 'values must be unique');

export const constraintsSchema = z.strictObject({
  temperature: constraintDefault.optional(),
  top_p: constraintDefault.optional(),
  frequency_penalty: constraintDefault.optional(),
  presence_penalty: constraintDefault.optional(),
  repetition_penalty: constraintDefault.optional(),
  promptCharacterLimit: positiveInt.optional(),
  steps: z.strictObject({ default: positiveInt, max: positiveInt }).optional(),
  widthHeightDivisor: positiveInt.optional(),
  sizing: z.enum(['pixels', 'aspect_ratio', 'resolution']).optional(),
  aspectRatios: nonEmptyUnique(z.string().min(1)).optional(),
  defaultAspectRatio: z.string().min(1).optional(),
  resolutions: nonEmptyUnique(z.string().min(1)).optional(),
  defaultResolution: z.string().min(1).optional(),
  qualities: nonEmptyUnique(quality).optional(),
  defaultQuality: quality.optional(),
  maxStyleReferences: positiveInt.optional(),
  model_type: z.enum(['image-to-video', 'text-to-video', 'video']).optional(),
  aspect_ratios: z.array(z.string().min(1)).optional(),
  durations: nonEmptyUnique(z.string().min(1)).optional(),
  audio: z.boolean().optional(),
  audio_configurable: z.boolean().optional(),
  prompt_character_limit: positiveInt.optional(),
  maxStateTokens: positiveInt.optional(),
  maxTotalTokens: positiveInt.optional(),
});

export const capabilitiesSchema = z.strictObject({
  optimizedForCode: z.boolean(),
  quantization: z.enum(['fp4', 'fp8', 'fp16', 'bf16', 'int8', 'int4', 'not-available']),
  supportsFunctionCalling: z.boolean(),
  supportsAudioInput: z.boolean(),
  supportsReasoning: z.boolean(),
  supportsReasoningEffort: z.boolean(),
  reasoningEffortOptions: nonEmptyUnique(reasoningEffort).optional(),
  defaultReasoningEffort: reasoningEffort.optional(),
  supportsResponseSchema: z.boolean(),
  supportsMultipleImages: z.boolean(),
  maxImages: positiveInt.optional(),
  supportsVision: z.boolean(),
  supportsVideoInput: z.boolean(),
  supportsWebSearch: z.boolean(),
  supportsLogProbs: z.boolean(),
  supportsTeeAttestation: z.boolean(),
  supportsE2EE: z.boolean(),
  supportsXSearch: z.boolean(),
  thinkingTagFormat: z.boolean().optional(),
});

export const deprecationSchema = z.strictObject({
  date: dateTime,
  replacementModelId: modelId.optional(),
  autoRemap: z.boolean(),
  removesAt: dateTime.optional(),
});

const derived = (what: string) => z.never({ error: what }).optional();

export const modelSpecSchema = z.strictObject({
  name: z.string().min(1),
  description: z.string().min(1).optional(),
  modelSource: z.string().min(1).optional(),
  privacy: z.enum(['private', 'anonymized']),
  offline: z.boolean().default(false),
  traits: derived(
    'traits are assigned in the top-level `traits` section, which is the one place that says who holds a trait',
  ),
  pro: derived('set `pro` on the model entry (next to `provider`), not inside model_spec'),
  uncensored: z.literal(true).optional(),
  beta: z.boolean().optional(),
  betaModel: z.boolean().optional(),
  regionRestrictions: z.array(z.string().regex(/^[A-Z]{2}$/, 'an ISO 3166-1 alpha-2 code')).optional(),
  deprecation: deprecationSchema.optional(),
  pricing: pricingSchema.optional(),
  constraints: constraintsSchema.optional(),
  capabilities: capabilitiesSchema.optional(),
  availableContextTokens: positiveInt.optional(),
  maxCompletionTokens: positiveInt.optional(),
  embeddingDimensions: positiveInt.optional(),
  maxInputTokens: positiveInt.optional(),
  supportsCustomDimensions: z.literal(true).optional(),
  voices: nonEmptyUnique(z.string().min(1)).optional(),
  supportsStyleReferences: z.boolean().optional(),
  supportsWebSearch: z.boolean().optional(),
  supportsOptimizePromptThinking: z.boolean().optional(),
  defaultFormat: audioFormat.optional(),
  supportedFormats: nonEmptyUnique(audioFormat).optional(),
});

// ---------------------------------------------------------------------------------------------------------
// Internal fields of a model entry (never sent to clients)

const localBackend = z.strictObject({ kind: z.literal('local') });
const upstreamBackend = z.strictObject({
  kind: z.literal('openai-compatible'),
  /** Stable name of the backend (router header, cache stickiness); the host of `baseUrl` by default. */
  name: z
    .string()
    .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)
    .optional(),
  baseUrl: z.url({ protocol: /^https?$/, error: 'expected an http(s) URL' }).refine((url) => {
    const parsed = new URL(url);
    return parsed.username === '' && parsed.password === '';
  }, 'no credentials in baseUrl: name the environment variable that holds the key in apiKeyEnv'),
  /** Name of the environment variable holding the upstream's API key (the config layer reads it). */
  apiKeyEnv: z
    .string()
    .regex(/^[A-Z_][A-Z0-9_]*$/, 'an environment variable name')
    .optional(),
  /** The model name to send upstream; the catalogue id by default. */
  upstreamModel: z.string().min(1).optional(),
  timeoutMs: z.int().min(1).max(3_600_000).optional(),
});
const backendSchema = z.discriminatedUnion('kind', [localBackend, upstreamBackend], {
  error: 'a backend is { kind: local } or { kind: openai-compatible, baseUrl, apiKeyEnv? }',
});

/**
 * `{ kind: local }`, one upstream, or a list of backends. An empty list means no backend is configured: the
 * model is listed but its requests answer 503 until an override routes it.
 */
export const providerSchema = z.unknown().transform((value, ctx) => {
  const parsed = (Array.isArray(value) ? z.array(backendSchema) : backendSchema).safeParse(value);
  if (parsed.success) return parsed.data;
  reraise(ctx, parsed.error.issues);
  return z.NEVER;
});

export const rateLimitSchema = z.strictObject({
  requestsPerMinute: positiveInt,
  requestsPerDay: positiveInt.optional(),
  tokensPerMinute: positiveInt.optional(),
});

export const videoInternalSchema = z.strictObject({
  /** Price per second of output at each resolution of `constraints.resolutions` (what `/video/quote` uses). */
  pricePerSecond: z.record(z.string().min(1), usdSchema),
  /** Added per second when the job produces a soundtrack. */
  audioPricePerSecond: usdSchema.optional(),
  /** Consent flow required before animating real faces (`409 NEEDS_CONSENT`), if any. */
  consentFlow: z
    .string()
    .regex(/^[a-z][a-z0-9_]{0,63}$/)
    .optional(),
  /** The finished video is delivered through a pre-signed `download_url`. */
  downloadUrl: z.boolean().default(false),
});

// ---------------------------------------------------------------------------------------------------------
// Model entries

export const modelEntrySchema = z
  .strictObject({
    enabled: z.literal(true).optional(),
    type: z.enum(MODEL_TYPES),
    created: z.int().min(0),
    ownedBy: z.string().min(1).default('service'),
    pro: z.boolean().default(false),
    provider: providerSchema,
    rateLimits: z
      .record(tierName, rateLimitSchema)
      .refine((tiers) => Object.keys(tiers).length > 0, 'at least one rate-limit tier'),
    maxConcurrency: positiveInt,
    canDisableThinking: z.boolean().optional(),
    sampleRateHz: z.int().min(8000).max(192_000).optional(),
    video: videoInternalSchema.optional(),
    model_spec: modelSpecSchema,
  })
  .superRefine((entry, ctx) => {
    for (const [path, message] of modelEntryProblems(entry)) ctx.addIssue({ code: 'custom', path, message });
  });

export type ModelEntry = z.output<typeof modelEntrySchema>;

type Problem = [path: (string | number)[], message: string];

/** The rules that depend on the model type: what each type must have, and what only other types may have. */
function modelEntryProblems(entry: z.output<typeof modelEntrySchema>): Problem[] {
  const problems: Problem[] = [];
  const spec = entry.model_spec;
  const pricing = spec.pricing ?? {};
  const constraints = spec.constraints ?? {};
  const type = entry.type;
  const need = (ok: unknown, path: (string | number)[], message: string) => {
    if (!ok) problems.push([path, message]);
  };
  const onlyFor = (types: ModelType[], present: unknown, path: (string | number)[]) =>
    need(present === undefined || types.includes(type), path, `only ${types.join(' and ')} models have this`);

  onlyFor(['text'], spec.capabilities, ['model_spec', 'capabilities']);
  onlyFor(['text'], spec.availableContextTokens, ['model_spec', 'availableContextTokens']);
  onlyFor(['text'], spec.maxCompletionTokens, ['model_spec', 'maxCompletionTokens']);
  onlyFor(['text'], entry.canDisableThinking, ['canDisableThinking']);
  onlyFor(['embedding'], spec.embeddingDimensions, ['model_spec', 'embeddingDimensions']);
  onlyFor(['embedding'], spec.maxInputTokens, ['model_spec', 'maxInputTokens']);
  onlyFor(['embedding'], spec.supportsCustomDimensions, ['model_spec', 'supportsCustomDimensions']);
  onlyFor(['tts'], spec.voices, ['model_spec', 'voices']);
  onlyFor(['tts'], spec.defaultFormat, ['model_spec', 'defaultFormat']);
  onlyFor(['tts'], spec.supportedFormats, ['model_spec', 'supportedFormats']);
  onlyFor(['tts'], entry.sampleRateHz, ['sampleRateHz']);
  onlyFor(['image'], spec.supportsStyleReferences, ['model_spec', 'supportsStyleReferences']);
  onlyFor(['image'], spec.supportsWebSearch, ['model_spec', 'supportsWebSearch']);
  onlyFor(['image', 'inpaint'], spec.supportsOptimizePromptThinking, [
    'model_spec',
    'supportsOptimizePromptThinking',
  ]);
  onlyFor(['image'], pricing.enhance_prompt, ['model_spec', 'pricing', 'enhance_prompt']);
  onlyFor(['video'], entry.video, ['video']);
  onlyFor(['video'], constraints.model_type, ['model_spec', 'constraints', 'model_type']);

  const hasPrice = (...keys: (keyof NanoPricing)[]) =>
    need(
      keys.some((key) => pricing[key] !== undefined),
      ['model_spec', 'pricing'],
      `${type} models are priced with ${keys.join(' or ')}`,
    );

  switch (type) {
    case 'text': {
      const caps = spec.capabilities;
      need(caps, ['model_spec', 'capabilities'], 'text models declare their capabilities');
      need(
        spec.availableContextTokens,
        ['model_spec', 'availableContextTokens'],
        'text models declare their context',
      );
      need(
        spec.maxCompletionTokens,
        ['model_spec', 'maxCompletionTokens'],
        'text models declare maxCompletionTokens',
      );
      need(
        !spec.availableContextTokens ||
          !spec.maxCompletionTokens ||
          spec.maxCompletionTokens <= spec.availableContextTokens,
        ['model_spec', 'maxCompletionTokens'],
        'maxCompletionTokens cannot exceed availableContextTokens',
      );
      need(
        constraints.temperature && constraints.top_p,
        ['model_spec', 'constraints'],
        'text models give temperature and top_p defaults',
      );
      hasPrice('input');
      hasPrice('output');
      if (caps) {
        const at = ['model_spec', 'capabilities'];
        if (caps.supportsReasoningEffort) {
          need(
            caps.reasoningEffortOptions,
            [...at, 'reasoningEffortOptions'],
            'list the accepted reasoning efforts',
          );
          need(
            caps.defaultReasoningEffort && caps.reasoningEffortOptions?.includes(caps.defaultReasoningEffort),
            [...at, 'defaultReasoningEffort'],
            'the default reasoning effort must be one of reasoningEffortOptions',
          );
        } else {
          need(
            !caps.reasoningEffortOptions && !caps.defaultReasoningEffort,
            at,
            'reasoning efforts need supportsReasoningEffort',
          );
        }
        need(
          !caps.thinkingTagFormat || caps.supportsReasoning,
          [...at, 'thinkingTagFormat'],
          'only reasoning models think in tags',
        );
        need(
          !entry.canDisableThinking || caps.supportsReasoning,
          ['canDisableThinking'],
          'only reasoning models think',
        );
        need(!caps.maxImages || caps.supportsVision, [...at, 'maxImages'], 'maxImages needs supportsVision');
        need(
          !caps.supportsMultipleImages || caps.maxImages,
          [...at, 'maxImages'],
          'supportsMultipleImages needs maxImages',
        );
        need(
          !caps.supportsWebSearch || pricing.web_search,
          ['model_spec', 'pricing', 'web_search'],
          'web search needs a web_search price',
        );
      }
      break;
    }
    case 'embedding':
      need(
        spec.embeddingDimensions,
        ['model_spec', 'embeddingDimensions'],
        'embedding models declare their dimensions',
      );
      need(spec.maxInputTokens, ['model_spec', 'maxInputTokens'], 'embedding models declare maxInputTokens');
      hasPrice('input');
      break;
    case 'decision':
      need(
        constraints.maxStateTokens && constraints.maxTotalTokens,
        ['model_spec', 'constraints'],
        'decision models give maxStateTokens and maxTotalTokens',
      );
      hasPrice('input');
      break;
    case 'tts':
      need(spec.voices, ['model_spec', 'voices'], 'tts models list their voices');
      need(spec.supportedFormats, ['model_spec', 'supportedFormats'], 'tts models list their formats');
      need(
        spec.defaultFormat && spec.supportedFormats?.includes(spec.defaultFormat),
        ['model_spec', 'defaultFormat'],
        'the default format must be one of supportedFormats',
      );
      need(entry.sampleRateHz, ['sampleRateHz'], 'tts models give the sample rate of their raw PCM output');
      hasPrice('input');
      break;
    case 'asr':
      hasPrice('per_audio_second');
      break;
    case 'image':
      problems.push(...imageProblems(spec));
      hasPrice('generation', 'resolutions');
      need(
        !spec.supportsWebSearch || pricing.web_search,
        ['model_spec', 'pricing', 'web_search'],
        'web search needs a web_search price',
      );
      break;
    case 'inpaint':
      need(
        constraints.promptCharacterLimit,
        ['model_spec', 'constraints', 'promptCharacterLimit'],
        'inpaint models give promptCharacterLimit',
      );
      hasPrice('generation');
      break;
    case 'upscale':
      hasPrice('upscale');
      break;
    case 'music':
      hasPrice('generation', 'per_second');
      break;
    case 'video':
      problems.push(...videoProblems(entry));
      break;
  }
  const deprecation = spec.deprecation;
  if (deprecation?.removesAt) {
    need(
      Date.parse(deprecation.removesAt) >= Date.parse(deprecation.date),
      ['model_spec', 'deprecation', 'removesAt'],
      'removesAt cannot be before date',
    );
  }
  need(
    !deprecation?.autoRemap || deprecation.replacementModelId,
    ['model_spec', 'deprecation', 'replacementModelId'],
    'autoRemap needs a replacementModelId',
  );
  return problems;
}

function imageProblems(spec: ModelEntry['model_spec']): Problem[] {
  const problems: Problem[] = [];
  const c = spec.constraints ?? {};
  const at = ['model_spec', 'constraints'];
  const need = (ok: unknown, path: (string | number)[], message: string) => {
    if (!ok) problems.push([path, message]);
  };
  need(c.sizing, [...at, 'sizing'], 'image models say how their size is requested');
  need(c.promptCharacterLimit, [...at, 'promptCharacterLimit'], 'image models give promptCharacterLimit');
  if (c.sizing === 'pixels')
    need(c.widthHeightDivisor, [...at, 'widthHeightDivisor'], 'pixel-sized models give widthHeightDivisor');
  if (c.sizing === 'aspect_ratio' || c.sizing === 'resolution') {
    need(c.aspectRatios, [...at, 'aspectRatios'], `${c.sizing} models list their aspect ratios`);
    need(
      c.defaultAspectRatio && c.aspectRatios?.includes(c.defaultAspectRatio),
      [...at, 'defaultAspectRatio'],
      'the default aspect ratio must be one of aspectRatios',
    );
  }
  if (c.sizing === 'resolution') {
    need(c.resolutions, [...at, 'resolutions'], 'resolution models list their tiers');
    need(
      c.defaultResolution && c.resolutions?.includes(c.defaultResolution),
      [...at, 'defaultResolution'],
      'the default resolution must be one of resolutions',
    );
    for (const tier of c.resolutions ?? []) {
      const prices = spec.pricing?.resolutions as Record<string, NanoPrice | undefined> | undefined;
      need(prices?.[tier], ['model_spec', 'pricing', 'resolutions', tier], `no price for resolution ${tier}`);
    }
  }
  if (c.steps)
    need(c.steps.default <= c.steps.max, [...at, 'steps', 'default'], 'the default steps cannot exceed max');
  if (c.qualities) {
    need(
      c.defaultQuality && c.qualities.includes(c.defaultQuality),
      [...at, 'defaultQuality'],
      'the default quality must be one of qualities',
    );
    const matrix = spec.pricing?.quality as Record<string, Record<string, NanoPrice> | undefined> | undefined;
    for (const tier of c.resolutions ?? []) {
      for (const level of c.qualities) {
        need(
          matrix?.[tier]?.[level],
          ['model_spec', 'pricing', 'quality', tier, level],
          `no price for ${tier} at ${level} quality`,
        );
      }
    }
  } else {
    need(!c.defaultQuality, [...at, 'defaultQuality'], 'defaultQuality needs qualities');
  }
  need(
    !spec.supportsStyleReferences || c.maxStyleReferences,
    [...at, 'maxStyleReferences'],
    'style references need maxStyleReferences',
  );
  return problems;
}

function videoProblems(entry: ModelEntry): Problem[] {
  const problems: Problem[] = [];
  const c = entry.model_spec.constraints ?? {};
  const at = ['model_spec', 'constraints'];
  for (const key of [
    'model_type',
    'aspect_ratios',
    'resolutions',
    'durations',
    'audio',
    'audio_configurable',
  ] as const) {
    if (c[key] === undefined) problems.push([[...at, key], `video models give ${key}`]);
  }
  if (!entry.video) {
    problems.push([['video'], 'video models give their internal per-second prices (video.pricePerSecond)']);
    return problems;
  }
  for (const resolution of c.resolutions ?? []) {
    if (entry.video.pricePerSecond[resolution] === undefined) {
      problems.push([['video', 'pricePerSecond', resolution], `no price for resolution ${resolution}`]);
    }
  }
  for (const resolution of Object.keys(entry.video.pricePerSecond)) {
    if (!c.resolutions?.includes(resolution)) {
      problems.push([
        ['video', 'pricePerSecond', resolution],
        `${resolution} is not one of constraints.resolutions`,
      ]);
    }
  }
  if (c.audio && entry.video.audioPricePerSecond === undefined) {
    problems.push([['video', 'audioPricePerSecond'], 'a model that can produce audio prices it']);
  }
  return problems;
}

// ---------------------------------------------------------------------------------------------------------
// Characters

/** An absolute http(s) URL, or a path from the server's public base URL. */
const link = z
  .string()
  .regex(/^(https?:\/\/[^\s]+|\/[^\s]*)$/, 'expected an http(s) URL or a path starting with /');

export const characterEntrySchema = z
  .strictObject({
    enabled: z.literal(true).optional(),
    id: z.uuid(),
    name: z.string().min(1),
    description: z.string().min(1).nullable(),
    author: z.string().regex(/^[a-z0-9]{3,32}$/, 'an anonymised handle: lower-case letters and digits'),
    adult: z.boolean(),
    featured: z.boolean().default(false),
    webEnabled: z.boolean().default(false),
    /** Only Pro accounts may chat with this persona (also true when its model is Pro-only). */
    pro: z.boolean().default(false),
    categories: z.array(z.string().min(1).max(64)).default([]),
    tags: z.array(z.string().min(1).max(64)).default([]),
    modelId,
    /** An absolute URL, or a path (`/c/the-archivist`) resolved against the server's public base URL. */
    shareUrl: link.nullable().default(null),
    photoUrl: link.nullable().default(null),
    /** The persona's instructions: private, added to the system prompt in chat, never returned. */
    systemPrompt: z.string().min(1),
    createdAt: dateTime,
    updatedAt: dateTime,
    stats: z
      .strictObject({ imports: z.int().min(0), ratingCount: z.int().min(0), ratingSum: z.int().min(0) })
      .refine(
        (s) => s.ratingSum >= s.ratingCount && s.ratingSum <= 5 * s.ratingCount,
        'each rating is 1 to 5 stars, so ratingSum lies between ratingCount and 5 × ratingCount',
      ),
  })
  .superRefine((entry, ctx) => {
    if (Date.parse(entry.updatedAt) < Date.parse(entry.createdAt)) {
      ctx.addIssue({ code: 'custom', path: ['updatedAt'], message: 'updatedAt cannot be before createdAt' });
    }
  });

export type CharacterEntry = z.output<typeof characterEntrySchema>;

// ---------------------------------------------------------------------------------------------------------
// The file

/** `{ enabled: false }` removes an entry of the catalogue being overridden; anything else is a whole entry. */
export type Slot<T> = { enabled: false } | T;

function slot<T extends z.ZodType>(entry: T) {
  const disabled = z.strictObject({ enabled: z.literal(false) });
  return z.unknown().transform((value, ctx): Slot<z.output<T>> => {
    const schema = isObject(value) && value.enabled === false ? disabled : entry;
    const parsed = schema.safeParse(value);
    if (parsed.success) return parsed.data as Slot<z.output<T>>;
    reraise(ctx, parsed.error.issues);
    return z.NEVER;
  });
}

/** Trait or alias name -> model id; `null` (in an override) removes the key. */
const nameMap = (key: z.ZodType<string>) => z.record(key, modelId.nullable());

export const catalogFileSchema = z.strictObject({
  models: z.record(modelId, slot(modelEntrySchema)).optional(),
  traits: z.partialRecord(z.enum(MODEL_TYPES), nameMap(traitName)).optional(),
  compatibility: z.partialRecord(z.enum(MODEL_TYPES), nameMap(aliasName)).optional(),
  imageStyles: nonEmptyUnique(z.string().min(1)).optional(),
  characters: z.record(slug, slot(characterEntrySchema)).optional(),
  // Owned by other parts of the server (see EXTRA_SECTIONS): accepted as they are.
  rpc: z.unknown().optional(),
  providers: z.unknown().optional(),
  search: z.unknown().optional(),
  x402: z.unknown().optional(),
});

export type CatalogFile = z.output<typeof catalogFileSchema>;

// ---------------------------------------------------------------------------------------------------------
// Compile-time agreement with the contract: the file's public parts have the contract's shapes.

type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
// The file may be narrower than the contract (`uncensored` and `supportsCustomDimensions` can only be true).
type Fits<A, B> = [A] extends [B] ? true : false;
type PublicSpec = Omit<
  ModelSpec,
  'traits' | 'pro' | 'pricing' | 'deprecation' | 'constraints' | 'capabilities'
>;
type FileSpec = Omit<
  z.output<typeof modelSpecSchema>,
  'traits' | 'pro' | 'pricing' | 'deprecation' | 'constraints' | 'capabilities'
>;
export const schemaAgreesWithContract: [
  Fits<FileSpec, PublicSpec>,
  Same<z.output<typeof pricingSchema>, NanoPricing>,
  Same<z.output<typeof constraintsSchema>, ModelConstraints>,
  Same<z.output<typeof capabilitiesSchema>, ModelCapabilities>,
  Same<z.output<typeof deprecationSchema>, ModelDeprecation>,
  Same<z.output<typeof modelEntrySchema>['type'], ModelType>,
] = [true, true, true, true, true, true];
