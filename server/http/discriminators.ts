/**
 * The contract as the request validator compiles it, so that a `oneOf` with a `discriminator` is checked
 * against the one schema its tag names rather than against every branch.
 *
 * Without ajv's `discriminator` option a chat message (`ChatMessage`: `oneOf` five message schemas, told apart
 * by `role`) is checked against all five, and with `allErrors` each of the four that do not match runs to its
 * end, its errors made and thrown away: about a third of a lone chat request's validation (bench/HISTORY.md,
 * fifty-third round). With the option, ajv reads the tag and checks the one schema whose `const` (or `enum`)
 * holds it. It accepts only a discriminator it can derive itself: no `mapping`, each branch a local reference
 * or inline schema whose tag property has a string `const` or `enum`, the values unique, the tag required.
 *
 * What a request is answered is the same either way for a discriminator that `follows` accepts:
 * - The verdict: each branch requires its own tag values, and no two share one, so a value passes `oneOf`
 *   exactly when it passes the branch its tag names, which is what the option checks. The option looks only
 *   at objects (anything else would pass): every branch must be an object schema, so that `oneOf` refuses
 *   anything else, and the followed schema says `type: object` in the copy.
 * - The request's body: ajv fills in no default inside a `oneOf` (a composite rule) but does inside the
 *   branch a discriminator picks. So a discriminator with a default in its branches (outside a composite
 *   rule of their own) is not followed.
 * - The mapping: a followed discriminator's `mapping` must say what ajv derives (each name to the branch
 *   whose tag values hold it); it is then dropped from the validator's copy.
 * - Only the errors of a refused request differ: those of the branch the tag names (or that the tag is not
 *   one of them), rather than every branch's and `oneOf`'s own.
 *
 * Every other discriminator loses its keyword in the validator's copy: ajv without the option ignores it,
 * which is what happens to it today. The exception is a request body that is itself a discriminated `oneOf`:
 * express-openapi-validator picks its branch itself, which does fill in defaults. If one of those cannot be
 * followed, the document is left as it is and the option off.
 *
 * The copy shares every part of the document it does not change.
 */
import { resolveLocalRef } from './spec.ts';

type Schema = Record<string, unknown>;

/** The validator's copy of `document`, and whether to turn ajv's `discriminator` option on for it. */
export type DiscriminatorPlan = {
  document: unknown;
  option: boolean;
  /** The JSON pointers of the discriminators ajv follows, and of those left to `oneOf`. */
  followed: string[];
  left: string[];
};

const isObject = (value: unknown): value is Schema =>
  value !== null && typeof value === 'object' && !Array.isArray(value);

/** A `oneOf` with a `discriminator`. */
const discriminated = (node: unknown): node is Schema & { oneOf: unknown[] } =>
  isObject(node) && isObject(node.discriminator) && Array.isArray(node.oneOf);

/** What `value` names when it is a local `$ref`; `value` itself otherwise. */
const dereferenced = (document: unknown, value: unknown): unknown =>
  isObject(value) && typeof value.$ref === 'string' ? resolveLocalRef(document, value.$ref) : value;

/** Keywords whose subschemas ajv checks as a composite rule (no defaults filled in below them). */
const COMPOSITE = new Set(['oneOf', 'anyOf', 'not', 'if']);
/** Keywords whose values are not subschemas (walking them would find a `default` that is data). */
const NOT_SCHEMAS = new Set(['default', 'const', 'enum', 'examples', 'example', 'discriminator', 'xml']);

/** The schema a branch names: a pure local `$ref` resolved, an inline schema as it is. */
function branchSchema(document: unknown, branch: unknown): Schema | undefined {
  if (!isObject(branch)) return undefined;
  if (typeof branch.$ref !== 'string') return branch;
  if (Object.keys(branch).length !== 1) return undefined;
  const target = resolveLocalRef(document, branch.$ref);
  return isObject(target) ? target : undefined;
}

/** The string values a branch's tag property allows (`const` or `enum`), or undefined if ajv cannot read them. */
function tagValues(schema: Schema, tag: string): string[] | undefined {
  const properties = schema.properties;
  if (!isObject(properties)) return undefined;
  const property = properties[tag];
  if (!isObject(property)) return undefined;
  if (typeof property.const === 'string' && property.const !== '') return [property.const];
  if (Array.isArray(property.enum) && property.enum.every((v) => typeof v === 'string')) return property.enum;
  return undefined;
}

const requires = (schema: Schema, tag: string) =>
  Array.isArray(schema.required) && schema.required.includes(tag);

/**
 * Whether a `default` can be filled in below `schema` by a non-composite path (through its properties, items,
 * `allOf`, `then`/`else`, local references): what ajv's `useDefaults` reaches in a branch a discriminator picks.
 */
