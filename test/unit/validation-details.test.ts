/** toValidationDetails: field names that are also Object.prototype keys stay plain fields of the tree. */
import { describe, expect, test } from 'vitest';
import { toValidationDetails } from '../../server/http/errors.ts';

describe('toValidationDetails', () => {
  test('behavior: `valueOf`, `constructor`, `toString` and `__proto__` fields are nodes of their own', () => {
    const details = toValidationDetails(
      [
        { path: '/body/valueOf', message: 'is not allowed' },
        { path: '/body/constructor/name', message: 'must be string' },
        { path: '/body/toString', message: 'is not allowed' },
        { path: '/body/__proto__/polluted', message: 'is not allowed' },
      ],
      'Invalid request',
    );
    // Compared as JSON text: an object literal's `__proto__:` would set a prototype, not a key.
    expect(JSON.stringify(details)).toBe(
      JSON.stringify({
        _errors: [],
        valueOf: { _errors: ['is not allowed'] },
        constructor: { _errors: [], name: { _errors: ['must be string'] } },
        toString: { _errors: ['is not allowed'] },
      }).replace(/}$/, ',"__proto__":{"_errors":[],"polluted":{"_errors":["is not allowed"]}}}'),
    );
    // Nothing leaked onto the prototype.
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(Object.getPrototypeOf(details)).toBe(Object.prototype);
  });
});
