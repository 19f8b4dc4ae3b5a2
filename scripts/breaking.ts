/**
 * The breaking-change gate: v1 of the API stays backward compatible. Compares the bundled spec
 * (`generated/openapi.yaml`) with the one at a base revision and fails on a change that would break an
 * existing client, unless `spec/breaking-changes.yaml` lists it as intentional (with a reason).
 *
 *   npm run check:breaking                   base: $BREAKING_BASE, else the newest `api-v*` tag, else skip
 *   npm run check:breaking -- --base REF     any git revision
 *   npm run check:breaking -- --old FILE     compare with a bundle on disk (the gate's own tests)
 *
 * What counts as breaking (each reported with an id `<kind> <where>`):
 * - removed-operation, removed-parameter, newly-required-parameter, removed-request-media-type,
 *   newly-required-request-body;
 * - in request schemas (body and parameters): removed-request-field, newly-required-request-field,
 *   narrowed-enum (a value removed, or an enum added), narrowed-type (a JSON type removed, number to integer,
 *   fewer oneOf/anyOf variants);
 * - in success responses: removed-response (a 2xx status), removed-response-media-type, removed-response-field,
 *   response-field-no-longer-required, changed-response-type (a field may now hold a JSON type the old contract
 *   did not allow, e.g. number to string);
 * - in every response: removed-response-example (a named example removed or renamed: mock consumers select
 *   examples by name with `Prefer: example=<name>`).
 * Additions (new operations, optional fields, enum values in requests, response fields) are not breaking.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';

type Json = Record<string, unknown>;
type Side = 'request' | 'response';

export type BreakingChange = { id: string; kind: string; where: string; message: string };
export type Allowance = { change: string; reason: string };

const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const;

const isObject = (value: unknown): value is Json =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** Follows local `$ref`s (`#/components/...`) until a non-reference object. */
function resolveRef(doc: Json, value: unknown): Json | undefined {
  let current = value;
  for (let hops = 0; isObject(current) && typeof current.$ref === 'string' && hops < 50; hops++) {
    const ref = current.$ref;
    if (!ref.startsWith('#/')) return undefined;
    current = ref
      .slice(2)
      .split('/')
      .map((part) => part.replace(/~1/g, '/').replace(/~0/g, '~'))
      .reduce<unknown>((node, key) => (isObject(node) ? node[key] : undefined), doc);
  }
  return isObject(current) ? current : undefined;
}

/** The types a schema accepts; undefined means any. `integer` is a subset of `number`. */
function typesOf(schema: Json): Set<string> | undefined {
  const type = schema.type;
  if (typeof type === 'string') return new Set([type]);
  if (Array.isArray(type)) return new Set(type.filter((t): t is string => typeof t === 'string'));
  return undefined;
}

/** Properties and required names of an object schema, allOf members merged in. */
function objectView(doc: Json, schema: Json): { properties: Map<string, unknown>; required: Set<string> } {
  const properties = new Map<string, unknown>();
  const required = new Set<string>();
  const visit = (node: Json, depth: number) => {
    if (depth > 20) return;
    if (isObject(node.properties)) {
      for (const [name, value] of Object.entries(node.properties)) properties.set(name, value);
    }
    if (Array.isArray(node.required)) {
      for (const name of node.required) if (typeof name === 'string') required.add(name);
    }
    if (Array.isArray(node.allOf)) {
      for (const member of node.allOf) {
        const resolved = resolveRef(doc, member);
        if (resolved) visit(resolved, depth + 1);
      }
    }
  };
  visit(schema, 0);
  return { properties, required };
}

