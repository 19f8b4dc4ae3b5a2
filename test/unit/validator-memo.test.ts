/**
 * memoizeValidatorRequestWork: express-openapi-validator's Content-Type parse is kept per header value, and its
 * parameter rewriting is skipped exactly when it could change nothing; every other request is rewritten as the
 * validator's own code rewrites it.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { describe, expect, test } from 'vitest';
import {
  memoizeValidatorRequestWork,
  validatorRequestWorkMemoized,
} from '../../server/http/validator-memo.ts';

type Req = {
  headers: Record<string, unknown>;
  originalUrl: string;
  query: Record<string, unknown>;
  params: Record<string, unknown>;
  openapi: { schema: { parameters: unknown[] } };
};
type Mutator = new (
  ajv: unknown,
  apiDoc: unknown,
  path: string,
  parsedSchema: unknown,
) => { modifyRequest(req: Req): void };

const require = createRequire(import.meta.url);
const root = dirname(require.resolve('express-openapi-validator'));
const util = require(join(root, 'middlewares/util.js')) as {
  ContentType: { from(req: { headers: Record<string, unknown> }): { mediaType: string; parameters: object } };
};
const { RequestParameterMutator } = require(join(root, 'middlewares/parsers/req.parameter.mutator.js')) as {
  RequestParameterMutator: Mutator & { prototype: { modifyRequest(req: Req): void } };
};

// The validator's own code, kept before the patch.
const original = RequestParameterMutator.prototype.modifyRequest;
const originalFrom = util.ContentType.from.bind(util.ContentType);
memoizeValidatorRequestWork();
memoizeValidatorRequestWork(); // idempotent

const apiDoc = {
  components: {
    schemas: {
      Slug: { type: 'string', enum: ['base-mainnet'] },
      Pair: { type: 'array', items: { type: 'string' } },
    },
    parameters: {
      NetworkByRef: {
        in: 'path',
        name: 'network',
        required: true,
        schema: { $ref: '#/components/schemas/Slug' },
      },
      ListByRef: {
        in: 'header',
        name: 'X-List',
        style: 'simple',
        schema: { $ref: '#/components/schemas/Pair' },
      },
      Network: { in: 'path', name: 'network', required: true, schema: { type: 'string' } },
      Key: { in: 'header', name: 'Idempotency-Key', schema: { type: 'string' } },
      List: {
        in: 'header',
        name: 'X-List',
        style: 'simple',
        schema: { type: 'array', items: { type: 'string' } },
      },
      Limit: { in: 'query', name: 'limit', schema: { type: 'integer' } },
      Tags: {
        in: 'query',
        name: 'tags',
        explode: false,
        schema: { type: 'array', items: { type: 'string' } },
      },
    },
  },
};
const ref = (name: string) => ({ $ref: `#/components/parameters/${name}` });

/** A request whose `query` counts the times it is assigned (the validator's rewrite always assigns it). */
function request(url: string, parameters: unknown[], headers: Record<string, unknown> = {}) {
  let query: Record<string, unknown> = Object.fromEntries(new URLSearchParams(url.split('?')[1] ?? ''));
  const req = {
    headers: { ...headers },
    originalUrl: url,
    params: { network: 'base-mainnet' },
    openapi: { schema: { parameters } },
    assigned: 0,
    get query() {
      return query;
    },
    set query(value) {
      req.assigned++;
      query = value;
    },
  };
  return req;
}

function both(url: string, parameters: unknown[], headers: Record<string, unknown> = {}) {
  // What the validator's ajv answers for a schema reference (its `getSchema`).
  const ajv = {
    getSchema: (id: string) => ({
      schema: apiDoc.components.schemas[id.replace(/^.+\//, '') as keyof typeof apiDoc.components.schemas],
    }),
  };
  const mutator = new RequestParameterMutator(ajv, apiDoc, '/x', {});
  const patched = request(url, parameters, headers);
  mutator.modifyRequest(patched);
  const expected = request(url, parameters, headers);
  original.call(mutator, expected);
  const seen = (r: ReturnType<typeof request>) => ({ query: r.query, params: r.params, headers: r.headers });
  return { patched, expected, same: () => expect(seen(patched)).toEqual(seen(expected)) };
}

describe('memoizeValidatorRequestWork', () => {
  test('both hooks are in place', () => {
    expect(validatorRequestWorkMemoized()).toBe(true);
  });

  test('a Content-Type is parsed once per header value, as the validator parses it', () => {
    const json = { headers: { 'content-type': 'application/json; charset=UTF-8' } };
    const first = util.ContentType.from(json);
    expect(util.ContentType.from({ headers: { ...json.headers } })).toBe(first);
    expect(first).toEqual(originalFrom(json));
    expect(first.mediaType).toBe('application/json');
    const multipart = util.ContentType.from({
      headers: { 'content-type': 'multipart/form-data; boundary=x' },
    });
    expect(multipart).not.toBe(first);
    expect(multipart.mediaType).toBe('multipart/form-data');
    expect(util.ContentType.from({ headers: {} })).toEqual(originalFrom({ headers: {} }));
  });

  test('scalars in the path and headers, no query string: nothing to rewrite, and nothing is done', () => {
    const { patched, expected, same } = both(
      '/api/v1/crypto/rpc/base-mainnet',
      [ref('Network'), ref('Key')],
      {
        'idempotency-key': 'abc',
      },
    );
    same();
    expect(expected.assigned).toBe(1); // the validator's code did run for the comparison
    expect(patched.assigned).toBe(0);
  });

  test('a scalar schema given by reference is plain too; an array schema by reference is not', () => {
    const scalar = both('/api/v1/crypto/rpc/base-mainnet', [ref('NetworkByRef'), ref('Key')]);
    scalar.same();
    expect(scalar.patched.assigned).toBe(0);
    const array = both('/x', [ref('ListByRef')], { 'x-list': 'a,b' });
    array.same();
    expect(array.patched.assigned).toBe(1);
    expect(array.patched.headers['x-list']).toEqual(['a', 'b']);
  });

  test('an array header is still split, a query string still read, as the validator does', () => {
    const array = both('/x', [ref('Network'), ref('List')], { 'x-list': 'a,b' });
    array.same();
    expect(array.patched.assigned).toBe(1);
    expect(array.patched.headers['x-list']).toEqual(['a', 'b']);

    const query = both('/x?limit=5&tags=a,b', [ref('Limit'), ref('Tags')]);
    query.same();
    expect(query.patched.assigned).toBe(1);
    expect(query.patched.query.tags).toEqual(['a', 'b']);

    // A query parameter without a query string: left to the validator's code too.
    const absent = both('/x', [ref('Tags')]);
    absent.same();
    expect(absent.patched.assigned).toBe(1);
  });
});
