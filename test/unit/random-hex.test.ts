import { describe, expect, test } from 'vitest';
import { randomHex, timeOrderedHex } from '../../server/http/random-hex.ts';

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

describe('timeOrderedHex', () => {
  test('behavior: the time in milliseconds in its first 12 hex digits, the rest random, never repeating', () => {
    const before = Date.now();
    const ids = Array.from({ length: 5000 }, () => timeOrderedHex(16));
    const after = Date.now();
    expect(new Set(ids).size).toBe(5000);
    for (const id of ids) {
      expect(id).toMatch(/^[0-9a-f]{32}$/);
      const ms = Number.parseInt(id.slice(0, 12), 16);
      expect(ms).toBeGreaterThanOrEqual(before);
      expect(ms).toBeLessThanOrEqual(after);
    }
    // Most of the 5,000 share a millisecond: their random parts still differ.
    expect(new Set(ids.map((id) => id.slice(12))).size).toBe(5000);
    expect(timeOrderedHex(8, 0x123456789ab)).toMatch(/^0123456789ab[0-9a-f]{4}$/);
  });

  test('behavior: an id of a later millisecond sorts after every id of an earlier one, as text', () => {
    const t = 1_795_000_000_000;
    const earlier = Array.from({ length: 200 }, () => timeOrderedHex(16, t));
    const later = Array.from({ length: 200 }, () => timeOrderedHex(16, t + 1));
    for (const a of earlier) for (const b of later) expect(a < b).toBe(true);
    // A thousand years on, still 12 digits, still after.
    expect(timeOrderedHex(16, t + 1000 * 365 * 86_400_000) > String(later[0])).toBe(true);
  });

  test('behavior: a length outside 7 to 256 is refused', () => {
    for (const bad of [6, 0, 1.5, 257]) expect(() => timeOrderedHex(bad)).toThrow(RangeError);
  });
});
