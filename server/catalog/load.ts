/**
 * Reads the catalogue: the file shipped with the server, then the operator's override (the `SERVICE_CONFIG`
 * YAML file, whose path the caller passes in). Every problem of every file is collected, located by file, line
 * and YAML path, and thrown together as one `CatalogError`, so a bad deployment fails at start with the whole
 * list instead of one problem per restart.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Document, isMap, isNode, isScalar, isSeq, LineCounter, parseDocument } from 'yaml';
import type { z } from 'zod';
import type { ModelType } from '../../generated/api.d.ts';
import { yamlValues } from '../yaml-values.ts';
import {
  type CatalogFile,
  type CharacterEntry,
  catalogFileSchema,
  EXTRA_SECTIONS,
  type ExtraSection,
  MODEL_TYPES,
  type ModelEntry,
} from './schema.ts';
import type { Backend, Catalog, CatalogCharacter, CatalogModel, NameMap } from './types.ts';

/** The catalogue shipped with the server. */
export const DEFAULT_CATALOG_PATH = fileURLToPath(new URL('./default-catalog.yaml', import.meta.url));

/** A catalogue that cannot be used; `problems` lists every reason, each located in its file. */
export class CatalogError extends Error {
  override readonly name = 'CatalogError';
  readonly problems: readonly string[];

  constructor(problems: readonly string[], options?: { cause?: unknown }) {
    const count = `${problems.length} problem${problems.length === 1 ? '' : 's'}`;
    super(`Invalid model catalogue (${count}):\n${problems.map((p) => `  - ${p}`).join('\n')}`, options);
    this.problems = problems;
  }
}

export interface LoadCatalogInput {
  /** The override file (`SERVICE_CONFIG`), applied over the default catalogue. */
  overridePath?: string;
  /** Another base catalogue instead of the shipped one (tests, tools). */
  defaultPath?: string;
}

/** One catalogue file: where it came from (for messages) and its text. */
export interface CatalogSource {
  path: string;
  text: string;
}

/** Reads and validates the default catalogue and, when given, the override applied over it. */
export function loadCatalog(input: LoadCatalogInput = {}): Catalog {
  const paths = [input.defaultPath ?? DEFAULT_CATALOG_PATH];
  if (input.overridePath) paths.push(input.overridePath);
  const sources: CatalogSource[] = [];
  const problems: string[] = [];
  for (const path of paths) {
    try {
      sources.push({ path, text: readFileSync(path, 'utf8') });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      problems.push(`${path}: cannot be read (${code ?? (error as Error).message})`);
    }
  }
  if (problems.length > 0) throw new CatalogError(problems);
  return buildCatalog(sources);
}

/** Builds a catalogue from file contents, each applied over the previous ones (pure: no I/O). */
export function buildCatalog(sources: readonly CatalogSource[]): Catalog {
  const parsed: ParsedSource[] = [];
  const problems: string[] = [];
  for (const source of sources) {
    const result = parseSource(source);
    if ('problems' in result) problems.push(...result.problems);
    else parsed.push(result);
  }
  if (problems.length > 0) throw new CatalogError(problems);
  const merged = merge(parsed);
  problems.push(...merged.problems, ...crossCheck(merged));
  if (problems.length > 0) throw new CatalogError(problems);
  return normalise(merged, sources);
}

// ---------------------------------------------------------------------------------------------------------
// One file

type Path = readonly PropertyKey[];

interface ParsedSource {
  path: string;
  file: CatalogFile;
  /** `file:line:col` of the node at a YAML path (or of its nearest existing parent). */
  locate: (path: Path) => string;
}

function parseSource(source: CatalogSource): ParsedSource | { problems: string[] } {
  const lineCounter = new LineCounter();
  const doc = parseDocument(source.text, { lineCounter, prettyErrors: false, uniqueKeys: true });
  if (doc.errors.length > 0) {
    return {
      problems: doc.errors.map((error) => {
        const pos = lineCounter.linePos(error.pos[0]);
        return `${source.path}:${pos.line}:${pos.col}: ${error.message.split('\n')[0]}`;
      }),
    };
  }
  const locate = locator(source.path, doc, lineCounter);
  // The strings one byte a character where they fit, whatever else the file has: model ids and names go into
  // every answer (yaml-values.ts).
  const data: unknown = yamlValues(doc, { maxAliasCount: 1000 }) ?? {};
  const result = catalogFileSchema.safeParse(data);
  if (!result.success)
    return { problems: result.error.issues.flatMap((issue) => describeIssue(issue, locate)) };
  return { path: source.path, file: result.data, locate };
}

