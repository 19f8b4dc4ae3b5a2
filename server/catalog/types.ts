/**
 * The loaded catalogue as the rest of the server sees it: public data in the contract's shapes (prices held
 * exactly in nano-USD) next to the internal fields that route, limit and gate requests and never reach a client.
 */
import type { ModelSpec, ModelType } from '../../generated/api.d.ts';
import type { ExtraSection, NanoPricing } from './schema.ts';

export type { NanoPrice, NanoPricing } from './schema.ts';

/** The embedded engine inside this process. */
export interface LocalBackend {
  kind: 'local';
  name: 'local';
}

/** An OpenAI-compatible HTTP upstream. */
export interface UpstreamBackend {
  kind: 'openai-compatible';
  /** Stable name (router header, `prompt_cache_key` stickiness): the file's `name`, else the URL's host. */
  name: string;
  baseUrl: string;
  /** Environment variable that holds the upstream key; the config layer reads it, never the catalogue. */
  apiKeyEnv?: string;
  /** The model name sent upstream (the catalogue id unless the file names another). */
  upstreamModel: string;
  timeoutMs?: number;
}

export type Backend = LocalBackend | UpstreamBackend;

/** The limits of one rate-limit tier on one model; an absent member is not limited. */
export interface RateLimits {
  requestsPerMinute: number;
  requestsPerDay?: number;
  tokensPerMinute?: number;
}

/** `model_spec` as the file holds it: the public spec less what the catalogue derives (traits, pro, prices). */
export type CatalogModelSpec = Omit<ModelSpec, 'traits' | 'pro' | 'pricing'>;

/** One model: public spec, exact prices and the internal fields. */
export interface CatalogModel {
  readonly id: string;
  readonly type: ModelType;
  /** Unix seconds. */
  readonly created: number;
  readonly ownedBy: string;
  readonly spec: CatalogModelSpec;
  /** Prices in nano-USD / nano-DIEM; absent for models priced by quote (video). */
  readonly pricing?: NanoPricing;
  /**
   * Where requests go, in order of preference; never empty unless no backend is configured (requests then
   * answer 503). The local engine is the default for every model it can serve.
   */
  readonly backends: readonly Backend[];
  /** Limits per rate-limit tier (every model declares the same tiers). */
  readonly rateLimits: Readonly<Record<string, RateLimits>>;
  /** The most requests for this model one server process runs at once; more answer 503. */
  readonly maxConcurrency: number;
  /** Only Pro accounts may use it (401 `This model is only available to Pro users` otherwise). */
  readonly pro: boolean;
  /** Listed only to beta accounts (`model_spec.beta`). */
  readonly beta: boolean;
  /** Text: the model reasons before answering (`capabilities.supportsReasoning`). */
  readonly reasoning: boolean;
  /** Text: the reasoning is written in `<think>…</think>` at the start of content, the older format. */
  readonly thinkingTags: boolean;
  /** Text: `disable_thinking` can turn the reasoning off (reasoning models only). */
  readonly canDisableThinking: boolean;
  /** TTS: sample rate of the raw `pcm` output. */
  readonly sampleRateHz?: number;
  /** Video: what `/video/quote` charges, and how the job is delivered. */
  readonly video?: CatalogVideo;
}

export interface CatalogVideo {
  /** Nano-USD per second of output, by resolution. */
  readonly pricePerSecond: Readonly<Record<string, bigint>>;
  /** Nano-USD added per second when a soundtrack is produced. */
  readonly audioPricePerSecond: bigint;
  readonly consentFlow?: string;
  readonly downloadUrl: boolean;
}

/** A character persona with its private fields. */
export interface CatalogCharacter {
  readonly id: string;
  readonly slug: string;
  readonly name: string;
  readonly description: string | null;
  readonly author: string;
  readonly adult: boolean;
  readonly featured: boolean;
  readonly webEnabled: boolean;
  /** Needs a Pro account (set on the character, or implied by a Pro-only model). */
  readonly pro: boolean;
  readonly categories: readonly string[];
  readonly tags: readonly string[];
  readonly modelId: string;
  /** Absolute URL, or a path resolved against the public base URL. */
  readonly shareUrl: string | null;
  readonly photoUrl: string | null;
  /** Private: the persona's instructions for the chat system prompt. */
  readonly systemPrompt: string;
  readonly createdAt: string;
  readonly updatedAt: string;
  readonly stats: { readonly imports: number; readonly ratingCount: number; readonly ratingSum: number };
}

/** Name -> model id, per model type. */
export type NameMap = Readonly<Partial<Record<ModelType, Readonly<Record<string, string>>>>>;

/** The whole catalogue, after the override was applied and every cross-reference checked. */
export interface Catalog {
  /** By id, in catalogue order. */
  readonly models: ReadonlyMap<string, CatalogModel>;
  /** Trait -> model id, per type; `default` exists for every type that has models. */
  readonly traits: NameMap;
  /** OpenAI model name -> model id, per type. */
  readonly compatibility: NameMap;
  readonly imageStyles: readonly string[];
  /** By slug. */
  readonly characters: ReadonlyMap<string, CatalogCharacter>;
  /** Sections of the files owned by other parts of the server (`rpc`, `providers`, …), uninspected. */
  readonly extra: Readonly<Partial<Record<ExtraSection, unknown>>>;
  /** The files the catalogue was read from, in the order applied. */
  readonly sources: readonly string[];
}
