/**
 * express-openapi-validator matches each request by compiling `pathToRegexp` for every route of the spec,
 * on every request, until one matches: with this contract's ~90 routes that is the largest per-request
 * cost of the validator. `memoizeRouteRegexps()` makes the compilation happen once per (route, options): the
 * validator's `path-to-regexp` module gets a memoized `pathToRegexp`. The result is the same object each
 * time; it is safe to share because its regexp has no global or sticky flag (exec keeps no state) and
 * nothing mutates it. Idempotent.
 */
import { createRequire } from 'node:module';

type PathToRegexp = (path: unknown, options?: Record<string, unknown>) => { regexp: RegExp; keys: unknown[] };

const MEMOIZED = Symbol.for('service-api.memoizedPathToRegexp');
const MAX_ENTRIES = 10_000;

export function memoizeRouteRegexps(): void {
  const require = createRequire(import.meta.url);
  const modulePath = require.resolve('path-to-regexp', {
    paths: [require.resolve('express-openapi-validator')],
  });
  const module = require(modulePath) as { pathToRegexp: PathToRegexp & { [MEMOIZED]?: true } };
  if (module.pathToRegexp[MEMOIZED]) return;
  const original = module.pathToRegexp;
  const cache = new Map<string, ReturnType<PathToRegexp>>();
  const memoized = Object.assign(
    (path: unknown, options: Record<string, unknown> = {}) => {
      if (typeof path !== 'string') return original(path, options);
      const key = `${path}\u0000${optionsKey(options)}`;
      let result = cache.get(key);
      if (!result) {
        result = original(path, options);
        if (result.regexp.global || result.regexp.sticky) return result;
        if (cache.size >= MAX_ENTRIES) cache.clear();
        cache.set(key, result);
      }
      return result;
    },
    { [MEMOIZED]: true as const },
  );
  module.pathToRegexp = memoized;
}

/** The validator passes `{ sensitive, strict }` for every route of every request: keyed without JSON. */
function optionsKey(options: Record<string, unknown>): string {
  const keys = Object.keys(options);
  if (keys.length === 2 && 'sensitive' in options && 'strict' in options) {
    return `s${options.sensitive ? 1 : 0}t${options.strict ? 1 : 0}`;
  }
  return JSON.stringify(options);
}
