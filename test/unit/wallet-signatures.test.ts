/**
 * The fast signature checks of a sign-in (server/domains/wallet/signatures.ts) answer as the library checks
 * they replaced: `isEoaSignature` as viem's `verifyMessage` for every signature form (valid, `v` as 0/1 or
 * 27/28, high `s`, out-of-range `r`/`s`, other `v`s, other lengths, garbage), `isEd25519Signature` as
 * `verifySolanaSignature` of `@x402/extensions` except for a malleated `S` (RFC 8032), and both refuse what
 * must be refused (another signer, another message, a key of small order).
 */
import { generateKeyPairSync, sign } from 'node:crypto';
import { verifySolanaSignature } from '@x402/extensions/sign-in-with-x';
import fc from 'fast-check';
import { bytesToHex, hexToBytes, verifyMessage } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { describe, expect, test } from 'vitest';
import { isEd25519Signature, isEoaSignature } from '../../server/domains/wallet/signatures.ts';

const N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
const L = 2n ** 252n + 27742317777372353535851937790883648493n;

const hex32 = (value: bigint) => value.toString(16).padStart(64, '0');

/** A signature with `r`, `s` and `v` replaced where given. */
function withParts(signature: `0x${string}`, parts: { r?: bigint; s?: bigint; v?: number }): `0x${string}` {
  const r = parts.r === undefined ? signature.slice(2, 66) : hex32(parts.r);
  const s = parts.s === undefined ? signature.slice(66, 130) : hex32(parts.s);
  const v = parts.v === undefined ? signature.slice(130) : parts.v.toString(16).padStart(2, '0');
  return `0x${r}${s}${v}`;
}

/** The same signature with the other `s` ((r, n - s) and the other recovery bit): valid for the same key. */
function twin(signature: `0x${string}`): `0x${string}` {
  const s = BigInt(`0x${signature.slice(66, 130)}`);
  return withParts(signature, { s: N - s, v: signature.endsWith('1b') ? 28 : 27 });
}

async function agree(address: `0x${string}`, message: string, signature: `0x${string}`): Promise<boolean> {
  const expected = await verifyMessage({ address, message, signature }).catch(() => false);
  const actual = await isEoaSignature(address, message, signature);
  expect(actual, `signature ${signature}`).toBe(expected);
  return actual;
}

describe('isEoaSignature answers as viem verifyMessage', () => {
  const account = privateKeyToAccount(generatePrivateKey());
  const other = privateKeyToAccount(generatePrivateKey());
  const message = 'api.example.test wants you to sign in with your Ethereum account: ünïcode ✓';

  test('behavior: a valid signature, v as 27/28 or 0/1, and high s are accepted', async () => {
    const signature = await account.signMessage({ message });
    expect(await agree(account.address, message, signature)).toBe(true);
    // v as the bare recovery bit, 0 and 1 (the signature and its twin have one each).
    for (const form of [signature, twin(signature)]) {
      const v = Number.parseInt(form.slice(130), 16);
      expect(await agree(account.address, message, withParts(form, { v: v - 27 }))).toBe(true);
    }
    // (r, n - s) with the other recovery bit recovers the same key: recovery does not enforce low s.
    expect(await agree(account.address, message, twin(signature))).toBe(true);
    // The lowercase address and the checksummed one are the same signer.
    expect(await isEoaSignature(account.address.toLowerCase() as `0x${string}`, message, signature)).toBe(
      true,
    );
  });

  test('behavior: another signer, another message and a flipped recovery bit are refused', async () => {
    const signature = await account.signMessage({ message });
    expect(await agree(other.address, message, signature)).toBe(false);
    expect(await agree(account.address, `${message}.`, signature)).toBe(false);
    const v = Number.parseInt(signature.slice(130), 16);
    expect(await agree(account.address, message, withParts(signature, { v: v === 27 ? 28 : 27 }))).toBe(
      false,
    );
  });

  test('behavior: out-of-range r and s, other v values and other lengths get viem’s answer', async () => {
    const signature = await account.signMessage({ message });
    const variants: Array<`0x${string}`> = [
      withParts(signature, { r: 0n }),
      withParts(signature, { s: 0n }),
      withParts(signature, { r: N }),
      withParts(signature, { s: N }),
      withParts(signature, { r: N + 1n }),
      withParts(signature, { r: 2n ** 256n - 1n }),
      // x = 5 is not the x of a point of secp256k1 (5^3 + 7 = 132 is not a square mod p).
      withParts(signature, { r: 5n }),
      // Each other v on the signature and on its high-s twin: one of the two has recovery bit 0, the other 1.
      ...[2, 26, 29, 30, 35, 36, 37, 38, 255].flatMap((v) => [
        withParts(signature, { v }),
        withParts(twin(signature), { v }),
      ]),
      // 131 characters: viem reads a one-digit v; 130: a 64-byte signature; longer: a wrapped one.
      `0x${signature.slice(2, 130)}1`,
      `0x${signature.slice(2, 130)}0`,
      `0x${signature.slice(2, 130)}`,
      `${signature}00`,
      '0x',
      '0x1b',
    ];
    for (const variant of variants) await agree(account.address, message, variant);
  });

  test('property: random signatures and random changes of valid ones get viem’s answer', async () => {
    const signature = await account.signMessage({ message });
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          fc.uint8Array({ minLength: 65, maxLength: 65 }).map((bytes) => bytesToHex(bytes)),
          fc
            .record({ at: fc.integer({ min: 0, max: 64 }), xor: fc.integer({ min: 1, max: 255 }) })
            .map(({ at, xor }) => {
              const bytes = hexToBytes(signature);
              bytes[at] = (bytes[at] ?? 0) ^ xor;
              return bytesToHex(bytes);
            }),
        ),
        async (candidate) => {
          await agree(account.address, message, candidate);
        },
      ),
      { numRuns: 200 },
    );
  });
});

