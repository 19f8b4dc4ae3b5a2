/**
 * fast-check arbitraries of HTTP requests generated from the bundled contract (generated/openapi.yaml), for
 * property-based tests: for any operation, requests that follow its schemas (required fields, enums, bounds,
 * formats, with the spec's own examples mixed in so that valid requests reach the handlers) and requests that
 * break them in one named way (wrong type, missing required field, out of range, extra junk, wrong content
 * type, malformed JSON, junk path or query values). Requests are plain data (a path, a query string, headers,
 * a body), so a failing case prints readably and shrinks; the caller adds credentials and sends them.
 */
import fc from 'fast-check';
import { deref, listOperations, type OpenApiDoc, type Operation } from './contract.ts';

type Json = Record<string, unknown>;
type Schema = Json;

/** A multipart field: text, or a file part. */
export type MultipartField = string | { filename: string; contentType: string; bytes: number[] };

export type RequestBody =
  | { kind: 'json'; text: string }
  | { kind: 'raw'; contentType: string | null; text: string }
  | { kind: 'multipart'; fields: Record<string, MultipartField> };

export type GeneratedRequest = {
  operationId: string;
  method: string;
  /** The path under the API base, parameters substituted and percent-encoded (`/characters/abc`). */
  path: string;
  /** `?a=1&b=2`, or '' when there is no query. */
  query: string;
  headers: Record<string, string>;
  body?: RequestBody;
  /** Whether the request follows the schemas (best effort: `oneOf` overlaps may still make it invalid). */
  valid: boolean;
  /** For invalid requests, what was broken (`body.wrong-type /messages/0/role`, `query.junk limit`, …). */
  mutation?: string;
};

export type ArbitraryOptions = {
  /**
   * Known-good values to mix into path and query parameters by name (`walletAddress`, `id`, `slug`): random
   * ones mostly miss (404), these reach the handlers.
   */
  knownValues?: Record<string, readonly string[]>;
  /** Largest array generated when a schema has no smaller `maxItems` (default 3). */
  maxArrayItems?: number;
  /** Depth below which objects get only their required properties (default 5). */
  maxDepth?: number;
};

/** Header parameters the caller owns (credentials, payments): never generated. */
const CALLER_HEADERS = new Set([
  'authorization',
  'sign-in-with-x',
  'x-sign-in-with-x',
  'payment-signature',
  'x-payment',
  'x-402-payment',
]);

/** Values of every JSON type, to put where a schema expects another one. */
const anyJson = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.string({ maxLength: 20 }),
  fc.array(fc.integer(), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 }), { maxKeys: 3 }),
);

/** Strings that tend to break naive parsers and SQL/HTML handling. */
const nastyStrings = fc.constantFrom(
  '',
  ' ',
  '\u0000',
  '%00',
  '%',
  '%zz',
  '../../etc/passwd',
  "'; drop table accounts; --",
  '<script>alert(1)</script>',
  '\ud800',
  '😀'.repeat(20),
  'a'.repeat(5000),
  '-1',
  '1e309',
  'NaN',
  'null',
  '[]',
  '{}',
  '__proto__',
  'constructor',
);

export class SpecArbitraries {
  readonly doc: OpenApiDoc;
  readonly operations: Operation[];
  private readonly options: Required<Omit<ArbitraryOptions, 'knownValues'>> & {
    knownValues: Record<string, readonly string[]>;
  };

  constructor(doc: OpenApiDoc, options: ArbitraryOptions = {}) {
    this.doc = doc;
    this.operations = listOperations(doc);
    this.options = {
      knownValues: options.knownValues ?? {},
      maxArrayItems: options.maxArrayItems ?? 3,
      maxDepth: options.maxDepth ?? 5,
    };
  }

  operation(operationId: string): Operation {
    const op = this.operations.find((o) => o.operationId === operationId);
    if (!op) throw new Error(`No operation ${operationId} in the bundle`);
    return op;
  }

