/**
 * Reads the bundled contract and checks responses against it with a JSON Schema 2020-12 validator, the
 * dialect of OpenAPI 3.1. Shared by the contract suites (mock today; server and proxies later).
 */
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { parse } from 'yaml';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const bundlePath = join(repoRoot, 'generated', 'openapi.yaml');

export const HTTP_METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const;

type Json = Record<string, unknown>;
export type OpenApiDoc = Json & {
  paths: Record<string, Json>;
  components: Record<string, Record<string, Json>>;
};

export type Example = { name: string; value: unknown };
export type Parameter = Json & {
  name: string;
  in: string;
  required?: boolean;
  schema?: Json;
  example?: unknown;
};
export type Operation = Json & {
  operationId: string;
  method: string;
  path: string;
  parameters: Parameter[];
  security: Record<string, unknown[]>[];
  responses: Record<string, Json>;
  requestBody?: Json;
};

export function loadBundle(path = bundlePath): OpenApiDoc {
  return parse(readFileSync(path, 'utf8')) as OpenApiDoc;
}

/** Follows a local `$ref` (`#/components/…`) until the object itself. */
export function deref<T = Json>(doc: OpenApiDoc, value: unknown): T {
  let current = value as Json;
  for (let hops = 0; current && typeof current.$ref === 'string'; hops++) {
    if (hops > 16) throw new Error(`$ref cycle at ${current.$ref}`);
    const ref = current.$ref as string;
    if (!ref.startsWith('#/')) throw new Error(`Only local refs are expected in the bundle: ${ref}`);
    current = ref
      .slice(2)
      .split('/')
      .reduce<unknown>(
        (node, key) => (node as Json)?.[key.replace(/~1/g, '/').replace(/~0/g, '~')],
        doc,
      ) as Json;
  }
  return current as T;
}

/** Every operation of the bundle, with path-level parameters merged in. */
export function listOperations(doc: OpenApiDoc): Operation[] {
  const operations: Operation[] = [];
  for (const [path, rawItem] of Object.entries(doc.paths)) {
    const item = deref(doc, rawItem);
    const shared = ((item.parameters as unknown[]) ?? []).map((p) => deref<Parameter>(doc, p));
    for (const method of HTTP_METHODS) {
      const op = item[method] as Json | undefined;
      if (!op) continue;
      const own = ((op.parameters as unknown[]) ?? []).map((p) => deref<Parameter>(doc, p));
      const parameters = [
        ...shared.filter((s) => !own.some((o) => o.name === s.name && o.in === s.in)),
        ...own,
      ];
      operations.push({
        ...op,
        method,
        path,
        parameters,
        security: (op.security ?? doc.security ?? []) as Record<string, unknown[]>[],
        responses: op.responses as Record<string, Json>,
      } as Operation);
    }
  }
  return operations;
}

/** The media type object `type` of a response or request body, if declared. */
export function mediaOf(holder: Json | undefined, type: string): Json | undefined {
  const content = holder?.content as Record<string, Json> | undefined;
  return content?.[type];
}

/** The named examples of a media type object (`examples` map, or the single `example`). */
export function mediaExamples(doc: OpenApiDoc, media: Json | undefined): Example[] {
  if (!media) return [];
  if (media.examples && typeof media.examples === 'object') {
    return Object.entries(media.examples as Record<string, unknown>).map(([name, ex]) => ({
      name,
      value: deref<{ value: unknown }>(doc, ex).value,
    }));
  }
  return 'example' in media ? [{ name: 'example', value: media.example }] : [];
}

export function parameterExample(doc: OpenApiDoc, parameter: Parameter): unknown {
  if ('example' in parameter) return parameter.example;
  const first = Object.values((parameter.examples as Record<string, unknown>) ?? {})[0];
  return first === undefined ? undefined : deref<{ value: unknown }>(doc, first).value;
}

/** The documented example values of an operation's path parameters and required query and header parameters. */
export function exampleParams(
  doc: OpenApiDoc,
  operation: Operation,
): Record<'path' | 'query' | 'header', Record<string, unknown>> {
  const params: Record<'path' | 'query' | 'header', Record<string, unknown>> = {
    path: {},
    query: {},
    header: {},
  };
  for (const parameter of operation.parameters as Parameter[]) {
    const value = parameterExample(doc, parameter);
    if (value === undefined || !(parameter.in in params)) continue;
    if (parameter.in !== 'path' && !parameter.required) continue;
    params[parameter.in as 'path' | 'query' | 'header'][parameter.name] = value;
  }
  return params;
}