/** Compares two bundles; returns every breaking change from `oldDoc` to `newDoc`. */
export function compareSpecs(oldDoc: Json, newDoc: Json): BreakingChange[] {
  const changes: BreakingChange[] = [];
  const report = (kind: string, where: string, message: string) =>
    changes.push({ id: `${kind} ${where}`, kind, where, message });

  function compareSchema(oldValue: unknown, newValue: unknown, side: Side, where: string, seen: Set<string>) {
    const oldSchema = resolveRef(oldDoc, oldValue);
    const newSchema = resolveRef(newDoc, newValue);
    if (!oldSchema || !newSchema) return;
    const key = `${side}|${where}|${JSON.stringify(oldValue).slice(0, 200)}|${JSON.stringify(newValue).slice(0, 200)}`;
    // Recursive schemas: a pair of references is compared once per location prefix.
    const refPair = `${side}|${String(oldValue && (oldValue as Json).$ref)}|${String(newValue && (newValue as Json).$ref)}`;
    if (seen.has(key) || (isObject(oldValue) && oldValue.$ref && seen.has(refPair))) return;
    const nextSeen = new Set(seen).add(key);
    if (isObject(oldValue) && oldValue.$ref) nextSeen.add(refPair);

    if (side === 'request') {
      const oldTypes = typesOf(oldSchema);
      const newTypes = typesOf(newSchema);
      if (newTypes) {
        const lost = oldTypes
          ? [...oldTypes].filter((t) => !newTypes.has(t) && !(t === 'integer' && newTypes.has('number')))
          : ['(any)'];
        if (lost.length > 0) report('narrowed-type', where, `no longer accepts ${lost.join(', ')}`);
      }
      if (Array.isArray(newSchema.enum)) {
        const allowed = new Set(newSchema.enum.map((v) => JSON.stringify(v)));
        const lost = Array.isArray(oldSchema.enum)
          ? oldSchema.enum.filter((v) => !allowed.has(JSON.stringify(v)))
          : ['(any value)'];
        if (lost.length > 0) {
          report(
            'narrowed-enum',
            where,
            `no longer accepts ${lost.map((v) => JSON.stringify(v)).join(', ')}`,
          );
        }
      }
    }

    if (side === 'response') {
      // A client reads what the old contract promised: a response value of a type it did not allow breaks it.
      const oldTypes = typesOf(oldSchema);
      const newTypes = typesOf(newSchema);
      if (oldTypes) {
        const added = newTypes
          ? [...newTypes].filter((t) => !oldTypes.has(t) && !(t === 'integer' && oldTypes.has('number')))
          : ['(any)'];
        if (added.length > 0) report('changed-response-type', where, `may now be ${added.join(', ')}`);
      }
    }

    for (const combinator of ['oneOf', 'anyOf'] as const) {
      const oldVariants = oldSchema[combinator];
      const newVariants = newSchema[combinator];
      if (!Array.isArray(oldVariants)) continue;
      if (!Array.isArray(newVariants)) continue;
      if (side === 'request' && newVariants.length < oldVariants.length) {
        report(
          'narrowed-type',
          where,
          `${combinator} went from ${oldVariants.length} to ${newVariants.length} variants`,
        );
      }
      for (let i = 0; i < Math.min(oldVariants.length, newVariants.length); i++) {
        compareSchema(oldVariants[i], newVariants[i], side, `${where}|${combinator}[${i}]`, nextSeen);
      }
    }

    const oldObject = objectView(oldDoc, oldSchema);
    const newObject = objectView(newDoc, newSchema);
    for (const [name, oldProperty] of oldObject.properties) {
      const path = `${where}.${name}`;
      if (!newObject.properties.has(name)) {
        report(
          side === 'request' ? 'removed-request-field' : 'removed-response-field',
          path,
          `field "${name}" was removed`,
        );
        continue;
      }
      if (side === 'response' && oldObject.required.has(name) && !newObject.required.has(name)) {
        report('response-field-no-longer-required', path, `field "${name}" is no longer always present`);
      }
      compareSchema(oldProperty, newObject.properties.get(name), side, path, nextSeen);
    }
    if (side === 'request') {
      for (const name of newObject.required) {
        if (!oldObject.required.has(name)) {
          report('newly-required-request-field', `${where}.${name}`, `field "${name}" is now required`);
        }
      }
    }
    if (oldSchema.items !== undefined && newSchema.items !== undefined) {
      compareSchema(oldSchema.items, newSchema.items, side, `${where}[]`, nextSeen);
    }
    if (isObject(oldSchema.additionalProperties) && isObject(newSchema.additionalProperties)) {
      compareSchema(
        oldSchema.additionalProperties,
        newSchema.additionalProperties,
        side,
        `${where}{}`,
        nextSeen,
      );
    }
  }

  const paths = (doc: Json) => (isObject(doc.paths) ? doc.paths : {});
  const oldPaths = paths(oldDoc);
  const newPaths = paths(newDoc);
  for (const [path, oldItemValue] of Object.entries(oldPaths)) {
    const oldItem = resolveRef(oldDoc, oldItemValue) ?? {};
    const newItem = resolveRef(newDoc, newPaths[path]) ?? {};
    for (const method of HTTP_METHODS) {
      const oldOp = resolveRef(oldDoc, oldItem[method]);
      if (!oldOp) continue;
      const op = `${method.toUpperCase()} ${path}`;
      const newOp = resolveRef(newDoc, newItem[method]);
      if (!newOp) {
        report('removed-operation', op, `operation ${op} was removed`);
        continue;
      }
      compareParameters(op, [oldItem.parameters, oldOp.parameters], [newItem.parameters, newOp.parameters]);
      compareRequestBody(op, oldOp.requestBody, newOp.requestBody);
      compareResponses(op, oldOp.responses, newOp.responses);
    }
  }

  function parameterMap(doc: Json, lists: unknown[]): Map<string, Json> {
    const map = new Map<string, Json>();
    for (const list of lists) {
      if (!Array.isArray(list)) continue;
      for (const entry of list) {
        const parameter = resolveRef(doc, entry);
        if (parameter && typeof parameter.name === 'string' && typeof parameter.in === 'string') {
          const name = parameter.in === 'header' ? parameter.name.toLowerCase() : parameter.name;
          map.set(`${parameter.in}:${name}`, parameter);
        }
      }
    }
    return map;
  }

  function compareParameters(op: string, oldLists: unknown[], newLists: unknown[]) {
    const oldParameters = parameterMap(oldDoc, oldLists);
    const newParameters = parameterMap(newDoc, newLists);
    for (const [id, oldParameter] of oldParameters) {
      const newParameter = newParameters.get(id);
      if (!newParameter) {
        report('removed-parameter', `${op} ${id}`, `parameter ${id} was removed`);
        continue;
      }
      compareSchema(oldParameter.schema, newParameter.schema, 'request', `${op} ${id}`, new Set());
    }
    for (const [id, newParameter] of newParameters) {
      if (newParameter.required === true && oldParameters.get(id)?.required !== true) {
        report('newly-required-parameter', `${op} ${id}`, `parameter ${id} is now required`);
      }
    }
  }

  function compareRequestBody(op: string, oldValue: unknown, newValue: unknown) {
    const oldBody = resolveRef(oldDoc, oldValue);
    const newBody = resolveRef(newDoc, newValue);
    if (!newBody) return;
    if (newBody.required === true && oldBody?.required !== true) {
      report('newly-required-request-body', op, 'the request body is now required');
    }
    if (!oldBody) return;
    const oldContent = isObject(oldBody.content) ? oldBody.content : {};
    const newContent = isObject(newBody.content) ? newBody.content : {};
    for (const [mediaType, oldMedia] of Object.entries(oldContent)) {
      const newMedia = newContent[mediaType];
      const where = `${op} requestBody ${mediaType}`;
      if (!isObject(newMedia)) {
        report('removed-request-media-type', where, `${mediaType} is no longer accepted`);
        continue;
      }
      compareSchema((oldMedia as Json).schema, newMedia.schema, 'request', `${where} `, new Set());
    }
  }

  /** Named response examples are what a mock consumer selects (`Prefer: example=<name>`): keep the names. */
  function compareExamples(where: string, oldMedia: Json, newMedia: Json) {
    if (!isObject(oldMedia.examples)) return;
    const kept = isObject(newMedia.examples) ? newMedia.examples : {};
    for (const name of Object.keys(oldMedia.examples)) {
      if (!(name in kept))
        report(
          'removed-response-example',
          `${where} example:${name}`,
          `example "${name}" was removed or renamed`,
        );
    }
  }

  function compareResponses(op: string, oldValue: unknown, newValue: unknown) {
    const oldResponses = isObject(oldValue) ? oldValue : {};
    const newResponses = isObject(newValue) ? newValue : {};
    for (const [status, oldResponseValue] of Object.entries(oldResponses)) {
      const oldContent = resolveRef(oldDoc, oldResponseValue)?.content;
      const newContent = resolveRef(newDoc, newResponses[status])?.content;
      if (!isObject(oldContent) || !isObject(newContent)) continue;
      for (const [mediaType, oldMedia] of Object.entries(oldContent)) {
        const newMedia = newContent[mediaType];
        if (isObject(oldMedia) && isObject(newMedia))
          compareExamples(`${op} ${status} ${mediaType}`, oldMedia, newMedia);
      }
    }
    for (const [status, oldResponseValue] of Object.entries(oldResponses)) {
      if (!/^2\d\d$/.test(status)) continue;
      const where = `${op} ${status}`;
      const newResponse = resolveRef(newDoc, newResponses[status]);
      if (!newResponse) {
        report('removed-response', where, `response ${status} was removed`);
        continue;
      }
      const oldResponse = resolveRef(oldDoc, oldResponseValue) ?? {};
      const oldContent = isObject(oldResponse.content) ? oldResponse.content : {};
      const newContent = isObject(newResponse.content) ? newResponse.content : {};
      for (const [mediaType, oldMedia] of Object.entries(oldContent)) {
        const newMedia = newContent[mediaType];
        if (!isObject(newMedia)) {
          report(
            'removed-response-media-type',
            `${where} ${mediaType}`,
            `${mediaType} is no longer returned`,
          );
          continue;
        }
        compareSchema(
          (oldMedia as Json).schema,
          newMedia.schema,
          'response',
          `${where} ${mediaType} `,
          new Set(),
        );
      }
    }
  }

  return changes;
}