  /** Valid values of a schema (best effort for `oneOf` with overlapping branches). */
  value(schema: unknown, depth = 0): fc.Arbitrary<unknown> {
    const s = this.resolve(schema);
    const generated = this.generate(s, depth);
    const examples = this.examplesOf(s);
    if (examples.length === 0) return generated;
    return fc.oneof(
      { arbitrary: fc.constantFrom(...examples), weight: 2 },
      { arbitrary: generated, weight: 1 },
    );
  }

  /** Requests that follow the operation's schemas. */
  valid(op: Operation): fc.Arbitrary<GeneratedRequest> {
    return fc
      .record({
        path: this.pathValues(op),
        query: this.queryValues(op),
        headers: this.headerValues(op),
        body: this.bodyValue(op),
      })
      .map(({ path, query, headers, body }) => this.build(op, { path, query, headers, body, valid: true }));
  }

  /** Requests that break the operation's contract in one way, named in `mutation`. */
  invalid(op: Operation): fc.Arbitrary<GeneratedRequest> {
    const base = fc.record({
      path: this.pathValues(op),
      query: this.queryValues(op),
      headers: this.headerValues(op),
      body: this.bodyValue(op),
    });
    const mutations: fc.Arbitrary<GeneratedRequest>[] = [];
    const media = this.requestMedia(op);
    if (media?.type === 'application/json') {
      const schema = media.schema;
      mutations.push(
        fc
          .tuple(
            base,
            fc.nat(),
            anyJson,
            fc.constantFrom('wrong-type', 'drop-required', 'out-of-range', 'junk'),
          )
          .map(([parts, index, junk, kind]) => {
            const [body, where] = mutateValue(this, schema, parts.body, kind, index, junk);
            return this.build(op, { ...parts, body, valid: false, mutation: `body.${kind} ${where}` });
          }),
        fc
          .tuple(base, anyJson)
          .map(([parts, junk]) =>
            this.build(op, { ...parts, body: junk, valid: false, mutation: 'body.not-an-object' }),
          ),
        fc
          .tuple(base, fc.constantFrom('truncate', 'trailing', 'single-quotes', 'empty', 'bom-garbage'))
          .map(([parts, how]) => {
            const text = JSON.stringify(parts.body ?? {});
            const broken =
              how === 'truncate'
                ? text.slice(0, Math.max(1, Math.floor(text.length / 2)))
                : how === 'trailing'
                  ? `${text} }{`
                  : how === 'single-quotes'
                    ? text.replaceAll('"', "'")
                    : how === 'empty'
                      ? ''
                      : `\ufeff\u0001${text}`;
            return this.build(op, {
              ...parts,
              rawBody: { kind: 'raw', contentType: 'application/json', text: broken },
              valid: false,
              mutation: `body.malformed-json ${how}`,
            });
          }),
        fc
          .tuple(
            base,
            fc.constantFrom(
              null,
              'text/plain',
              'application/xml',
              'application/x-www-form-urlencoded',
              'multipart/form-data; boundary=x',
              'application/json; charset=utf-7',
              'image/png',
            ),
          )
          .map(([parts, contentType]) =>
            this.build(op, {
              ...parts,
              rawBody: { kind: 'raw', contentType, text: JSON.stringify(parts.body ?? {}) },
              valid: false,
              mutation: `body.content-type ${contentType}`,
            }),
          ),
      );
    } else if (media?.type === 'multipart/form-data') {
      mutations.push(
        fc.tuple(base, fc.nat(), fc.string({ maxLength: 30 })).map(([parts, index, junk]) => {
          const fields = { ...((parts.body as Record<string, MultipartField>) ?? {}) };
          const names = Object.keys(fields);
          const name = names[index % Math.max(1, names.length)];
          if (name) fields[name] = junk;
          return this.build(op, {
            ...parts,
            rawBody: { kind: 'multipart', fields },
            valid: false,
            mutation: `multipart.wrong-value ${name ?? '-'}`,
          });
        }),
        fc.tuple(base, fc.nat()).map(([parts, index]) => {
          const fields = { ...((parts.body as Record<string, MultipartField>) ?? {}) };
          const names = Object.keys(fields);
          const name = names[index % Math.max(1, names.length)];
          if (name) delete fields[name];
          return this.build(op, {
            ...parts,
            rawBody: { kind: 'multipart', fields },
            valid: false,
            mutation: `multipart.drop ${name ?? '-'}`,
          });
        }),
        fc.tuple(base, anyJson).map(([parts, junk]) =>
          this.build(op, {
            ...parts,
            rawBody: { kind: 'json', text: JSON.stringify(junk) },
            valid: false,
            mutation: 'multipart.sent-as-json',
          }),
        ),
      );
    } else {
      // No body declared: a body anyway.
      mutations.push(
        fc.tuple(base, anyJson).map(([parts, junk]) =>
          this.build(op, {
            ...parts,
            rawBody: { kind: 'json', text: JSON.stringify(junk) },
            valid: false,
            mutation: 'body.unexpected',
          }),
        ),
      );
    }
    const queryParams = op.parameters.filter((p) => p.in === 'query');
    mutations.push(
      fc
        .tuple(base, fc.nat(), fc.oneof(nastyStrings, fc.string({ maxLength: 12 })), fc.boolean())
        .map(([parts, index, junk, unknownName]) => {
          const target = queryParams[index % Math.max(1, queryParams.length)];
          const name = unknownName || !target ? `junk_${index % 7}` : target.name;
          const query = { ...parts.query, [name]: junk };
          return this.build(op, { ...parts, query, valid: false, mutation: `query.junk ${name}` });
        }),
    );
    const pathParams = op.parameters.filter((p) => p.in === 'path');
    if (pathParams.length > 0) {
      mutations.push(
        fc.tuple(base, fc.nat(), nastyStrings).map(([parts, index, junk]) => {
          const target = pathParams[index % pathParams.length];
          const path = { ...parts.path, [target?.name ?? '']: junk };
          return this.build(op, { ...parts, path, valid: false, mutation: `path.junk ${target?.name}` });
        }),
      );
    }
    return fc.oneof(...mutations);
  }

