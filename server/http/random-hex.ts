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

/**
 * A request id of `bytes` bytes (7 to 256) as lowercase hex, whose first 6 bytes are the time in milliseconds
 * since 1970 (big-endian, 12 hex digits) and the rest random, as UUIDv7 lays one out: ids made later sort
 * after ids made in an earlier millisecond. The JSON-RPC proxy's `X-Request-ID` (16 bytes: 80 random bits in
 * each millisecond) is one, as README documents. It was made so for the ledger's index of request ids, where a
 * random id landed each entry on a random leaf (bench/HISTORY.md, thirty-second round); that index is gone since
 * migration 0022_refund_by_seq, and the id stays time-ordered: what callers see does not change.
 */
export function timeOrderedHex(bytes: number, nowMs: number = Date.now()): string {
  if (!Number.isInteger(bytes) || bytes < 7 || bytes > 256) {
    throw new RangeError('bytes must be an integer from 7 to 256');
  }
  return Math.trunc(nowMs).toString(16).padStart(12, '0').slice(-12) + randomHex(bytes - 6);
}
