/**
 * Deterministic randomness for the embedded engines: the same seed gives the same sequence on every platform,
 * so a request with a seed is reproducible byte for byte.
 */

/** mulberry32: a small, fast 32-bit generator of numbers in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
