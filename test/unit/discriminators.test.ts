/**
 * The request validator's copy of the contract (server/http/discriminators.ts): which discriminators ajv's
 * `discriminator` option follows, and that following them answers every request as `oneOf` does: the same
 * verdict and the same body (defaults) for requests generated from the contract, valid and invalid.
 */
import { Ajv2020 } from 'ajv/dist/2020.js';
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { follows, planDiscriminators } from '../../server/http/discriminators.ts';
import { loadContract } from '../../server/http/spec.ts';
import { loadBundle } from '../support/contract.ts';
import { SpecArbitraries } from '../support/spec-arbitraries.ts';

const contract = loadContract();
const original = structuredClone(contract.document);

/** An ajv as express-openapi-validator makes one for request bodies (framework/ajv/options.ts), `discriminator` as given. */
function requestAjv(discriminator: boolean) {
  return new Ajv2020({
    strict: false,
    strictNumbers: true,
    strictTuples: true,
    allowUnionTypes: false,
    validateSchema: false,
    useDefaults: true,
    removeAdditional: false,
    coerceTypes: false,
    validateFormats: false,
    allErrors: true,
    discriminator,
  });
}

type Doc = { components: { schemas: Record<string, unknown> }; paths: Record<string, unknown> };
const schemas = (doc: unknown) => (doc as Doc).components.schemas;

describe('planDiscriminators on the contract', () => {
  const plan = planDiscriminators(contract.document);

  test('the chat message is followed; those whose branches have defaults are left to oneOf', () => {
    expect(plan.option).toBe(true);
    expect(plan.followed).toContain('#/components/schemas/ChatMessage');
    // `image_url.detail`, `input_audio.format`, `json_schema.strict`: defaults a oneOf does not fill in.
    expect(plan.left).toEqual([
      '#/components/schemas/ChatResponseFormat',
      '#/components/schemas/ChatUserContentPart',
    ]);
    const message = schemas(plan.document).ChatMessage as { discriminator: object };
    expect(message.discriminator).toEqual({ propertyName: 'role' });
    expect(schemas(plan.document).ChatUserContentPart).not.toHaveProperty('discriminator');
  });

  test('the contract itself is unchanged, and what the copy does not change is shared with it', () => {
    expect(contract.document).toEqual(original);
    expect((plan.document as Doc).paths).toBe((contract.document as unknown as Doc).paths);
    expect(schemas(plan.document).ChatUserMessage).toBe(schemas(contract.document).ChatUserMessage);
    expect(schemas(plan.document).ChatMessage).not.toBe(schemas(contract.document).ChatMessage);
  });

  test('ajv compiles every request body of the copy with the option on', () => {
    const ajv = requestAjv(true);
    const document = plan.document as Doc & { components: object };
    for (const name of Object.keys(document.components.schemas)) {
      expect(
        () => ajv.compile({ $ref: `#/components/schemas/${name}`, components: document.components }),
        name,
      ).not.toThrow();
    }
  });

  test('behavior: requests generated from the contract get the same verdict and the same body either way', () => {
    const doc = loadBundle();
    const arbitraries = new SpecArbitraries(doc);
    const withOneOf = requestAjv(false);
    const withOption = requestAjv(true);
    const planned = plan.document as Doc & { components: object };
    let compared = 0;
    let valid = 0;
    for (const op of arbitraries.operations) {
      const media = (op.requestBody as { content?: Record<string, { schema?: unknown }> } | undefined)
        ?.content?.['application/json'];
      if (!media?.schema) continue;
      const viaOneOf = withOneOf.compile({
        ...(media.schema as object),
        components: (contract.document as unknown as Doc & { components: object }).components,
      });
      const viaOption = withOption.compile({ ...(media.schema as object), components: planned.components });
      fc.assert(
        fc.property(arbitraries.requests(op, 0.5), (req) => {
          if (req.body?.kind !== 'json') return;
          let a: unknown;
          try {
            a = JSON.parse(req.body.text);
          } catch {
            return;
          }
          const b = structuredClone(a);
          const verdict = viaOneOf(a);
          expect(
            viaOption(b),
            `${op.operationId} ${req.mutation ?? 'valid'}: ${req.body.text.slice(0, 300)}`,
          ).toBe(verdict);
          expect(b).toEqual(a);
          compared++;
          if (verdict) valid++;
        }),
        { seed: 53, numRuns: 60 },
      );
    }
    expect(compared).toBeGreaterThan(300);
    expect(valid).toBeGreaterThan(100);
  });

  test('behavior: every kind of message, and a role that is none of them, get the same verdict', () => {
    const viaOneOf = requestAjv(false).compile({
      $ref: '#/components/schemas/ChatCompletionRequest',
      components: (contract.document as unknown as Doc & { components: object }).components,
    });
    const viaOption = requestAjv(true).compile({
      $ref: '#/components/schemas/ChatCompletionRequest',
      components: (plan.document as Doc & { components: object }).components,
    });
    const messages: unknown[] = [
      { role: 'system', content: 'Be brief.' },
      { role: 'developer', content: [{ type: 'text', text: 'Be brief.' }] },
      { role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] },
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }],
      },
      { role: 'tool', content: 'done', tool_call_id: 'c1' },
      { role: 'user' },
      { role: 'users', content: 'hi' },
      { role: 3, content: 'hi' },
      { content: 'hi' },
      { role: 'tool', content: 'no call id' },
      // Not objects: ajv's discriminator alone would let them through (it looks only at objects).
      0,
      'user',
      null,
      [],
    ];
    for (const message of messages) {
      const a = { model: 'm', messages: [message] };
      const b = structuredClone(a);
      expect(viaOption(b), JSON.stringify(message)).toBe(viaOneOf(a));
      expect(b).toEqual(a);
    }
  });
});

