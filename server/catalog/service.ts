/**
 * The catalogue service: everything the handlers need from the catalogue, in the contract's shapes. It lists
 * models, traits, compatibility names, image styles and characters, and resolves what a client sends as
 * `model` (an id, a trait or an OpenAI name, with an optional option suffix) to a catalogue model. It is pure
 * over the loaded catalogue and a clock; internal fields never leave it except through `CatalogModel`.
 */
import type {
  ApiKeyModelRateLimits,
  Character,
  ImageStyleList,
  Model,
  ModelCompatibilityMapping,
  ModelList,
  ModelPricing,
  ModelSpec,
  ModelTraitList,
  ModelType,
  ModelTypeFilter,
  operations,
} from '../../generated/api.d.ts';
import { nanoToUsdNumber } from '../money.ts';
import { MODEL_TYPES } from './schema.ts';
import type { Catalog, CatalogCharacter, CatalogModel, NanoPricing } from './types.ts';

export interface CatalogServiceOptions {
  /** Clock in Unix milliseconds: deprecation dates and the recency of characters are judged against it. */
  now?: () => number;
  /**
   * Base of the links that the catalogue gives as paths (character `shareUrl`, `photoUrl`); the server's
   * public URL. Default `http://127.0.0.1:3000`.
   */
  publicBaseUrl?: string;
}

export type ModelRequestedAs = 'id' | 'trait' | 'alias';

export interface ResolveModelResult {
  /** The model that serves the request. */
  model: CatalogModel;
  /** How `model` was named: by its id, a trait (`default`, `fastest`…) or a compatibility alias (`gpt-4o`). */
  requestedAs: ModelRequestedAs;
  /** What was sent, without the option suffix. */
  requestedName: string;
  /** The options of the suffix `<id>:<option>=<value>&…`, unvalidated (the operation knows its options). */
  suffixOptions: Record<string, string>;
  /** The retired model that was named, when its deprecation remapped the request to `model`. */
  remappedFrom?: CatalogModel;
}

export type DeprecationHeaders =
  | { 'x-service-model-deprecation-warning': string; 'x-service-model-deprecation-date': string }
  | Record<string, never>;

type CharacterQuery = NonNullable<operations['listCharacters']['parameters']['query']>;
type Flag = boolean | 'true' | 'false';
export type CharacterSortBy = NonNullable<CharacterQuery['sortBy']>;

/** The filters of `GET /characters`; the string flags of the query are accepted as they come. */
export interface ListCharactersInput {
  search?: string;
  categories?: readonly string[];
  tags?: readonly string[];
  modelId?: readonly string[];
  isAdult?: Flag;
  isPro?: Flag;
  isWebEnabled?: Flag;
  sortBy?: CharacterSortBy;
  sortOrder?: 'asc' | 'desc';
  limit?: number;
  offset?: number;
}

export interface ListCharactersResult {
  /** The page. */
  items: Character[];
  /** How many characters match the filters, over all pages. */
  total: number;
}

/** A character with what chat needs and clients never see. */
export interface CharacterPersona extends Character {
  /** The persona's private instructions, added to the system prompt. */
  systemPrompt: string;
  /** Only Pro accounts may chat with it. */
  pro: boolean;
}

export type CatalogService = ReturnType<typeof createCatalogService>;

const DEFAULT_PUBLIC_BASE_URL = 'http://127.0.0.1:3000';

