/**
 * Two pieces of express-openapi-validator's per-request work that depend on nothing but their input, done once:
 *
 * - `ContentType.from(req)` parses the `Content-Type` header with regular expressions on every request (to
 *   find the operation's cached middleware): the parse is kept per header value (bounded; the objects are only
 *   read afterwards).
 * - `RequestParameterMutator.modifyRequest(req)` parses the URL with `url.parse`, rebuilds `req.query` and
 *   normalises every parameter of the operation, on every request, to rewrite query strings, arrays and objects
 *   into the shapes the schemas expect. For an operation whose parameters are all scalars in the path, headers
 *   or cookies (chat, the JSON-RPC proxy and most POST operations) and a URL without a query string, none of
 *   that can change anything: such requests skip it. Everything else goes through the original unchanged.
 *
 * Like `route-regexps.ts`, this patches the modules the validator itself loads. Idempotent;
 * `validatorRequestWorkMemoized()` says whether both hooks are in place (a unit test fails should a release of
 * the validator move them).
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

type Request = {
  headers: Record<string, unknown>;
  originalUrl: string;
  openapi?: { schema?: { parameters?: unknown[] } };
};
type ContentTypeClass = { from(req: Request): unknown; [MEMOIZED]?: true };
type Mutator = { prototype: { modifyRequest(this: unknown, req: Request): void; [MEMOIZED]?: true } };
type Parameter = { $ref?: string; in?: string; content?: unknown; schema?: Schema };
type Schema = { $ref?: string; type?: unknown; allOf?: unknown; oneOf?: unknown; anyOf?: unknown };
type Document = { components?: { parameters?: Record<string, Parameter>; schemas?: Record<string, Schema> } };

const MEMOIZED = Symbol.for('service-api.memoizedValidatorRequestWork');
const MAX_CONTENT_TYPES = 1_000;

function validatorModules() {
  const require = createRequire(import.meta.url);
  const root = dirname(require.resolve('express-openapi-validator'));
  return {
    util: require(join(root, 'middlewares/util.js')) as { ContentType: ContentTypeClass },
    mutator: require(join(root, 'middlewares/parsers/req.parameter.mutator.js')) as {
      RequestParameterMutator: Mutator;
    },
  };
}

export function memoizeValidatorRequestWork(): void {
  const { util, mutator } = validatorModules();
  const contentType = util.ContentType;
  if (!contentType[MEMOIZED]) {
    const from = contentType.from.bind(contentType);
    const parsed = new Map<unknown, unknown>();
    contentType.from = (req) => {
      const header = req.headers['content-type'];
      let found = parsed.get(header);
      if (found === undefined) {
        found = from(req);
        if (parsed.size >= MAX_CONTENT_TYPES) parsed.clear();
        parsed.set(header, found);
      }
      return found;
    };
    contentType[MEMOIZED] = true;
  }
  const prototype = mutator.RequestParameterMutator.prototype;
  if (!prototype[MEMOIZED]) {
    const modifyRequest = prototype.modifyRequest;
    // Per operation (its parameter list, an object of the loaded document): whether every parameter is plain.
    const plain = new WeakMap<object, boolean>();
    prototype.modifyRequest = function (this: { _apiDocs?: Document }, req: Request) {
      const parameters = req.openapi?.schema?.parameters ?? [];
      if (!req.originalUrl.includes('?')) {
        let skip = plain.get(parameters);
        if (skip === undefined) {
          skip = parameters.every((p) => isPlain(this._apiDocs, p as Parameter));
          plain.set(parameters, skip);
        }
        if (skip) return;
      }
      modifyRequest.call(this, req);
    };
    prototype[MEMOIZED] = true;
  }
}

/** Whether both hooks are in place. */
export function validatorRequestWorkMemoized(): boolean {
  const { util, mutator } = validatorModules();
  return util.ContentType[MEMOIZED] === true && mutator.RequestParameterMutator.prototype[MEMOIZED] === true;
}

/** What a `#/components/<kind>/<name>` reference names in the loaded document, as the validator resolves it. */
function component<T>(
  document: Document | undefined,
  kind: 'parameters' | 'schemas',
  ref: string,
): T | undefined {
  const name = ref.replace(/^.+\//, '');
  return document?.components?.[kind]?.[name] as T | undefined;
}

/**
 * A parameter that `modifyRequest` leaves as it is when the URL has no query string: not in the query, no
 * `content`, and a schema with a type that is neither an array nor an object (nor a combination). References
 * are followed one step into the document's components; anything else (a reference that does not resolve, a
 * schema that is itself a reference) counts as not plain: the safe side.
 */
function isPlain(document: Document | undefined, given: Parameter): boolean {
  const parameter =
    given.$ref === undefined ? given : component<Parameter>(document, 'parameters', given.$ref);
  if (!parameter || parameter.$ref !== undefined) return false;
  if (parameter.in === 'query' || parameter.content !== undefined) return false;
  const inline = parameter.schema;
  const schema = inline?.$ref === undefined ? inline : component<Schema>(document, 'schemas', inline.$ref);
  if (!schema || schema.$ref !== undefined) return false;
  if (schema.allOf || schema.oneOf || schema.anyOf) return false;
  return schema.type !== 'array' && schema.type !== 'object' && schema.type !== undefined;
}