describe('follows', () => {
  const branch = (value: unknown, extra: object = {}) => ({
    type: 'object',
    required: ['kind'],
    properties: { kind: value, n: { type: 'integer' } },
    ...extra,
  });
  const documentOf = (branches: Record<string, unknown>, discriminator: object, parent: object = {}) => ({
    components: {
      schemas: {
        ...branches,
        Either: {
          oneOf: Object.keys(branches).map((name) => ({ $ref: `#/components/schemas/${name}` })),
          discriminator,
          ...parent,
        },
      },
    },
  });
  const check = (doc: ReturnType<typeof documentOf>) =>
    follows(doc, doc.components.schemas.Either as Record<string, unknown>);

  test('a tag with a string const or enum in every branch, unique, required, the mapping saying the same', () => {
    const a = branch({ const: 'a' });
    const b = branch({ enum: ['b', 'c'] });
    expect(check(documentOf({ A: a, B: b }, { propertyName: 'kind' }))).toBe(true);
    const mapping = { a: '#/components/schemas/A', c: '#/components/schemas/B' };
    expect(check(documentOf({ A: a, B: b }, { propertyName: 'kind', mapping }))).toBe(true);
    // Required by the parent instead of the branches.
    const loose = { type: 'object', properties: { kind: { const: 'a' } } };
    expect(check(documentOf({ A: loose, B: b }, { propertyName: 'kind' }, { required: ['kind'] }))).toBe(
      true,
    );
  });

  test('refused: a mapping that says otherwise, a tag ajv cannot read, shared or unrequired values, defaults', () => {
    const a = branch({ const: 'a' });
    const b = branch({ const: 'b' });
    const wrongMapping = { a: '#/components/schemas/B' };
    expect(check(documentOf({ A: a, B: b }, { propertyName: 'kind', mapping: wrongMapping }))).toBe(false);
    expect(
      check(documentOf({ A: a, B: b }, { propertyName: 'kind', mapping: { z: '#/components/schemas/A' } })),
    ).toBe(false);
    expect(check(documentOf({ A: a, B: branch({ type: 'string' }) }, { propertyName: 'kind' }))).toBe(false);
    expect(check(documentOf({ A: a, B: branch({ enum: ['a', 'b'] }) }, { propertyName: 'kind' }))).toBe(
      false,
    );
    expect(check(documentOf({ A: a, B: branch({ enum: ['b', 2] }) }, { propertyName: 'kind' }))).toBe(false);
    const unrequired = { type: 'object', properties: { kind: { const: 'b' } } };
    expect(check(documentOf({ A: a, B: unrequired }, { propertyName: 'kind' }))).toBe(false);
    expect(check(documentOf({ A: a, B: b }, { propertyName: 7 }))).toBe(false);
    // Not every branch an object schema (a number would pass it), or the parent allowing more than objects.
    const untyped = { required: ['kind'], properties: { kind: { const: 'b' } } };
    expect(check(documentOf({ A: a, B: untyped }, { propertyName: 'kind' }))).toBe(false);
    expect(check(documentOf({ A: a, B: b }, { propertyName: 'kind' }, { type: ['object', 'null'] }))).toBe(
      false,
    );
    // A default the branch would fill in once picked: refused. Under a oneOf of its own (composite): fine.
    const defaulted = branch(
      { const: 'b' },
      { properties: { kind: { const: 'b' }, n: { type: 'integer', default: 1 } } },
    );
    expect(check(documentOf({ A: a, B: defaulted }, { propertyName: 'kind' }))).toBe(false);
    const nested = branch(
      { const: 'b' },
      {
        properties: {
          kind: { const: 'b' },
          deep: { type: 'object', properties: { n: { $ref: '#/components/schemas/N' } } },
        },
      },
    );
    const docWithRef = documentOf({ A: a, B: nested }, { propertyName: 'kind' });
    (docWithRef.components.schemas as Record<string, unknown>).N = { type: 'integer', default: 3 };
    expect(check(docWithRef)).toBe(false);
    const composite = branch(
      { const: 'b' },
      {
        properties: {
          kind: { const: 'b' },
          n: { oneOf: [{ type: 'integer', default: 1 }, { type: 'string' }] },
        },
      },
    );
    expect(check(documentOf({ A: a, B: composite }, { propertyName: 'kind' }))).toBe(true);
    // A reference with siblings: ajv reads the branch's own properties, not the target's.
    const doc = documentOf({ A: a, B: b }, { propertyName: 'kind' });
    (doc.components.schemas.Either as { oneOf: object[] }).oneOf[1] = {
      $ref: '#/components/schemas/B',
      description: 'b',
    };
    expect(check(doc)).toBe(false);
  });

  test('a request body that is itself a discriminated oneOf ajv cannot follow leaves the document as it is', () => {
    const a = branch(
      { const: 'a' },
      { properties: { kind: { const: 'a' }, n: { type: 'integer', default: 1 } } },
    );
    const doc = {
      ...documentOf({ A: a, B: branch({ const: 'b' }) }, { propertyName: 'kind' }),
      paths: {
        '/x': {
          post: {
            requestBody: {
              content: { 'application/json': { schema: { $ref: '#/components/schemas/Either' } } },
            },
          },
        },
      },
    };
    const plan = planDiscriminators(doc);
    expect(plan).toMatchObject({
      document: doc,
      option: false,
      followed: [],
      left: ['#/components/schemas/Either'],
    });
    // Not a request body: its discriminator is dropped from the copy (ajv then reads the oneOf alone).
    const elsewhere = planDiscriminators({ ...doc, paths: {} });
    expect(elsewhere.option).toBe(false);
    expect(elsewhere.left).toEqual(['#/components/schemas/Either']);
  });
});