export function createCatalogService(catalog: Catalog, options: CatalogServiceOptions = {}) {
  const now = options.now ?? Date.now;
  const baseUrl = (options.publicBaseUrl ?? DEFAULT_PUBLIC_BASE_URL).replace(/\/+$/, '');
  const publicModels = new Map([...catalog.models.values()].map((m) => [m.id, toPublicModel(m, catalog)]));
  const removals = [...catalog.models.values()]
    .map((m) => (m.spec.deprecation?.removesAt ? Date.parse(m.spec.deprecation.removesAt) : Number.NaN))
    .filter((t) => Number.isFinite(t))
    .sort((a, b) => a - b);
  /** The first removal after `at` (when the lists built at `at` go stale), or Infinity. */
  const nextRemoval = (at: number) => removals.find((t) => t > at) ?? Number.POSITIVE_INFINITY;
  const lists = new Map<string, Readonly<ModelList>>();
  let listsBuiltAt = Number.NEGATIVE_INFINITY;
  let listsValidUntil = Number.NEGATIVE_INFINITY;
  const charactersById = new Map([...catalog.characters.values()].map((c) => [c.id.toLowerCase(), c]));
  const ratingPrior = meanRating([...catalog.characters.values()]);
  const [firstModel] = catalog.models.values();
  const tiers = firstModel ? Object.keys(firstModel.rateLimits) : [];

  /** Past `removesAt` a model is gone: not listed, not resolvable. */
  const isRemoved = (model: CatalogModel) => {
    const removesAt = model.spec.deprecation?.removesAt;
    return removesAt !== undefined && now() >= Date.parse(removesAt);
  };

  const publicCharacter = (character: CatalogCharacter): Character => ({
    id: character.id,
    slug: character.slug,
    name: character.name,
    description: character.description,
    author: character.author,
    adult: character.adult,
    featured: character.featured,
    webEnabled: character.webEnabled,
    shareUrl: absolute(baseUrl, character.shareUrl),
    photoUrl: absolute(baseUrl, character.photoUrl),
    modelId: character.modelId,
    tags: [...character.tags],
    createdAt: character.createdAt,
    updatedAt: character.updatedAt,
    stats: {
      averageRating: averageRating(character),
      imports: character.stats.imports,
      ratingCount: character.stats.ratingCount,
      ratingSum: character.stats.ratingSum,
      // The catalogue holds no per-account ratings.
      userRating: null,
    },
  });

  return {
    /** `GET /models`: the selected models (text by default); beta models only for beta accounts. */
    listModels(
      type: ModelTypeFilter = 'text',
      { includeBeta = false }: { includeBeta?: boolean } = {},
    ): Readonly<ModelList> {
      const at = now();
      // The catalogue is fixed after start: a list only changes when a model's `removesAt` passes.
      if (at >= listsValidUntil || at < listsBuiltAt) {
        lists.clear();
        listsBuiltAt = at;
        listsValidUntil = nextRemoval(at);
      }
      const key = `${type}|${includeBeta}`;
      let list = lists.get(key);
      if (!list) {
        const data: Model[] = [];
        for (const model of catalog.models.values()) {
          if (isRemoved(model) || (model.beta && !includeBeta) || !matchesFilter(model, type)) continue;
          data.push(publicModels.get(model.id) as Model);
        }
        // Shared by every request: frozen, so that no caller (or serializer) can change it for the next one.
        list = deepFreeze({ object: 'list', type, data });
        lists.set(key, list);
      }
      return list;
    },

    /** `GET /models/traits`: trait -> model id. `code` keeps the traits held by code models; `all` merges the
     * types, the first type in catalogue order keeping a name that several types use (`default` is text's). */
    listTraits(type: ModelTypeFilter = 'text'): ModelTraitList {
      const data: Record<string, string> = {};
      const types = type === 'all' || type === 'code' ? MODEL_TYPES : [type];
      for (const t of types) {
        for (const [name, id] of Object.entries(catalog.traits[t] ?? {})) {
          if (name in data) continue;
          const model = catalog.models.get(id);
          if (type === 'code' && !(model && matchesFilter(model, 'code'))) continue;
          data[name] = id;
        }
      }
      return { object: 'list', type, data };
    },

    /** `GET /models/compatibility_mapping`: OpenAI model name -> model id for one type. */
    listCompatibility(type: ModelType = 'text'): ModelCompatibilityMapping {
      return { object: 'list', type, data: { ...catalog.compatibility[type] } };
    },

    /** `GET /image/styles`. */
    imageStyles(): ImageStyleList {
      return { object: 'list', data: [...catalog.imageStyles] };
    },

    /**
     * Resolves what a client sent as `model`: an id, else a trait, else a compatibility alias, for `type` (or
     * across types when a name is unambiguous). A suffix `<name>:<option>=<value>&…` is split off first. A
     * deprecated model past its date resolves to its replacement when `autoRemap` is set; past `removesAt`, or
     * past its date without remap, it no longer resolves. Undefined when nothing matches.
     */
    resolveModel(requested: string, type?: ModelType): ResolveModelResult | undefined {
      const { name, options } = parseModelSuffix(requested);
      const found = lookup(catalog, name, type);
      if (!found) return undefined;
      const [model, requestedAs] = found;
      const deprecation = model.spec.deprecation;
      // Literals of their own fields (no spread after a field: V8 copies such a spread through its runtime).
      if (!deprecation || now() < Date.parse(deprecation.date))
        return { model, requestedAs, requestedName: name, suffixOptions: options };
      if (isRemoved(model) || !deprecation.autoRemap || !deprecation.replacementModelId) return undefined;
      const replacement = catalog.models.get(deprecation.replacementModelId);
      return replacement
        ? {
            model: replacement,
            requestedAs,
            requestedName: name,
            suffixOptions: options,
            remappedFrom: model,
          }
        : undefined;
    },

    /** A model by exact id, whatever its type or state. */
    getModel(id: string): CatalogModel | undefined {
      return catalog.models.get(id);
    },

    /** The model as `GET /models` shows it (internal fields stripped, prices in USD). */
    toPublicModel(model: CatalogModel): Model {
      const known = publicModels.get(model.id);
      return known ? structuredClone(known) : toPublicModel(model, catalog);
    },

    /** The two deprecation headers of an inference response for a deprecated model; `{}` otherwise. */
    deprecationHeaders(model: CatalogModel): DeprecationHeaders {
      const deprecation = model.spec.deprecation;
      if (!deprecation) return {};
      const day = new Date(Date.parse(deprecation.date)).toISOString().slice(0, 10);
      const instead = deprecation.replacementModelId ? ` Use ${deprecation.replacementModelId} instead.` : '';
      return {
        'x-service-model-deprecation-warning': `This model is deprecated and will be removed on ${day}.${instead}`,
        'x-service-model-deprecation-date': day,
      };
    },

    /** The rate-limit tiers of the catalogue (every model declares each). */
    rateLimitTiers(): string[] {
      return [...tiers];
    },

    /** The per-model limits of one tier, as `GET /api_keys/rate_limits` lists them; undefined for an unknown tier. */
    rateLimits(
      tier: string,
      { includeBeta = false }: { includeBeta?: boolean } = {},
    ): ApiKeyModelRateLimits[] | undefined {
      if (!tiers.includes(tier)) return undefined;
      const list: ApiKeyModelRateLimits[] = [];
      for (const model of catalog.models.values()) {
        const limits = model.rateLimits[tier];
        if (!limits || isRemoved(model) || (model.beta && !includeBeta)) continue;
        list.push({
          apiModelId: model.id,
          rateLimits: [
            { amount: limits.requestsPerMinute, type: 'RPM' },
            ...(limits.requestsPerDay ? [{ amount: limits.requestsPerDay, type: 'RPD' as const }] : []),
            ...(limits.tokensPerMinute ? [{ amount: limits.tokensPerMinute, type: 'TPM' as const }] : []),
          ],
        });
      }
      return list;
    },

    /** `GET /characters`: filtered, sorted, one page, with the number of matches. */
    listCharacters(input: ListCharactersInput = {}): ListCharactersResult {
      const search = input.search?.trim().toLowerCase();
      const anyOf = (wanted: readonly string[] | undefined, have: readonly string[]) => {
        if (!wanted || wanted.length === 0) return true;
        const set = new Set(have.map((v) => v.toLowerCase()));
        return wanted.some((w) => set.has(w.toLowerCase()));
      };
      const flag = (wanted: Flag | undefined, value: boolean) =>
        wanted === undefined || (wanted === true || wanted === 'true') === value;

      const matches = [...catalog.characters.values()].filter(
        (c) =>
          (!search ||
            [c.name, c.description ?? '', ...c.tags].some((text) => text.toLowerCase().includes(search))) &&
          anyOf(input.categories, c.categories) &&
          anyOf(input.tags, c.tags) &&
          (!input.modelId || input.modelId.length === 0 || input.modelId.includes(c.modelId)) &&
          flag(input.isAdult, c.adult) &&
          flag(input.isPro, c.pro) &&
          flag(input.isWebEnabled, c.webEnabled),
      );

      const key = sortKey(input.sortBy ?? 'featured', ratingPrior, now());
      const direction = input.sortOrder === 'asc' ? 1 : -1;
      const tieBreak = sortKey('highlyRated', ratingPrior, now());
      matches.sort(
        (a, b) =>
          direction * (key(a) - key(b)) ||
          tieBreak(b) - tieBreak(a) ||
          (a.slug < b.slug ? -1 : a.slug > b.slug ? 1 : 0),
      );

      const limit = Math.min(100, Math.max(1, Math.trunc(input.limit ?? 50)));
      const offset = Math.max(0, Math.trunc(input.offset ?? 0));
      return { items: matches.slice(offset, offset + limit).map(publicCharacter), total: matches.length };
    },

    /** `GET /characters/{slug}`: by slug, or by id (a UUID). */
    getCharacter(slugOrId: string): Character | undefined {
      const character = catalog.characters.get(slugOrId) ?? charactersById.get(slugOrId.toLowerCase());
      return character ? publicCharacter(character) : undefined;
    },

    /** The persona for `service_parameters.character_slug`, with its private instructions. */
    getCharacterPersona(slug: string): CharacterPersona | undefined {
      const character = catalog.characters.get(slug);
      return character
        ? { ...publicCharacter(character), systemPrompt: character.systemPrompt, pro: character.pro }
        : undefined;
    },
  };
}