function reachesDefault(document: unknown, schema: unknown, seen = new Set<unknown>()): boolean {
  if (Array.isArray(schema)) return schema.some((item) => reachesDefault(document, item, seen));
  if (!isObject(schema) || seen.has(schema)) return false;
  seen.add(schema);
  for (const [keyword, value] of Object.entries(schema)) {
    if (keyword === 'default') return true;
    if (keyword === '$ref' && typeof value === 'string') {
      if (reachesDefault(document, resolveLocalRef(document, value), seen)) return true;
      continue;
    }
    if (COMPOSITE.has(keyword) || NOT_SCHEMAS.has(keyword) || keyword.startsWith('x-')) continue;
    if (reachesDefault(document, value, seen)) return true;
  }
  // A discriminated `oneOf` below, if it is followed too, picks its branch as a non-composite rule: counted
  // as reaching its branches' defaults whether it is or not (the safe side: this one is then not followed).
  if (discriminated(schema))
    return schema.oneOf.some((branch) => reachesDefault(document, branchSchema(document, branch), seen));
  return false;
}

/**
 * Whether ajv can follow the discriminator of `schema` (a `oneOf` with a `discriminator`) and answer every
 * request as `oneOf` does (see above).
 */
export function follows(document: unknown, schema: Schema): boolean {
  const discriminator = schema.discriminator;
  const branches = schema.oneOf;
  if (!isObject(discriminator) || !Array.isArray(branches) || branches.length === 0) return false;
  const tag = discriminator.propertyName;
  if (typeof tag !== 'string') return false;
  // ajv's discriminator (and the `oneOf` it stands for) look only at objects: anything else would pass.
  // With every branch an object schema, `oneOf` refuses anything else, and so does `type: object` on the
  // followed schema (added to the copy).
  if (schema.type !== undefined && schema.type !== 'object') return false;
  const owner = new Map<string, number>();
  const resolved: Schema[] = [];
  for (const [index, branch] of branches.entries()) {
    const target = branchSchema(document, branch);
    if (target?.type !== 'object') return false;
    const values = tagValues(target, tag);
    if (!values || values.length === 0) return false;
    if (!requires(schema, tag) && !requires(target, tag)) return false;
    for (const value of values) {
      if (owner.has(value)) return false;
      owner.set(value, index);
    }
    resolved.push(target);
  }
  const mapping = discriminator.mapping;
  if (mapping !== undefined) {
    if (!isObject(mapping)) return false;
    for (const [value, ref] of Object.entries(mapping)) {
      const index = owner.get(value);
      if (index === undefined || (branches[index] as Schema).$ref !== ref) return false;
    }
  }
  return !resolved.some((target) => reachesDefault(document, target));
}

/** The schemas of the operations' JSON request bodies (resolved), which the validator may branch itself. */
function requestBodySchemas(document: unknown): Set<unknown> {
  const bodies = new Set<unknown>();
  const paths = isObject(document) ? document.paths : undefined;
  if (!isObject(paths)) return bodies;
  for (const item of Object.values(paths)) {
    if (!isObject(item)) continue;
    for (const operation of Object.values(item)) {
      if (!isObject(operation)) continue;
      const body = dereferenced(document, operation.requestBody);
      const content = isObject(body) ? body.content : undefined;
      if (!isObject(content)) continue;
      for (const media of Object.values(content)) {
        const schema = dereferenced(document, isObject(media) ? media.schema : undefined);
        if (schema) bodies.add(schema);
      }
    }
  }
  return bodies;
}

/** The validator's copy of `document` (see above): the parts it changes copied, the rest shared. */
export function planDiscriminators(document: unknown): DiscriminatorPlan {
  const followed: string[] = [];
  const left: string[] = [];
  const bodies = requestBodySchemas(document);
  let leftBody = false;
  const seen = new Map<unknown, unknown>();
  const rewrite = (node: unknown, pointer: string): unknown => {
    if (node === null || typeof node !== 'object') return node;
    const done = seen.get(node);
    if (done !== undefined) return done;
    seen.set(node, node);
    let copy: Record<string, unknown> | unknown[] | undefined;
    const entries: [string, unknown][] = Array.isArray(node)
      ? node.map((value, index) => [String(index), value])
      : Object.entries(node);
    for (const [key, value] of entries) {
      if (key === 'discriminator' || key === 'examples' || key === 'example') continue;
      const next = rewrite(value, `${pointer}/${key.replaceAll('~', '~0').replaceAll('/', '~1')}`);
      if (next !== value) {
        copy ??= Array.isArray(node) ? [...node] : { ...(node as Record<string, unknown>) };
        (copy as Record<string, unknown>)[key] = next;
      }
    }
    if (discriminated(node)) {
      const schema = node;
      copy ??= { ...schema };
      const own = copy as Schema;
      if (follows(document, schema)) {
        const discriminator = { ...(schema.discriminator as Schema) };
        delete discriminator.mapping;
        own.discriminator = discriminator;
        own.type = 'object';
        followed.push(pointer);
      } else {
        delete own.discriminator;
        left.push(pointer);
        if (bodies.has(node)) leftBody = true;
      }
    }
    const result = copy ?? node;
    seen.set(node, result);
    return result;
  };
  const rewritten = rewrite(document, '#');
  if (leftBody || followed.length === 0)
    return { document, option: false, followed: [], left: [...left, ...followed].sort() };
  return { document: rewritten, option: true, followed: followed.sort(), left: left.sort() };
}
