/**
 * The money formats of server/money.ts at their edges: the fixed-point decimals the balance headers send
 * (`formatUsdFixed`, rounded half away from zero, its powers of ten read from a table) and the exact
 * shortest form with its parse.
 */
import { describe, expect, test } from 'vitest';
import { formatNanoUsd, formatUsdFixed, parseUsdToNano } from '../../server/money.ts';

describe('formatUsdFixed', () => {
  test('behavior: every number of decimals from 0 to 9, rounded half away from zero', () => {
    const nano = 1_234_567_891n; // 1.234567891 USD
    expect(Array.from({ length: 10 }, (_, decimals) => formatUsdFixed(nano, decimals))).toEqual([
      '1',
      '1.2',
      '1.23',
      '1.235',
      '1.2346',
      '1.23457',
      '1.234568',
      '1.2345679',
      '1.23456789',
      '1.234567891',
    ]);
    expect(formatUsdFixed(5n, 8)).toBe('0.00000001');
    expect(formatUsdFixed(4n, 8)).toBe('0.00000000');
    expect(formatUsdFixed(-5n, 8)).toBe('-0.00000001');
    expect(formatUsdFixed(-4n, 8)).toBe('0.00000000');
    expect(formatUsdFixed(50n * 10n ** 9n, 8)).toBe('50.00000000');
    expect(formatUsdFixed(2n ** 70n, 2)).toBe('1180591620717.41');
  });

  test('edge: decimals outside 0 to 9, or not whole, are refused', () => {
    for (const decimals of [-1, 10, 2.5, Number.NaN]) {
      expect(() => formatUsdFixed(1n, decimals)).toThrow(RangeError);
    }
  });
});

test('behavior: the shortest exact form parses back to the same nano-USD (parsing takes no sign)', () => {
  for (const nano of [0n, 1n, 700_000_000n, 1_234_567_891n, 2n ** 62n]) {
    expect(parseUsdToNano(formatNanoUsd(nano))).toBe(nano);
  }
  expect(formatNanoUsd(700_000_000n)).toBe('0.7');
  expect(formatNanoUsd(-5n)).toBe('-0.000000005');
  expect(() => parseUsdToNano('-0.000000005')).toThrow(RangeError);
});