/** Splits changes into those listed as intentional and those that fail the gate. */
export function applyAllowances(changes: BreakingChange[], allowances: Allowance[]) {
  const allowed = new Set(allowances.map((a) => a.change));
  return {
    blocking: changes.filter((c) => !allowed.has(c.id)),
    intentional: changes.filter((c) => allowed.has(c.id)),
  };
}

export function loadAllowances(path: string): Allowance[] {
  if (!existsSync(path)) return [];
  const parsed = parse(readFileSync(path, 'utf8')) as { intentional?: unknown } | null;
  const list = parsed?.intentional ?? [];
  if (!Array.isArray(list)) throw new Error(`${path}: "intentional" must be a list`);
  return list.map((entry, i) => {
    if (
      !isObject(entry) ||
      typeof entry.change !== 'string' ||
      typeof entry.reason !== 'string' ||
      !entry.reason
    ) {
      throw new Error(`${path}: intentional[${i}] needs "change" (the change id) and a non-empty "reason"`);
    }
    return { change: entry.change, reason: entry.reason };
  });
}

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

function git(args: string[]): string | undefined {
  try {
    return execFileSync('git', args, {
      cwd: root,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
  } catch {
    return undefined;
  }
}

/** The base revision: --base, $BREAKING_BASE, else the newest `api-v*` tag. */
function baseRevision(argv: string[]): string | undefined {
  const flag = argv.indexOf('--base');
  if (flag >= 0) return argv[flag + 1];
  if (process.env.BREAKING_BASE) return process.env.BREAKING_BASE;
  return git(['describe', '--tags', '--abbrev=0', '--match', 'api-v*', 'HEAD']) || undefined;
}

function main(argv: string[]): number {
  const newDoc = parse(readFileSync(join(root, 'generated', 'openapi.yaml'), 'utf8')) as Json;
  let oldText: string | undefined;
  let label: string;
  const oldFlag = argv.indexOf('--old');
  if (oldFlag >= 0) {
    const file = argv[oldFlag + 1] ?? '';
    oldText = readFileSync(file, 'utf8');
    label = file;
  } else {
    const base = baseRevision(argv);
    if (!base) {
      console.log('check:breaking: no base revision (no git, no api-v* tag, no BREAKING_BASE); skipped');
      return 0;
    }
    oldText = git(['show', `${base}:generated/openapi.yaml`]);
    label = base;
    if (oldText === undefined) {
      console.log(`check:breaking: ${base} has no generated/openapi.yaml (or git is unavailable); skipped`);
      return 0;
    }
  }
  const changes = compareSpecs(parse(oldText) as Json, newDoc);
  const { blocking, intentional } = applyAllowances(
    changes,
    loadAllowances(join(root, 'spec', 'breaking-changes.yaml')),
  );
  for (const change of intentional) console.log(`intentional: ${change.id}`);
  if (blocking.length === 0) {
    console.log(
      `check:breaking: no breaking change against ${label} (${intentional.length} marked intentional)`,
    );
    return 0;
  }
  console.error(`check:breaking: ${blocking.length} breaking change(s) against ${label}:`);
  for (const change of blocking) console.error(`  - ${change.id}\n      ${change.message}`);
  console.error('If a change is intentional, list its id with a reason in spec/breaking-changes.yaml.');
  return 1;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exit(main(process.argv.slice(2)));
}