describe('isEd25519Signature answers as verifySolanaSignature', () => {
  const pair = generateKeyPairSync('ed25519');
  const publicKey = new Uint8Array(
    Buffer.from(pair.publicKey.export({ format: 'jwk' }).x ?? '', 'base64url'),
  );
  const message = 'api.example.test wants you to sign in with your Solana account: ünïcode ✓';
  const signature = new Uint8Array(sign(null, Buffer.from(message, 'utf8'), pair.privateKey));

  function agreeEd(text: string, sig: Uint8Array, key: Uint8Array): boolean {
    const actual = isEd25519Signature(text, sig, key);
    expect(actual).toBe(verifySolanaSignature(text, sig, key));
    return actual;
  }

  test('behavior: a valid signature is accepted, twice (the second from the kept key)', () => {
    expect(agreeEd(message, signature, publicKey)).toBe(true);
    expect(agreeEd(message, signature, publicKey)).toBe(true);
  });

  test('behavior: another message, another key and a changed signature are refused', () => {
    expect(agreeEd(`${message}.`, signature, publicKey)).toBe(false);
    const other = generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }).x ?? '';
    expect(agreeEd(message, signature, new Uint8Array(Buffer.from(other, 'base64url')))).toBe(false);
    for (const at of [0, 31, 32, 63]) {
      const changed = Uint8Array.from(signature);
      changed[at] = (changed[at] ?? 0) ^ 1;
      expect(agreeEd(message, changed, publicKey)).toBe(false);
    }
  });

  test('behavior: a key of small order is refused: (R = identity, S = 0) would verify any message', () => {
    const identity = new Uint8Array(32);
    identity[0] = 1;
    const forged = new Uint8Array(64);
    forged[0] = 1;
    expect(agreeEd('anything at all', forged, identity)).toBe(false);
    expect(agreeEd('anything at all', forged, identity)).toBe(false);
  });

  test('behavior: bytes that are no point, and wrong lengths, are refused', () => {
    // y = 2^255 - 1 is not below p: RFC 8032 decoding refuses it.
    const notCanonical = new Uint8Array(32).fill(0xff);
    notCanonical[31] = 0x7f;
    expect(agreeEd(message, signature, notCanonical)).toBe(false);
    expect(isEd25519Signature(message, signature.subarray(0, 63), publicKey)).toBe(false);
    expect(isEd25519Signature(message, signature, publicKey.subarray(0, 31))).toBe(false);
  });

  test('behavior: the one difference: S + L (a malleated copy) is refused, as RFC 8032 says; tweetnacl accepts it', () => {
    let s = 0n;
    for (let i = 63; i >= 32; i--) s = (s << 8n) | BigInt(signature[i] ?? 0);
    const malleated = Uint8Array.from(signature);
    let t = s + L;
    for (let i = 32; i < 64; i++) {
      malleated[i] = Number(t & 0xffn);
      t >>= 8n;
    }
    expect(verifySolanaSignature(message, malleated, publicKey)).toBe(true);
    expect(isEd25519Signature(message, malleated, publicKey)).toBe(false);
  });
});
