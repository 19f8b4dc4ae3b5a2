/**
 * Exact money. Inside, every amount is an integer number of nano-USD (1e-9 USD) held in a bigint; decimals
 * exist only at the edges: configuration and catalogue files (strings) and JSON bodies and headers.
 */

/** Nano-USD per USD. */
export const NANO_PER_USD = 1_000_000_000n;

const DECIMAL = /^(0|[1-9][0-9]*)(?:\.([0-9]{1,9}))?$/;

/**
 * Parses a plain decimal USD amount (`'0.7'`, `'12'`, `'0.000000001'`) into nano-USD without any floating
 * point. Refuses negatives, exponents, signs, whitespace, leading zeros, a bare or trailing dot and more than
 * nine decimal places (finer than one nano-USD).
 */
export function parseUsdToNano(decimal: string): bigint {
  if (typeof decimal !== 'string') throw new TypeError('A USD amount must be a string');
  const match = DECIMAL.exec(decimal);
  if (!match) {
    const finer = /^(0|[1-9][0-9]*)\.[0-9]{10,}$/.test(decimal);
    throw new RangeError(
      finer
        ? `USD amount '${decimal}' has more than 9 decimal places (the unit is 1e-9 USD)`
        : `USD amount '${decimal}' is not a plain non-negative decimal such as '0.7'`,
    );
  }
  const whole = BigInt(match[1] ?? '0');
  const fraction = BigInt((match[2] ?? '').padEnd(9, '0'));
  return whole * NANO_PER_USD + fraction;
}

/** Formats nano-USD as the shortest exact decimal string (`700000000n` -> `'0.7'`, `-5n` -> `'-0.000000005'`). */
export function formatNanoUsd(nano: bigint): string {
  const sign = nano < 0n ? '-' : '';
  const abs = nano < 0n ? -nano : nano;
  const whole = abs / NANO_PER_USD;
  const fraction = (abs % NANO_PER_USD).toString().padStart(9, '0').replace(/0+$/, '');
  return fraction ? `${sign}${whole}.${fraction}` : `${sign}${whole}`;
}

/**
 * Nano-USD as a JSON number, for response bodies only. Going through the exact decimal string gives the
 * double closest to the true amount (`Number('0.7')`), which plain division would not always do.
 */
export function nanoToUsdNumber(nano: bigint): number {
  return Number(formatNanoUsd(nano));
}

/**
 * A USD JSON number from a request (a spend limit, a top-up amount) as nano-USD. `toFixed(9)` gives the
 * decimal the client wrote for any amount with at most 9 decimals; finer amounts are rounded to the nano.
 */
export function usdNumberToNano(usd: number): bigint {
  if (!Number.isFinite(usd) || usd < 0 || usd > 9_000_000_000)
    throw new RangeError(`USD amount ${usd} is out of range`);
  return parseUsdToNano(usd.toFixed(9).replace(/\.?0+$/, '') || '0');
}

/** 10^0 to 10^9 as bigints: an exponentiation of bigints goes through V8's runtime on every call. */
const POWERS_OF_TEN = Array.from({ length: 10 }, (_, exponent) => 10n ** BigInt(exponent));

/** Nano-USD as a fixed-point decimal string, rounded half away from zero (`formatUsdFixed(12_345n, 4)`). */
export function formatUsdFixed(nano: bigint, decimals: number): string {
  if (!Number.isInteger(decimals) || decimals < 0 || decimals > 9) {
    throw new RangeError('decimals must be 0 to 9');
  }
  const step = POWERS_OF_TEN[9 - decimals] as bigint;
  const negative = nano < 0n;
  const abs = negative ? -nano : nano;
  const rounded = (abs + step / 2n) / step;
  const scale = POWERS_OF_TEN[decimals] as bigint;
  const whole = rounded / scale;
  const fraction = decimals === 0 ? '' : `.${(rounded % scale).toString().padStart(decimals, '0')}`;
  return `${negative && rounded !== 0n ? '-' : ''}${whole}${fraction}`;
}
