/**
 * Random hex strings for request ids, drawn from a pool that one `randomFillSync` refills every 4 KiB:
 * `randomBytes(8)` per request was a call into the crypto binding and a fresh buffer each time, about 1% of a
 * loaded server's CPU. Same generator (the operating system's CSPRNG), fewer calls.
 */
import { randomFillSync } from 'node:crypto';

const POOL_BYTES = 4096;
const pool = Buffer.allocUnsafe(POOL_BYTES);
let offset = POOL_BYTES;

/** `bytes` random bytes (1 to 256) as lowercase hex. */
export function randomHex(bytes: number): string {
  if (!Number.isInteger(bytes) || bytes < 1 || bytes > 256) {
    throw new RangeError('bytes must be an integer from 1 to 256');
  }
  if (offset + bytes > POOL_BYTES) {
    randomFillSync(pool);
    offset = 0;
  }
  const text = pool.toString('hex', offset, offset + bytes);
  offset += bytes;
  return text;
}
