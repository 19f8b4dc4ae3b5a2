/**
 * memoizeRouteRegexps: the validator's path-to-regexp compiles each route once, and the memoized result
 * matches exactly like a fresh compilation.
 */
import { createRequire } from 'node:module';
import { describe, expect, test } from 'vitest';
import { memoizeRouteRegexps } from '../../server/http/route-regexps.ts';

type Compiled = { regexp: RegExp; keys: { name: string }[] };
const require = createRequire(import.meta.url);
const pathToRegexpModule = () =>
  require(require.resolve('path-to-regexp', { paths: [require.resolve('express-openapi-validator')] })) as {
    pathToRegexp(path: string, options?: object): Compiled;
  };

describe('memoizeRouteRegexps', () => {
  test('the same route and options compile once; other options compile apart', () => {
    const before = pathToRegexpModule().pathToRegexp;
    const fresh = before('/api/v1/crypto/rpc/:network', { sensitive: false, strict: false });
    memoizeRouteRegexps();
    memoizeRouteRegexps(); // idempotent
    const { pathToRegexp } = pathToRegexpModule();
    expect(pathToRegexp).not.toBe(before);
    const first = pathToRegexp('/api/v1/crypto/rpc/:network', { sensitive: false, strict: false });
    const second = pathToRegexp('/api/v1/crypto/rpc/:network', { sensitive: false, strict: false });
    expect(second).toBe(first);
    expect(pathToRegexp('/api/v1/crypto/rpc/:network', { sensitive: true, strict: false })).not.toBe(first);
    expect(first.regexp.source).toBe(fresh.regexp.source);
    expect(first.regexp.flags).toBe(fresh.regexp.flags);
    expect(first.keys.map((k) => k.name)).toEqual(['network']);
    expect(first.regexp.exec('/api/v1/crypto/rpc/base-mainnet')?.[1]).toBe('base-mainnet');
    expect(first.regexp.exec('/api/v1/crypto/rpc/base-mainnet')?.[1]).toBe('base-mainnet');
    expect(first.regexp.exec('/api/v1/models')).toBeNull();
  });
});
