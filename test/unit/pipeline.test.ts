/**
 * The one-layer request pipeline (server/http/pipeline.ts): steps run in order with Express's contract for
 * errors, the base-path rule matches Express's mount rule, remembered route matches are copies that
 * behave like the validator's own, and the multipart middleware is passed by only where it could never act.
 */
import type { NextFunction, Request, Response } from 'express';
import { describe, expect, test } from 'vitest';
import {
  isUnderBasePath,
  multipartOnlyWhereDeclared,
  outsideBasePath,
  pathBelowBase,
  rememberRouteMatches,
  sequence,
  underBasePath,
} from '../../server/http/pipeline.ts';
import { loadContract, resolveLocalRef } from '../../server/http/spec.ts';

type Step = (req: Request, res: Response, next: NextFunction) => unknown;
const res = {} as Response;

function run(steps: Step[], req: Partial<Request> = {}): Promise<unknown> {
  return new Promise((resolve) => {
    sequence(steps)(req as Request, res, ((error?: unknown) => resolve(error ?? 'done')) as NextFunction);
  });
}

describe('sequence', () => {
  test('runs every step in order, synchronous and asynchronous, then goes on', async () => {
    const seen: string[] = [];
    const outcome = await run([
      (_q, _s, next) => {
        seen.push('a');
        next();
      },
      (_q, _s, next) => {
        seen.push('b');
        setTimeout(next, 1);
      },
      async (_q, _s, next) => {
        await Promise.resolve();
        seen.push('c');
        next();
      },
    ]);
    expect(seen).toEqual(['a', 'b', 'c']);
    expect(outcome).toBe('done');
  });

  test('next(error), a throw and a rejected promise each stop the sequence with that error', async () => {
    const boom = new Error('boom');
    const after: string[] = [];
    const last: Step = (_q, _s, next) => {
      after.push('ran');
      next();
    };
    expect(await run([(_q, _s, next) => next(boom), last])).toBe(boom);
    expect(
      await run([
        () => {
          throw boom;
        },
        last,
      ]),
    ).toBe(boom);
    expect(await run([() => Promise.reject(boom), last])).toBe(boom);
    expect(after).toEqual([]);
  });
});

describe('the base-path rule', () => {
  test('like app.use(BASE_PATH): the prefix in any case, then a slash or the end', () => {
    expect(isUnderBasePath('/api/v1')).toBe(true);
    expect(isUnderBasePath('/api/v1/')).toBe(true);
    expect(isUnderBasePath('/api/v1/chat/completions')).toBe(true);
    expect(isUnderBasePath('/API/V1/models')).toBe(true);
    expect(isUnderBasePath('/api/v1x/models')).toBe(false);
    expect(isUnderBasePath('/api/v')).toBe(false);
    expect(isUnderBasePath('/healthz')).toBe(false);
    expect(pathBelowBase('/api/v1')).toBe('/');
    expect(pathBelowBase('/api/v1/models')).toBe('/models');
  });

  test('underBasePath skips its step elsewhere', async () => {
    const seen: string[] = [];
    const step = underBasePath((req, _s, next) => {
      seen.push(req.path);
      next();
    });
    await run([step], { path: '/healthz' });
    await run([step], { path: '/api/v1/models' });
    expect(seen).toEqual(['/api/v1/models']);
  });

  test('outsideBasePath runs its step only elsewhere, the base path matched as Express would mount it', async () => {
    const seen: string[] = [];
    const step = outsideBasePath((req, _s, next) => {
      seen.push(req.path);
      next();
    });
    for (const path of [
      '/healthz',
      '/api/v1/models',
      '/API/V1/models',
      '/api/v1',
      '/api/v10',
      '/media/video/a.mp4',
    ])
      expect(await run([step], { path })).toBe('done');
    expect(seen).toEqual(['/healthz', '/api/v10', '/media/video/a.mp4']);
  });
});