function locator(file: string, doc: Document, lineCounter: LineCounter): (path: Path) => string {
  const at = (offset: number) => {
    const pos = lineCounter.linePos(offset);
    return `${file}:${pos.line}:${pos.col}`;
  };
  return (path) => {
    // The key of the innermost mapping entry that exists (where a reader looks), else the nearest node.
    for (let depth = path.length; depth > 0; depth--) {
      const parent = depth === 1 ? doc.contents : doc.getIn(path.slice(0, depth - 1) as unknown[], true);
      if (isMap(parent)) {
        const pair = parent.items.find(
          (item) => isScalar(item.key) && String(item.key.value) === String(path[depth - 1]),
        );
        if (pair && isNode(pair.key) && pair.key.range) return at(pair.key.range[0]);
      } else if (isSeq(parent)) {
        const item = parent.items[Number(path[depth - 1])];
        if (isNode(item) && item.range) return at(item.range[0]);
      }
    }
    return isNode(doc.contents) && doc.contents.range ? at(doc.contents.range[0]) : file;
  };
}

function describeIssue(issue: z.core.$ZodIssue, locate: (path: Path) => string): string[] {
  if (issue.code === 'unrecognized_keys') {
    return issue.keys.map((key) => {
      const path = [...issue.path, key];
      const hint =
        issue.path.length === 0
          ? ` (the sections are models, traits, compatibility, imageStyles, characters, ${EXTRA_SECTIONS.join(', ')})`
          : '';
      return `${locate(path)}: ${formatPath(path)}: unknown key${hint}`;
    });
  }
  return [`${locate(issue.path)}: ${formatPath(issue.path)}: ${issue.message}`];
}

/** A YAML path as `models["llama-3.3-70b"].model_spec.pricing.input`. */
export function formatPath(path: Path): string {
  let out = '';
  for (const part of path) {
    if (typeof part === 'number') out += `[${part}]`;
    else if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(String(part))) out += out ? `.${String(part)}` : String(part);
    else out += `[${JSON.stringify(String(part))}]`;
  }
  return out || '(document)';
}

// ---------------------------------------------------------------------------------------------------------
// Overlay

interface Placed<T> {
  value: T;
  from: ParsedSource;
  path: Path;
}

interface Merged {
  models: Map<string, Placed<ModelEntry>>;
  traits: Map<ModelType, Map<string, Placed<string>>>;
  compatibility: Map<ModelType, Map<string, Placed<string>>>;
  imageStyles: string[];
  characters: Map<string, Placed<CharacterEntry>>;
  extra: Partial<Record<ExtraSection, unknown>>;
  /** Entries removed by an override, and by which file (to explain a dangling reference). */
  removed: Map<string, string>;
  problems: string[];
}

function merge(sources: readonly ParsedSource[]): Merged {
  const merged: Merged = {
    models: new Map(),
    traits: new Map(),
    compatibility: new Map(),
    imageStyles: [],
    characters: new Map(),
    extra: {},
    removed: new Map(),
    problems: [],
  };
  for (const source of sources) {
    const { file } = source;
    overlayEntries(merged, source, 'models', file.models, merged.models);
    overlayEntries(merged, source, 'characters', file.characters, merged.characters);
    overlayNames(merged, source, 'traits', file.traits, merged.traits);
    overlayNames(merged, source, 'compatibility', file.compatibility, merged.compatibility);
    if (file.imageStyles) merged.imageStyles = [...file.imageStyles];
    for (const section of EXTRA_SECTIONS) {
      if (file[section] !== undefined) merged.extra[section] = file[section];
    }
  }
  return merged;
}