/** The first documented JSON request example of an operation (undefined when it takes no JSON body). */
export function exampleJsonBody(doc: OpenApiDoc, operation: Operation): unknown {
  const body = operation.requestBody ? deref(doc, operation.requestBody) : undefined;
  return mediaExamples(doc, mediaOf(body, 'application/json'))[0]?.value;
}

/** The id under which the whole document is registered as one schema resource. */
const DOC_ID = 'https://contract.test/openapi.json';

/** Validates bodies and headers against the schemas of the bundle. */
export class ContractValidator {
  readonly doc: OpenApiDoc;
  private readonly ajv: Ajv2020;
  private readonly cache = new Map<unknown, ValidateFunction>();

  constructor(doc: OpenApiDoc) {
    this.doc = doc;
    this.ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: true });
    addFormats.default(this.ajv);
    for (const format of ['binary', 'byte', 'int32', 'int64', 'float', 'double', 'password']) {
      this.ajv.addFormat(format, true);
    }
    // The whole document is one schema resource, so `#/components/…` refs resolve inside it.
    this.ajv.addSchema({ ...doc, $id: DOC_ID } as Json, DOC_ID);
  }

  /** Errors (empty when valid) of `value` against a schema object taken from the bundle. */
  validate(schema: Json, value: unknown): string[] {
    let validate = this.cache.get(schema);
    if (!validate) {
      validate = this.ajv.compile(rebase(schema));
      this.cache.set(schema, validate);
    }
    if (validate(value)) return [];
    return (validate.errors ?? []).map((e) => `${e.instancePath || '/'} ${e.message ?? 'is invalid'}`);
  }

  /** The schema of a named component (`components.schemas.<name>`). */
  schema(name: string): Json {
    const schema = this.doc.components.schemas?.[name];
    if (!schema) throw new Error(`No schema ${name} in the bundle`);
    return schema;
  }

  /** The declared response for a status (exact code, then `4XX`-style range, then `default`). */
  response(op: Operation, status: number): Json | undefined {
    const raw =
      op.responses[String(status)] ?? op.responses[`${String(status)[0]}XX`] ?? op.responses.default;
    return raw ? deref(this.doc, raw) : undefined;
  }

  /**
   * Problems with a response: an undeclared status or media type, a body that does not match its schema, a
   * declared header whose value does not match its schema.
   */
  checkResponse(
    op: Operation,
    status: number,
    headers: Headers,
    body: { json?: unknown; text?: string },
  ): string[] {
    const declared = this.response(op, status);
    if (!declared) return [`status ${status} is not declared for ${op.operationId}`];
    const problems: string[] = [];
    const content = (declared.content ?? {}) as Record<string, Json>;
    const mediaType = (headers.get('content-type') ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
    if (Object.keys(content).length > 0) {
      const media = content[mediaType];
      if (!media) {
        problems.push(`content-type "${mediaType}" is not declared for ${op.operationId} ${status}`);
      } else if (media.schema) {
        const schema = media.schema as Json;
        const value = mediaType.endsWith('json') ? body.json : body.text;
        problems.push(...this.validate(schema, value).map((e) => `body${e}`));
      }
    }
    for (const [name, rawHeader] of Object.entries((declared.headers ?? {}) as Record<string, unknown>)) {
      const header = deref(this.doc, rawHeader);
      const value = headers.get(name);
      if (value === null || !header.schema) continue;
      const schema = header.schema as Json;
      const typed =
        (schema.type === 'integer' || schema.type === 'number') && value !== '' ? Number(value) : value;
      problems.push(...this.validate(schema, typed).map((e) => `header ${name}${e}`));
    }
    return problems;
  }
}

/** Points a schema's local refs at the document resource registered as `https://contract.test/openapi.json`. */
function rebase(schema: Json): Json {
  return JSON.parse(JSON.stringify(schema), (key, value) =>
    key === '$ref' && typeof value === 'string' && value.startsWith('#/') ? `${DOC_ID}${value}` : value,
  ) as Json;
}