  /** Valid and invalid requests of one operation, `validShare` of them valid (0..1). */
  requests(op: Operation, validShare = 0.4): fc.Arbitrary<GeneratedRequest> {
    const valid = Math.round(validShare * 10);
    return fc.oneof(
      { arbitrary: this.valid(op), weight: valid },
      { arbitrary: this.invalid(op), weight: 10 - valid },
    );
  }

  // ---------------------------------------------------------------------------------------------------------

  /** `$ref`s followed; `allOf` merged (properties, required). */
  resolve(schema: unknown): Schema {
    const s = deref<Schema>(this.doc, schema ?? {});
    if (!Array.isArray(s.allOf)) return s;
    const merged: Schema = { ...s };
    delete merged.allOf;
    for (const part of s.allOf.map((p) => this.resolve(p))) {
      merged.type ??= part.type;
      merged.properties = { ...((merged.properties as Json) ?? {}), ...((part.properties as Json) ?? {}) };
      merged.required = [...((merged.required as string[]) ?? []), ...((part.required as string[]) ?? [])];
      for (const [k, v] of Object.entries(part)) if (!(k in merged)) merged[k] = v;
    }
    return merged;
  }

  private examplesOf(s: Schema): unknown[] {
    const out: unknown[] = [];
    if (Array.isArray(s.examples)) out.push(...s.examples);
    if ('example' in s) out.push(s.example);
    if ('default' in s) out.push(s.default);
    return out.filter((v) => v !== undefined);
  }