/** Entries by key: a whole entry replaces, `{ enabled: false }` removes. */
function overlayEntries<T>(
  merged: Merged,
  source: ParsedSource,
  section: 'models' | 'characters',
  entries: Record<string, { enabled: false } | T> | undefined,
  into: Map<string, Placed<T>>,
): void {
  for (const [key, entry] of Object.entries(entries ?? {})) {
    const path = [section, key];
    if ((entry as { enabled?: boolean }).enabled === false) {
      if (!into.delete(key)) {
        merged.problems.push(
          `${source.locate(path)}: ${formatPath(path)}: nothing to disable, no such entry`,
        );
      }
      merged.removed.set(`${section}/${key}`, source.path);
    } else {
      into.set(key, { value: entry as T, from: source, path });
    }
  }
}

/** Name maps per type, merged by key; `null` removes a key. */
function overlayNames(
  merged: Merged,
  source: ParsedSource,
  section: 'traits' | 'compatibility',
  maps: Partial<Record<ModelType, Record<string, string | null>>> | undefined,
  into: Map<ModelType, Map<string, Placed<string>>>,
): void {
  for (const [type, names] of Object.entries(maps ?? {}) as [ModelType, Record<string, string | null>][]) {
    const target = into.get(type) ?? new Map<string, Placed<string>>();
    into.set(type, target);
    for (const [name, modelId] of Object.entries(names)) {
      const path = [section, type, name];
      if (modelId === null) {
        if (!target.delete(name)) {
          merged.problems.push(
            `${source.locate(path)}: ${formatPath(path)}: nothing to remove, no such name`,
          );
        }
      } else {
        target.set(name, { value: modelId, from: source, path });
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Cross-references of the merged catalogue

function crossCheck(merged: Merged): string[] {
  const problems: string[] = [];
  const at = (placed: Placed<unknown>, sub: Path, message: string) => {
    const path = [...placed.path, ...sub];
    problems.push(`${placed.from.locate(path)}: ${formatPath(path)}: ${message}`);
  };
  const missing = (id: string) => {
    const removedBy = merged.removed.get(`models/${id}`);
    return `model '${id}' does not exist${removedBy ? ` (disabled by ${removedBy})` : ''}`;
  };

  // One set of rate-limit tiers for the whole catalogue, so a tier never silently falls through to "unlimited".
  const tiers = new Set([...merged.models.values()].flatMap((m) => Object.keys(m.value.rateLimits)));
  for (const model of merged.models.values()) {
    const lacking = [...tiers].filter((tier) => !(tier in model.value.rateLimits));
    if (lacking.length > 0)
      at(model, ['rateLimits'], `no limits for tier ${lacking.join(', ')} (every model declares every tier)`);
    const names = backendsOf(model.path[1] as string, model.value).map((b) => b.name);
    const duplicate = names.find((name, i) => names.indexOf(name) !== i);
    if (duplicate)
      at(model, ['provider'], `two backends are named '${duplicate}'; give each a distinct name`);
    const deprecation = model.value.model_spec.deprecation;
    const replacement = deprecation?.replacementModelId;
    if (replacement !== undefined) {
      const target = merged.models.get(replacement);
      const where = ['model_spec', 'deprecation', 'replacementModelId'];
      if (!target) at(model, where, missing(replacement));
      else if (target.value.type !== model.value.type)
        at(model, where, `'${replacement}' is a ${target.value.type} model`);
      else if (target.value.model_spec.deprecation) at(model, where, `'${replacement}' is itself deprecated`);
    }
  }

  for (const [section, maps] of [
    ['traits', merged.traits],
    ['compatibility', merged.compatibility],
  ] as const) {
    for (const [type, names] of maps) {
      for (const [name, placed] of names) {
        const target = merged.models.get(placed.value);
        if (!target) at(placed, [], missing(placed.value));
        else if (target.value.type !== type)
          at(placed, [], `'${placed.value}' is a ${target.value.type} model, not ${type}`);
        if (merged.models.has(name))
          at(placed, [], `'${name}' is also a model id; a name must not shadow a model`);
        if (
          section === 'traits' &&
          name === 'default' &&
          target &&
          (target.value.pro || target.value.model_spec.beta)
        ) {
          at(placed, [], 'the default model must be open to every account (not pro, not beta)');
        }
      }
    }
  }

  for (const type of MODEL_TYPES) {
    const first = [...merged.models.values()].find((m) => m.value.type === type);
    if (first && !merged.traits.get(type)?.has('default')) {
      const [anyTrait] = merged.traits.get(type)?.values() ?? [];
      const path = ['traits', type, 'default'];
      const where = (anyTrait ?? first).from.locate(anyTrait ? path : first.path);
      problems.push(
        `${where}: ${formatPath(path)}: every model type with models needs a default (${type} has '${first.path[1] as string}')`,
      );
    }
  }

  const characterIds = new Map<string, string>();
  for (const [slug, placed] of merged.characters) {
    const target = merged.models.get(placed.value.modelId);
    if (!target) at(placed, ['modelId'], missing(placed.value.modelId));
    else if (target.value.type !== 'text')
      at(placed, ['modelId'], `'${placed.value.modelId}' is a ${target.value.type} model, not text`);
    const other = characterIds.get(placed.value.id);
    if (other) at(placed, ['id'], `the id is also the id of '${other}'`);
    characterIds.set(placed.value.id, slug);
  }
  return problems;
}

// ---------------------------------------------------------------------------------------------------------
// The catalogue the server uses

function normalise(merged: Merged, sources: readonly CatalogSource[]): Catalog {
  const models = new Map<string, CatalogModel>();
  for (const [id, placed] of merged.models) models.set(id, toCatalogModel(id, placed.value));
  const characters = new Map<string, CatalogCharacter>();
  for (const [slug, placed] of merged.characters) {
    const { enabled: _enabled, ...entry } = placed.value;
    const model = models.get(entry.modelId);
    characters.set(slug, { ...entry, slug, pro: entry.pro || model?.pro === true });
  }
  const names = (maps: Merged['traits']): NameMap =>
    Object.fromEntries(
      [...maps]
        .filter(([, entries]) => entries.size > 0)
        .map(([type, entries]) => [
          type,
          Object.fromEntries([...entries].map(([name, p]) => [name, p.value])),
        ]),
    );
  return {
    models,
    traits: names(merged.traits),
    compatibility: names(merged.compatibility),
    imageStyles: merged.imageStyles,
    characters,
    extra: merged.extra,
    sources: sources.map((s) => s.path),
  };
}

function toCatalogModel(id: string, entry: ModelEntry): CatalogModel {
  const { pricing, traits: _traits, pro: _pro, ...spec } = entry.model_spec;
  const caps = spec.capabilities;
  return {
    id,
    type: entry.type,
    created: entry.created,
    ownedBy: entry.ownedBy,
    spec,
    ...(pricing ? { pricing } : {}),
    backends: backendsOf(id, entry),
    rateLimits: entry.rateLimits,
    maxConcurrency: entry.maxConcurrency,
    pro: entry.pro,
    beta: spec.beta === true,
    reasoning: caps?.supportsReasoning === true,
    thinkingTags: caps?.thinkingTagFormat === true,
    canDisableThinking: entry.canDisableThinking === true,
    ...(entry.sampleRateHz ? { sampleRateHz: entry.sampleRateHz } : {}),
    ...(entry.video
      ? {
          video: {
            pricePerSecond: entry.video.pricePerSecond,
            audioPricePerSecond: entry.video.audioPricePerSecond ?? 0n,
            downloadUrl: entry.video.downloadUrl,
            ...(entry.video.consentFlow ? { consentFlow: entry.video.consentFlow } : {}),
          },
        }
      : {}),
  };
}

function backendsOf(id: string, entry: ModelEntry): Backend[] {
  const list = Array.isArray(entry.provider) ? entry.provider : [entry.provider];
  return list.map((backend): Backend => {
    if (backend.kind === 'local') return { kind: 'local', name: 'local' };
    return {
      kind: 'openai-compatible',
      name: backend.name ?? new URL(backend.baseUrl).host,
      baseUrl: backend.baseUrl,
      upstreamModel: backend.upstreamModel ?? id,
      ...(backend.apiKeyEnv ? { apiKeyEnv: backend.apiKeyEnv } : {}),
      ...(backend.timeoutMs ? { timeoutMs: backend.timeoutMs } : {}),
    };
  });
}
