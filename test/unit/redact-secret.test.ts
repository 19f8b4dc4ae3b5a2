/** redactSecret: an upstream's echo of the key it was sent never survives into a message. */
import { describe, expect, test } from 'vitest';
import { redactSecret } from '../../server/providers/http.ts';

describe('redactSecret', () => {
  test('behavior: every occurrence of the key is replaced; other text and short or missing keys are untouched', () => {
    const key = 'sk-live-0123456789abcdef';
    expect(redactSecret(`Incorrect API key provided: ${key}. Key ${key} revoked`, key)).toBe(
      'Incorrect API key provided: [redacted]. Key [redacted] revoked',
    );
    expect(redactSecret('status 500', key)).toBe('status 500');
    expect(redactSecret('Incorrect API key provided: abc', undefined)).toBe(
      'Incorrect API key provided: abc',
    );
    // A key too short to be a real secret would redact ordinary words.
    expect(redactSecret('a bad request', 'bad')).toBe('a bad request');
  });
});