  private generate(s: Schema, depth: number): fc.Arbitrary<unknown> {
    if ('const' in s) return fc.constant(s.const);
    if (Array.isArray(s.enum)) return fc.constantFrom(...(s.enum as unknown[]));
    const branches = (s.oneOf ?? s.anyOf) as unknown[] | undefined;
    if (Array.isArray(branches) && branches.length > 0) {
      const base: Schema = { ...s };
      delete base.oneOf;
      delete base.anyOf;
      delete base.discriminator;
      return fc.oneof(
        ...branches.map((b) => {
          const branch = this.resolve(b);
          const own = Object.keys(base).some((k) => ['properties', 'required', 'type'].includes(k));
          return this.generate(own ? mergeSchemas(base, branch) : branch, depth + 1);
        }),
      );
    }
    if (Array.isArray(s.type)) {
      return fc.oneof(...(s.type as string[]).map((t) => this.generate({ ...s, type: t }, depth)));
    }
    const type = (s.type as string | undefined) ?? (s.properties ? 'object' : s.items ? 'array' : undefined);
    switch (type) {
      case 'null':
        return fc.constant(null);
      case 'boolean':
        return fc.boolean();
      case 'integer':
        return integerIn(s);
      case 'number':
        return numberIn(s);
      case 'string':
        return stringIn(s);
      case 'array': {
        const minLength = (s.minItems as number | undefined) ?? 0;
        const maxLength = Math.max(
          minLength,
          Math.min(
            (s.maxItems as number | undefined) ?? Number.POSITIVE_INFINITY,
            minLength + this.options.maxArrayItems,
          ),
        );
        const item = this.value(s.items ?? {}, depth + 1);
        return s.uniqueItems
          ? fc.uniqueArray(item, { minLength, maxLength, selector: (v) => JSON.stringify(v) })
          : fc.array(item, { minLength, maxLength });
      }
      case 'object':
        return this.objectIn(s, depth);
      default:
        return fc.jsonValue({ maxDepth: 2 });
    }
  }

  private objectIn(s: Schema, depth: number): fc.Arbitrary<unknown> {
    const properties = (s.properties as Record<string, unknown> | undefined) ?? {};
    const required = new Set((s.required as string[] | undefined) ?? []);
    const deep = depth >= this.options.maxDepth;
    const keys = Object.keys(properties).filter((k) => !deep || required.has(k));
    const model: Record<string, fc.Arbitrary<unknown>> = {};
    for (const key of keys) model[key] = this.value(properties[key], depth + 1);
    const record = fc.record(model, { requiredKeys: keys.filter((k) => required.has(k)) });
    const extra = s.additionalProperties;
    if (extra && typeof extra === 'object' && Object.keys(properties).length === 0 && !deep) {
      return fc
        .tuple(
          record,
          fc.dictionary(fc.stringMatching(/^[a-z_]{1,12}$/), this.value(extra, depth + 1), { maxKeys: 3 }),
        )
        .map(([fixed, more]) => ({ ...more, ...(fixed as Json) }));
    }
    return record;
  }

  private params(op: Operation, location: string) {
    return op.parameters.filter((p) => p.in === location && !CALLER_HEADERS.has(p.name.toLowerCase()));
  }

  private paramValue(name: string, schema: unknown): fc.Arbitrary<unknown> {
    const known = this.options.knownValues[name];
    const value = this.value(schema ?? { type: 'string' });
    return known && known.length > 0
      ? fc.oneof({ arbitrary: fc.constantFrom(...known), weight: 3 }, { arbitrary: value, weight: 1 })
      : value;
  }

  private pathValues(op: Operation): fc.Arbitrary<Record<string, unknown>> {
    const model: Record<string, fc.Arbitrary<unknown>> = {};
    for (const p of this.params(op, 'path')) model[p.name] = this.paramValue(p.name, p.schema);
    return fc.record(model);
  }

  private queryValues(op: Operation): fc.Arbitrary<Record<string, unknown>> {
    const model: Record<string, fc.Arbitrary<unknown>> = {};
    const params = this.params(op, 'query');
    for (const p of params) model[p.name] = this.paramValue(p.name, p.schema);
    return fc.record(model, { requiredKeys: params.filter((p) => p.required).map((p) => p.name) });
  }

