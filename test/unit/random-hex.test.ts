import { describe, expect, test } from 'vitest';
import { randomHex } from '../../server/http/random-hex.ts';

describe('randomHex', () => {
  test('behavior: lowercase hex of the asked length, never repeating, across pool refills', () => {
    const seen = new Set<string>();
    // 3,000 ids of 8 bytes and 500 of 16: several 4 KiB refills, odd offsets included.
    for (let i = 0; i < 3000; i++) seen.add(randomHex(8));
    for (let i = 0; i < 500; i++) {
      const id = randomHex(16);
      expect(id).toMatch(/^[0-9a-f]{32}$/);
      seen.add(id);
    }
    expect(seen.size).toBe(3500);
    for (const id of [...seen].slice(0, 3000)) expect(id).toMatch(/^[0-9a-f]{16}$/);
  });

  test('behavior: the bytes are spread evenly (each hex digit about 1/16 of the text)', () => {
    const text = Array.from({ length: 2000 }, () => randomHex(32)).join('');
    const counts = new Map<string, number>();
    for (const c of text) counts.set(c, (counts.get(c) ?? 0) + 1);
    expect(counts.size).toBe(16);
    // 128,000 digits: 8,000 expected each; a biased or stuck pool would be far off.
    for (const n of counts.values()) expect(Math.abs(n - 8000)).toBeLessThan(600);
  });

  test('behavior: a length outside 1 to 256 is refused', () => {
    for (const bad of [0, -1, 1.5, 257]) expect(() => randomHex(bad)).toThrow(RangeError);
  });
});