// ---------------------------------------------------------------------------------------------------------
// Model names

/** An option suffix starts at the first `:` followed by `key=` (ids may contain `/` and `.`, never `:`). */
const SUFFIX_START = /:(?=[A-Za-z_][A-Za-z0-9_]*=)/;

/**
 * Splits `llama-3.3-70b:enable_web_search=auto&enable_web_citations=true` into the name and its options.
 * Values are percent-decoded when they are valid percent-encoding; a later duplicate wins; a segment without
 * `=` becomes an option with an empty value, so that the operation rejects it instead of silently dropping it.
 */
export function parseModelSuffix(requested: string): { name: string; options: Record<string, string> } {
  const match = SUFFIX_START.exec(requested);
  if (!match) return { name: requested, options: {} };
  const entries: [string, string][] = [];
  for (const segment of requested.slice(match.index + 1).split('&')) {
    if (segment === '') continue;
    const eq = segment.indexOf('=');
    const key = eq < 0 ? segment : segment.slice(0, eq);
    const value = eq < 0 ? '' : segment.slice(eq + 1);
    entries.push([decode(key), decode(value)]);
  }
  // fromEntries defines own properties, so a `__proto__` option cannot reach the prototype.
  return { name: requested.slice(0, match.index), options: Object.fromEntries(entries) };
}