  private headerValues(op: Operation): fc.Arbitrary<Record<string, unknown>> {
    const model: Record<string, fc.Arbitrary<unknown>> = {};
    const params = this.params(op, 'header');
    for (const p of params) model[p.name] = this.value(p.schema ?? { type: 'string' });
    return fc.record(model, { requiredKeys: params.filter((p) => p.required).map((p) => p.name) });
  }

  private requestMedia(op: Operation): { type: string; schema: Schema } | undefined {
    const body = op.requestBody ? deref<Json>(this.doc, op.requestBody) : undefined;
    const content = (body?.content ?? {}) as Record<string, Json>;
    const type = Object.keys(content)[0];
    if (!type) return undefined;
    return { type, schema: this.resolve(content[type]?.schema ?? {}) };
  }

  private bodyValue(op: Operation): fc.Arbitrary<unknown> {
    const media = this.requestMedia(op);
    if (!media) return fc.constant(undefined);
    if (media.type !== 'multipart/form-data') return this.value(media.schema);
    // Multipart: text fields as text, binary fields as a small file part.
    const properties = (media.schema.properties as Record<string, unknown> | undefined) ?? {};
    const required = new Set((media.schema.required as string[] | undefined) ?? []);
    const model: Record<string, fc.Arbitrary<MultipartField>> = {};
    for (const [name, raw] of Object.entries(properties)) {
      const s = this.resolve(raw);
      model[name] =
        s.format === 'binary' || s.contentMediaType
          ? fc.record({
              filename: fc.constantFrom('a.wav', 'b.mp3', 'c.bin', 'd'),
              contentType: fc.constantFrom(
                'audio/wav',
                'audio/mpeg',
                'application/octet-stream',
                'video/mp4',
              ),
              bytes: fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 64 }),
            })
          : this.value(s).map((v) => (typeof v === 'string' ? v : JSON.stringify(v)));
    }
    return fc.record(model, { requiredKeys: Object.keys(properties).filter((k) => required.has(k)) });
  }

  private build(
    op: Operation,
    parts: {
      path: Record<string, unknown>;
      query: Record<string, unknown>;
      headers: Record<string, unknown>;
      body?: unknown;
      rawBody?: RequestBody;
      valid: boolean;
      mutation?: string;
    },
  ): GeneratedRequest {
    const path = op.path.replace(/\{([^}]+)\}/g, (_, name: string) =>
      encodeURIComponent(asParam(parts.path[name])),
    );
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(parts.query)) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) search.append(name, asParam(v));
      else search.append(name, asParam(value));
    }
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(parts.headers)) {
      if (value !== undefined) headers[name] = asParam(value).replace(/[^\x20-\x7e]/g, '');
    }
    const media = this.requestMedia(op);
    let body: RequestBody | undefined = parts.rawBody;
    if (!body && media && parts.body !== undefined) {
      body =
        media.type === 'multipart/form-data'
          ? { kind: 'multipart', fields: parts.body as Record<string, MultipartField> }
          : { kind: 'json', text: JSON.stringify(parts.body) };
    }
    const query = search.toString();
    return {
      operationId: op.operationId,
      method: op.method.toUpperCase(),
      path,
      query: query ? `?${query}` : '',
      headers,
      ...(body ? { body } : {}),
      valid: parts.valid,
      ...(parts.mutation ? { mutation: parts.mutation } : {}),
    };
  }
}

/** Lone UTF-16 surrogates (which have no UTF-8 form) become U+FFFD, as a client's encoder would make them. */
const wellFormed = (value: string) =>
  value.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');

function asParam(value: unknown): string {
  if (typeof value === 'string') return wellFormed(value);
  if (value === undefined) return '';
  return typeof value === 'object' ? JSON.stringify(value) : String(value);
}

