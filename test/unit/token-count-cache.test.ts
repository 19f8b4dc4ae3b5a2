/**
 * The bounded cache of prompt-text token counts: a remembered count is exactly the tokenizer's count, and the
 * cache never holds more texts or bytes than its limits (least recently used out first; oversized texts are
 * counted but never kept). `decodeToken` gives what `decodeTokens([token])` gives.
 */
import { describe, expect, test } from 'vitest';
import {
  countPromptTextTokens,
  countTokens,
  createTokenCountCache,
  decodeToken,
  decodeTokens,
  encodeText,
} from '../../server/providers/chat/tokenizer.ts';

const TEXTS = [
  'Say hello to the benchmark.',
  'Résumé: naïve café — 東京 🎉🚀',
  '<|endoftext|> is plain text here',
  'a'.repeat(500),
  ' '.repeat(37),
  'function f(x) {\n  return x * 2;\n}\n',
];

describe('token count cache', () => {
  test('a remembered count is the tokenizer count, also on the second and later reads', () => {
    const cache = createTokenCountCache({ entries: 100, bytes: 1 << 20, maxTextBytes: 1 << 16 });
    for (let round = 0; round < 3; round++)
      for (const text of TEXTS) {
        expect(cache.count(text)).toBe(encodeText(text).length);
        expect(countTokens(text)).toBe(encodeText(text).length);
        expect(countPromptTextTokens(text)).toBe(encodeText(text).length);
      }
    expect(cache.count('')).toBe(0);
    expect(cache.size().entries).toBe(TEXTS.length);
  });

  test('bounded by entries: the least recently used text goes first', () => {
    const cache = createTokenCountCache({ entries: 3, bytes: 1 << 20, maxTextBytes: 1 << 16 });
    cache.count('one');
    cache.count('two');
    cache.count('three');
    cache.count('one'); // now the most recent
    cache.count('four'); // evicts `two`
    expect(cache.size().entries).toBe(3);
    expect(cache.size().bytes).toBe(('one'.length + 'three'.length + 'four'.length) * 2);
    cache.count('five'); // evicts `three`
    expect(cache.size().bytes).toBe(('one'.length + 'four'.length + 'five'.length) * 2);
  });

  test('bounded by bytes, and oversized texts are never kept', () => {
    const cache = createTokenCountCache({ entries: 1000, bytes: 400, maxTextBytes: 300 });
    const big = 'x'.repeat(151); // 302 bytes: over maxTextBytes
    expect(cache.count(big)).toBe(encodeText(big).length);
    expect(cache.size()).toEqual({ entries: 0, bytes: 0 });
    for (let i = 0; i < 50; i++) {
      const text = `text number ${i} ${'y'.repeat(40)}`;
      expect(cache.count(text)).toBe(encodeText(text).length);
      expect(cache.size().bytes).toBeLessThanOrEqual(400);
    }
    expect(cache.size().entries).toBeLessThan(50);
    expect(cache.size().entries).toBeGreaterThan(0);
  });

  test('decodeToken: a text token is decodeTokens of it; parts of characters still join up in order', () => {
    for (const token of encodeText('Hello world, the answer: 42 <|endoftext|> {"a":1}'))
      expect(decodeToken(token)).toBe(decodeTokens([token]));
    // Byte tokens go through the library's streaming decoder, which carries partial characters over.
    const text = 'wörld 東京 🎉🚀 ok';
    expect(
      encodeText(text)
        .map((token) => decodeToken(token))
        .join(''),
    ).toBe(text);
  });
});