describe('rememberRouteMatches', () => {
  type Req = Request & { openapi?: { pathParams: Record<string, string>; expressRoute: string } };
  function validatorMetadata() {
    const calls: string[] = [];
    const step: Step = (req, _s, next) => {
      calls.push(req.originalUrl);
      const [, network] = /^\/api\/v1\/crypto\/rpc\/([^/?]+)/.exec(req.originalUrl) ?? [];
      if (network === 'nowhere') return next(Object.assign(new Error('not found'), { status: 404 }));
      if (network) {
        (req as Req).openapi = { expressRoute: '/api/v1/crypto/rpc/:network', pathParams: { network } };
      }
      next();
    };
    return { calls, step };
  }
  const request = (originalUrl: string, method = 'POST') => ({ originalUrl, method }) as Req;

  test('a path matched once is not matched again; each request gets its own copy', async () => {
    const { calls, step } = validatorMetadata();
    const remembered = rememberRouteMatches(step);
    const first = request('/api/v1/crypto/rpc/base-mainnet');
    const second = request('/api/v1/crypto/rpc/base-mainnet?x=1');
    const other = request('/api/v1/crypto/rpc/eth-mainnet');
    for (const req of [first, second, other]) await run([remembered], req);
    expect(calls).toEqual(['/api/v1/crypto/rpc/base-mainnet', '/api/v1/crypto/rpc/eth-mainnet']);
    expect(second.openapi).toEqual(first.openapi);
    expect(second.openapi).not.toBe(first.openapi);
    expect(second.params).toBe(second.openapi?.pathParams);
    // The validator coerces path parameters in place: one request's change is not the next one's.
    (second.openapi as { pathParams: Record<string, string> }).pathParams.network = 'changed';
    const third = request('/api/v1/crypto/rpc/base-mainnet');
    await run([remembered], third);
    expect(third.openapi?.pathParams).toEqual({ network: 'base-mainnet' });
    expect(other.openapi?.pathParams).toEqual({ network: 'eth-mainnet' });
  });

  test('errors and unmatched paths are not remembered; the method is part of the key', async () => {
    const { calls, step } = validatorMetadata();
    const remembered = rememberRouteMatches(step);
    const failure = await run([remembered], request('/api/v1/crypto/rpc/nowhere'));
    expect(failure).toMatchObject({ status: 404 });
    await run([remembered], request('/api/v1/crypto/rpc/nowhere'));
    await run([remembered], request('/elsewhere'));
    await run([remembered], request('/elsewhere'));
    await run([remembered], request('/api/v1/crypto/rpc/base-mainnet', 'POST'));
    await run([remembered], request('/api/v1/crypto/rpc/base-mainnet', 'GET'));
    expect(calls).toHaveLength(6);
  });

  test('bounded: once 2,000 paths are remembered the next one empties the cache, then is remembered alone', async () => {
    const { calls, step } = validatorMetadata();
    const remembered = rememberRouteMatches(step);
    const path = (i: number) => `/api/v1/crypto/rpc/net-${i}`;
    for (let i = 0; i < 2_000; i++) await run([remembered], request(path(i)));
    // All of them remembered: none is matched again.
    for (let i = 0; i < 2_000; i += 500) await run([remembered], request(path(i)));
    expect(calls).toHaveLength(2_000);
    await run([remembered], request(path(2_000)));
    expect(calls).toHaveLength(2_001);
    await run([remembered], request(path(2_000)));
    await run([remembered], request(path(0)));
    expect(calls.slice(2_001)).toEqual([path(0)]);
  });
});