function decode(text: string): string {
  try {
    return decodeURIComponent(text.replace(/\+/g, ' '));
  } catch {
    return text;
  }
}

function lookup(
  catalog: Catalog,
  name: string,
  type: ModelType | undefined,
): [CatalogModel, ModelRequestedAs] | undefined {
  const byId = catalog.models.get(name);
  if (byId && (type === undefined || byId.type === type)) return [byId, 'id'];
  const types = type ? [type] : MODEL_TYPES;
  for (const [maps, as] of [
    [catalog.traits, 'trait'],
    [catalog.compatibility, 'alias'],
  ] as const) {
    // Without a type a name must be unambiguous: `default` exists for every type, `gpt-4o` only for text.
    const ids = new Set(types.map((t) => maps[t]?.[name]).filter((id): id is string => id !== undefined));
    if (ids.size > 1) return undefined;
    const [id] = ids;
    const model = id === undefined ? undefined : catalog.models.get(id);
    if (model) return [model, as];
  }
  return undefined;
}

function matchesFilter(model: CatalogModel, filter: ModelTypeFilter): boolean {
  if (filter === 'all') return true;
  if (filter === 'code') return model.type === 'text' && model.spec.capabilities?.optimizedForCode === true;
  return model.type === filter;
}

// ---------------------------------------------------------------------------------------------------------
// Public shapes

