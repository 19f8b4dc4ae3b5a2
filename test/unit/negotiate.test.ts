import { describe, expect, test } from 'vitest';
import { preferredMediaType } from '../../server/http/negotiate.ts';

const offered = ['application/json', 'text/csv'];

describe('content negotiation', () => {
  test.each([
    [undefined, 'application/json'],
    ['', 'application/json'],
    ['application/json', 'application/json'],
    ['text/csv', 'text/csv'],
    ['application/json, text/csv', 'application/json'],
    ['text/csv, application/json', 'application/json'],
    ['text/csv, application/json;q=0.5', 'text/csv'],
    ['text/*', 'text/csv'],
    ['*/*', 'application/json'],
    ['*/*;q=0.1, text/csv', 'text/csv'],
    ['text/csv;q=0, */*', 'application/json'],
    ['image/png', undefined],
  ])('behavior: Accept %j chooses %s', (accept, expected) => {
    expect(preferredMediaType(accept, offered)).toBe(expected);
  });
});