describe('multipartOnlyWhereDeclared', () => {
  const document = {
    components: {
      schemas: {
        Upload: { type: 'string', format: 'binary' },
        Thing: { type: 'object' },
        Alias: { $ref: '#/components/schemas/Upload' },
      },
    },
  };
  const json = (schema: object) => ({ requestBody: { content: { 'application/json': { schema } } } });
  function library() {
    const handled: unknown[] = [];
    const step: Step = async (req, _s, next) => {
      handled.push((req as Request & { openapi?: { schema?: unknown } }).openapi?.schema);
      next();
    };
    return { handled, step };
  }
  const request = (schema: unknown) =>
    ({ openapi: schema === undefined ? undefined : { schema } }) as unknown as Request;

  test('operations without a multipart or binary request body go straight on, without a promise', async () => {
    const { handled, step } = library();
    const only = multipartOnlyWhereDeclared(step, document);
    for (const schema of [{}, json({ type: 'object' }), json({ $ref: '#/components/schemas/Thing' })]) {
      let went = false;
      const result = only(request(schema), res, (() => {
        went = true;
      }) as NextFunction);
      expect(result).toBeUndefined();
      expect(went).toBe(true);
    }
    expect(handled).toEqual([]);
  });

  test('a multipart body, a binary schema (inline or by reference) or what cannot be told keeps the middleware', async () => {
    const { handled, step } = library();
    const only = multipartOnlyWhereDeclared(step, document);
    const kept = [
      { requestBody: { content: { 'multipart/form-data': { schema: { type: 'object' } } } } },
      json({ type: 'string', format: 'binary' }),
      {
        requestBody: {
          content: { 'application/octet-stream': { schema: { $ref: '#/components/schemas/Upload' } } },
        },
      },
      // A reference to a reference, one to nothing, one outside the document, a request body or operation by reference.
      json({ $ref: '#/components/schemas/Alias' }),
      json({ $ref: '#/components/schemas/Missing' }),
      json({ $ref: 'other.yaml#/Thing' }),
      { requestBody: { $ref: '#/components/requestBodies/Form' } },
      { $ref: '#/paths/x' },
    ];
    for (const schema of kept) await run([only], request(schema));
    // No match at all: left to the library as before.
    await run([only], request(undefined));
    expect(handled).toEqual([...kept, undefined]);
  });

  test("each operation's answer is worked out once", async () => {
    const { handled, step } = library();
    const only = multipartOnlyWhereDeclared(step, document);
    const operation = json({ type: 'object' });
    const entries = Object.entries;
    let looked = 0;
    Object.entries = ((o: object) => {
      looked++;
      return entries(o);
    }) as typeof Object.entries;
    try {
      for (let i = 0; i < 5; i++) await run([only], request(operation));
    } finally {
      Object.entries = entries;
    }
    expect(looked).toBe(1);
    expect(handled).toEqual([]);
  });

  test("on the contract: only the transcription's multipart body keeps it; chat and the JSON-RPC proxy pass by", async () => {
    const { document: contract } = loadContract();
    const { handled, step } = library();
    const only = multipartOnlyWhereDeclared(step, contract);
    const paths = (contract as unknown as { paths: Record<string, Record<string, { operationId?: string }>> })
      .paths;
    const kept: string[] = [];
    for (const item of Object.values(paths))
      for (const operation of Object.values(item)) {
        if (!operation?.operationId) continue;
        const before = handled.length;
        await run([only], request(operation));
        if (handled.length > before) kept.push(operation.operationId);
      }
    expect(kept).toEqual(['createTranscription']);
  });
});

describe('resolveLocalRef', () => {
  const document = {
    components: {
      schemas: { Form: { type: 'object' }, 'a/b': { type: 'string' }, 'c~d': { type: 'integer' } },
    },
  };

  test('a JSON pointer into the document, its escapes read', () => {
    expect(resolveLocalRef(document, '#/components/schemas/Form')).toEqual({ type: 'object' });
    expect(resolveLocalRef(document, '#/components/schemas/a~1b')).toEqual({ type: 'string' });
    expect(resolveLocalRef(document, '#/components/schemas/c~0d')).toEqual({ type: 'integer' });
    expect(resolveLocalRef(document, '#/components')).toBe(document.components);
  });

  test("nothing for a reference that is not local, names nothing, or names what is not the document's own", () => {
    for (const ref of [
      'other.yaml#/components/schemas/Form',
      '#/components/schemas/Missing',
      '#/components/schemas/Form/type/length',
      '#/components/constructor',
      '#/__proto__',
    ])
      expect(resolveLocalRef(document, ref), ref).toBeUndefined();
  });
});
