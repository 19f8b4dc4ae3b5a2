/** The JSON nesting bound: exact at the limit, iterative (no stack overflow) far beyond it. */
import { describe, expect, test } from 'vitest';
import { exceedsDepth, MAX_JSON_DEPTH } from '../../server/http/json-depth.ts';

const nested = (depth: number, kind: 'array' | 'object') => {
  let value: unknown = 1;
  for (let i = 0; i < depth; i++) value = kind === 'array' ? [value] : { a: value };
  return value;
};

describe('exceedsDepth', () => {
  test('behavior: scalars and shallow values pass; the limit itself passes, one more level does not', () => {
    for (const scalar of [null, 1, 'x', true]) expect(exceedsDepth(scalar)).toBe(false);
    for (const kind of ['array', 'object'] as const) {
      expect(exceedsDepth(nested(MAX_JSON_DEPTH, kind))).toBe(false);
      expect(exceedsDepth(nested(MAX_JSON_DEPTH + 1, kind))).toBe(true);
    }
    expect(exceedsDepth({ a: [{ b: [1] }] }, 4)).toBe(false);
    expect(exceedsDepth({ a: [{ b: [[1]] }] }, 4)).toBe(true);
  });

  test('behavior: 100k levels are measured without recursion', () => {
    expect(exceedsDepth(nested(100_000, 'array'))).toBe(true);
    expect(exceedsDepth(nested(100_000, 'object'))).toBe(true);
    // A wide value is not deep.
    expect(exceedsDepth(Array.from({ length: 100_000 }, () => ({ a: 1 })))).toBe(false);
  });
});