function toPublicModel(model: CatalogModel, catalog: Catalog): Model {
  const traits = Object.entries(catalog.traits[model.type] ?? {})
    .filter(([, id]) => id === model.id)
    .map(([name]) => name);
  const { name, description, modelSource, privacy, offline, ...rest } = structuredClone(model.spec);
  const spec: ModelSpec = {
    name,
    ...(description !== undefined ? { description } : {}),
    ...(modelSource !== undefined ? { modelSource } : {}),
    privacy,
    offline,
    traits,
    ...(model.pro ? { pro: true } : {}),
    ...rest,
    ...(model.pricing ? { pricing: pricingToUsd(model.pricing) } : {}),
  };
  return {
    id: model.id,
    object: 'model',
    owned_by: model.ownedBy,
    type: model.type,
    created: model.created,
    ...(model.type === 'text' && spec.availableContextTokens
      ? { context_length: spec.availableContextTokens }
      : {}),
    model_spec: spec,
  };
}

/** Nano prices back to USD numbers, at the JSON edge only. */
export function pricingToUsd(pricing: NanoPricing): ModelPricing {
  const convert = (node: unknown): unknown => {
    if (typeof node !== 'object' || node === null) return node;
    const record = node as Record<string, unknown>;
    if (typeof record.usd === 'bigint' && typeof record.diem === 'bigint') {
      return { usd: nanoToUsdNumber(record.usd), diem: nanoToUsdNumber(record.diem) };
    }
    return Object.fromEntries(Object.entries(record).map(([key, value]) => [key, convert(value)]));
  };
  return convert(pricing) as ModelPricing;
}

function absolute(baseUrl: string, link: string | null): string | null {
  if (link === null || /^https?:\/\//i.test(link)) return link;
  return `${baseUrl}${link.startsWith('/') ? '' : '/'}${link}`;
}

// ---------------------------------------------------------------------------------------------------------
// Character ratings and order

function averageRating(character: CatalogCharacter): number {
  const { ratingCount, ratingSum } = character.stats;
  return ratingCount === 0 ? 0 : Math.round((ratingSum / ratingCount) * 100) / 100;
}

/** The mean of every rating in the catalogue: the prior that a character with few ratings is pulled towards. */
function meanRating(characters: readonly CatalogCharacter[]): number {
  const count = characters.reduce((n, c) => n + c.stats.ratingCount, 0);
  const sum = characters.reduce((n, c) => n + c.stats.ratingSum, 0);
  return count === 0 ? 3 : sum / count;
}

/** Weight of the prior, in ratings: a character needs about this many ratings before its own mean dominates. */
const PRIOR_WEIGHT = 20;
/** `highlyRatedAndRecent` halves a character's score every this many days since publication. */
const RECENCY_HALF_LIFE_DAYS = 30;

function sortKey(sortBy: CharacterSortBy, prior: number, nowMs: number): (c: CatalogCharacter) => number {
  const bayesian = (c: CatalogCharacter) =>
    (PRIOR_WEIGHT * prior + c.stats.ratingSum) / (PRIOR_WEIGHT + c.stats.ratingCount);
  switch (sortBy) {
    case 'featured':
      return (c) => (c.featured ? 1 : 0);
    case 'highestRating':
      return averageRating;
    case 'highlyRated':
      return bayesian;
    case 'highlyRatedAndRecent':
      return (c) => {
        const ageDays = Math.max(0, nowMs - Date.parse(c.createdAt)) / 86_400_000;
        return bayesian(c) * 0.5 ** (ageDays / RECENCY_HALF_LIFE_DAYS);
      };
    case 'imports':
      return (c) => c.stats.imports;
    case 'mostRecent':
      return (c) => Date.parse(c.createdAt);
    case 'ratingCount':
      return (c) => c.stats.ratingCount;
  }
}

/** Freezes an object graph of plain objects and arrays in place. */
function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value)) deepFreeze(child);
  }
  return value;
}