function mergeSchemas(base: Schema, branch: Schema): Schema {
  return {
    ...base,
    ...branch,
    properties: { ...((base.properties as Json) ?? {}), ...((branch.properties as Json) ?? {}) },
    required: [...((base.required as string[]) ?? []), ...((branch.required as string[]) ?? [])],
  };
}

function integerIn(s: Schema): fc.Arbitrary<number> {
  let min = (s.minimum as number | undefined) ?? -1_000_000;
  let max = (s.maximum as number | undefined) ?? 1_000_000;
  if (typeof s.exclusiveMinimum === 'number') min = Math.floor(s.exclusiveMinimum) + 1;
  if (typeof s.exclusiveMaximum === 'number') max = Math.ceil(s.exclusiveMaximum) - 1;
  // Mostly small values (bounds are often huge), sometimes the edges.
  const small = fc.integer({ min, max: Math.min(max, Math.max(min, 0) + 64) });
  return fc.oneof(
    { arbitrary: small, weight: 4 },
    { arbitrary: fc.constantFrom(min, max), weight: 1 },
    { arbitrary: fc.integer({ min, max }), weight: 1 },
  );
}

function numberIn(s: Schema): fc.Arbitrary<number> {
  let min = (s.minimum as number | undefined) ?? -1e6;
  const max = (s.maximum as number | undefined) ?? 1e6;
  if (typeof s.exclusiveMinimum === 'number') min = s.exclusiveMinimum + Number.EPSILON * 16;
  return fc.double({ min, max, noNaN: true, noDefaultInfinity: true });
}

function stringIn(s: Schema): fc.Arbitrary<string> {
  const minLength = (s.minLength as number | undefined) ?? 0;
  const maxLength = Math.max(minLength, Math.min((s.maxLength as number | undefined) ?? 200, minLength + 40));
  const within = (v: string) => v.length >= minLength && v.length <= ((s.maxLength as number) ?? Infinity);
  switch (s.format) {
    case 'date-time':
      return fc
        .date({
          min: new Date('2000-01-01T00:00:00Z'),
          max: new Date('2100-01-01T00:00:00Z'),
          noInvalidDate: true,
        })
        .map((d) => d.toISOString());
    case 'date':
      return fc
        .date({
          min: new Date('2000-01-01T00:00:00Z'),
          max: new Date('2100-01-01T00:00:00Z'),
          noInvalidDate: true,
        })
        .map((d) => d.toISOString().slice(0, 10));
    case 'uuid':
      return fc.uuid();
    case 'uri':
      return fc.webUrl();
    case 'email':
      return fc.emailAddress();
  }
  if (typeof s.pattern === 'string') {
    try {
      return fc.stringMatching(new RegExp(s.pattern)).filter(within);
    } catch {
      // A pattern fast-check cannot invert (lookarounds): fall through to plain strings, filtered.
      const re = new RegExp(s.pattern);
      return fc
        .string({ minLength: Math.max(minLength, 1), maxLength, unit: 'grapheme-ascii' })
        .filter((v) => re.test(v));
    }
  }
  return fc.oneof(
    { arbitrary: fc.string({ minLength, maxLength }), weight: 3 },
    { arbitrary: fc.string({ minLength, maxLength, unit: 'grapheme' }), weight: 1 },
  );
}

type Mutation = 'wrong-type' | 'drop-required' | 'out-of-range' | 'junk';

/** Names of extra fields: plain junk, and keys of Object.prototype. */
const JUNK_KEYS = ['junk_0', 'junk_1', 'junk_2', '__proto__', 'valueOf', 'constructor', 'toString'];

/** Locations in a value with the schema that describes each (JSON pointer, schema). */
function locations(
  gen: SpecArbitraries,
  schema: Schema,
  value: unknown,
  pointer = '',
): [string, Schema, unknown][] {
  const s = gen.resolve(schema);
  const out: [string, Schema, unknown][] = [[pointer, s, value]];
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const properties = (s.properties as Record<string, unknown> | undefined) ?? {};
    for (const [key, child] of Object.entries(value as Json)) {
      const childSchema = properties[key];
      if (childSchema) out.push(...locations(gen, gen.resolve(childSchema), child, `${pointer}/${key}`));
    }
  } else if (Array.isArray(value) && s.items) {
    value.forEach((child, i) => {
      out.push(...locations(gen, gen.resolve(s.items), child, `${pointer}/${i}`));
    });
  }
  return out;
}

