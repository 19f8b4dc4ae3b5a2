/**
 * The signature checks of a sign-in, answered as the libraries the verifier used before answer them, at a
 * fraction of their CPU. Every wallet-paid request carries a freshly signed proof, so a check runs once per
 * request, on the event loop: it is a hot path.
 *
 * - **EVM (EIP-191 `personal_sign`).** viem's `verifyMessage` recovers the signer with noble's pure-JavaScript
 *   secp256k1, about 1.5 ms of CPU here. `isEoaSignature` recovers it with libsecp256k1 compiled to
 *   WebAssembly (`tiny-secp256k1`), about 0.27 ms, with viem's rules: 65 bytes `r ‖ s ‖ v`, `v` one of 0, 1, 27,
 *   28, `r` and `s` in [1, n), high `s` accepted (recovery does not enforce low `s`). The rare forms that are
 *   not 132 hex characters go to viem itself, so every input gets viem's answer
 *   (test/unit/wallet-signatures.test.ts compares the two).
 * - **Solana (ed25519).** `verifySolanaSignature` of `@x402/extensions` checks with tweetnacl's JavaScript,
 *   about 25 ms of CPU here: one Solana request stalled every other request of the process for that long.
 *   `isEd25519Signature` checks with node:crypto (OpenSSL), about 0.08 ms, after the same refusal of keys of
 *   small order (noble, RFC 8032 decoding; done once per key, then the key is kept). One difference, on
 *   purpose: OpenSSL follows RFC 8032 and refuses a signature whose `S` is not below the group order, which
 *   tweetnacl accepts (the same signature with `S + L`: a malleated copy no signer produces).
 */
import { createPublicKey, type KeyObject, verify } from 'node:crypto';
import { ed25519 } from '@noble/curves/ed25519';
import { recover } from 'tiny-secp256k1';
import { hashMessage, hexToBytes, keccak256, verifyMessage } from 'viem';

/** v of a 65-byte signature to its recovery bit, as viem reads it; undefined for any other value. */
function recoveryBit(v: number): 0 | 1 | undefined {
  if (v === 0 || v === 27) return 0;
  if (v === 1 || v === 28) return 1;
  return undefined;
}

/**
 * Whether the EIP-191 signature of `message` was made by the key of `address` (an EOA): viem's
 * `verifyMessage({address, message, signature})`, answered by libsecp256k1 for 65-byte signatures.
 */
export async function isEoaSignature(
  address: `0x${string}`,
  message: string,
  signature: `0x${string}`,
): Promise<boolean> {
  if (signature.length !== 132) {
    return verifyMessage({ address, message, signature }).catch(() => false);
  }
  const bit = recoveryBit(Number.parseInt(signature.slice(130), 16));
  if (bit === undefined) return false;
  let publicKey: Uint8Array | null;
  try {
    publicKey = recover(hexToBytes(hashMessage(message)), hexToBytes(signature).subarray(0, 64), bit, false);
  } catch {
    // r or s zero or not below n, or r not the x of a point: viem's recovery throws on the same.
    return false;
  }
  if (!publicKey) return false;
  return keccak256(publicKey.subarray(1)).slice(-40) === address.slice(2).toLowerCase();
}

/** DER prefix of an Ed25519 SubjectPublicKeyInfo: the 32 bytes of the key follow it (RFC 8410). */
const ED25519_SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

/** Keys already decoded (base64 of their 32 bytes): OpenSSL's key, or null for one refused. */
const ed25519Keys = new Map<string, KeyObject | null>();
/** How many keys `ed25519Keys` holds at most; the oldest entry goes first. */
const ED25519_KEY_CACHE_SIZE = 10_000;

/** OpenSSL's key for the 32 bytes of an Ed25519 public key; null when it is not a point or of small order. */
function ed25519Key(publicKey: Uint8Array): KeyObject | null {
  const id = Buffer.from(publicKey).toString('base64');
  const known = ed25519Keys.get(id);
  if (known !== undefined) return known;
  let key: KeyObject | null = null;
  try {
    // RFC 8032 decoding (zip215 off), and no point of small order: with one (the identity, say), the
    // signature (R = identity, S = 0) verifies for any message, in OpenSSL as in tweetnacl.
    if (!ed25519.ExtendedPoint.fromHex(publicKey).isSmallOrder()) {
      key = createPublicKey({
        key: Buffer.concat([ED25519_SPKI_PREFIX, publicKey]),
        format: 'der',
        type: 'spki',
      });
    }
  } catch {
    key = null;
  }
  if (ed25519Keys.size >= ED25519_KEY_CACHE_SIZE) {
    const oldest = ed25519Keys.keys().next().value;
    if (oldest !== undefined) ed25519Keys.delete(oldest);
  }
  ed25519Keys.set(id, key);
  return key;
}

/**
 * Whether `signature` (64 bytes) is the Ed25519 signature of the UTF-8 `message` by `publicKey` (32 bytes):
 * `verifySolanaSignature` of `@x402/extensions`, by OpenSSL (see the module's comment for the one difference).
 */
export function isEd25519Signature(message: string, signature: Uint8Array, publicKey: Uint8Array): boolean {
  if (publicKey.length !== 32 || signature.length !== 64) return false;
  const key = ed25519Key(publicKey);
  if (!key) return false;
  return verify(null, Buffer.from(message, 'utf8'), key, signature);
}