/** A value the schema refuses, in the way `kind` names. */
function broken(s: Schema, kind: Mutation, junk: unknown): unknown {
  const type = Array.isArray(s.type) ? s.type[0] : s.type;
  if (kind === 'out-of-range') {
    if (Array.isArray(s.enum)) return `not-${JSON.stringify(s.enum[0])}-${JSON.stringify(junk).slice(0, 5)}`;
    if (typeof s.maximum === 'number') return s.maximum + 1;
    if (typeof s.minimum === 'number') return s.minimum - 1;
    if (typeof s.maxLength === 'number') return 'x'.repeat(s.maxLength + 1);
    if (typeof s.minLength === 'number' && s.minLength > 0) return '';
    if (typeof s.maxItems === 'number') return Array.from({ length: s.maxItems + 1 }, () => junk);
  }
  // Wrong type (also the fallback): something of another JSON type than the schema's.
  switch (type) {
    case 'string':
      return typeof junk === 'string' ? 12345 : junk;
    case 'integer':
    case 'number':
      return typeof junk === 'number' ? 'not-a-number' : junk;
    case 'boolean':
      return typeof junk === 'boolean' ? 'yes' : junk;
    case 'array':
      return Array.isArray(junk) ? { not: 'an array' } : junk;
    case 'object':
      return junk && typeof junk === 'object' && !Array.isArray(junk) ? [junk] : junk;
    default:
      return junk;
  }
}

/** Breaks a valid body at the `index`-th suitable location; returns the new body and where it was broken. */
function mutateValue(
  gen: SpecArbitraries,
  schema: Schema,
  body: unknown,
  kind: Mutation,
  index: number,
  junk: unknown,
): [unknown, string] {
  const copy = structuredClone(body ?? {}) as unknown;
  const all = locations(gen, schema, copy);
  const candidates = all.filter(([, s, v]) => {
    if (kind === 'drop-required')
      return v && typeof v === 'object' && ((s.required as string[]) ?? []).length > 0;
    if (kind === 'junk')
      return v && typeof v === 'object' && !Array.isArray(v) && s.additionalProperties === false;
    if (kind === 'out-of-range')
      return ['enum', 'maximum', 'minimum', 'maxLength', 'minLength', 'maxItems'].some((k) => k in s);
    return true;
  });
  const pick = candidates[index % Math.max(1, candidates.length)] ?? all[0];
  if (!pick) return [junk, '/'];
  const [pointer, s, value] = pick;
  if (kind === 'drop-required' && value && typeof value === 'object') {
    const required = (s.required as string[]) ?? [];
    const key = required[index % required.length] as string;
    delete (value as Json)[key];
    return [copy, `${pointer}/${key}`];
  }
  if (kind === 'junk' && value && typeof value === 'object' && !Array.isArray(value)) {
    // Sometimes a name Object.prototype also has: such fields have tripped recursive code before.
    const key = JUNK_KEYS[index % JUNK_KEYS.length] ?? `junk_${index % 97}`;
    Object.defineProperty(value, key, { value: junk, enumerable: true, writable: true, configurable: true });
    return [copy, `${pointer}/${key}`];
  }
  const replacement = broken(s, kind === 'out-of-range' ? 'out-of-range' : 'wrong-type', junk);
  if (pointer === '') return [replacement, '/'];
  const segments = pointer.split('/').slice(1);
  const last = segments.pop() as string;
  let parent = copy as Json;
  for (const segment of segments) parent = parent[segment] as Json;
  parent[last] = replacement;
  return [copy, pointer];
}
