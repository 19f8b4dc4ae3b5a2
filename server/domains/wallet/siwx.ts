/**
 * Sign-In-With-X verification: turns a `SIGN-IN-WITH-X` header into the wallet that signed it, or a 401 with
 * an `X402_SIGN_IN_…` code.
 *
 * Two payload shapes are accepted (both base64 JSON):
 * - the interface's `{address, message, signature, timestamp, chainId, type?}`, where `message` is the signed
 *   text (EIP-4361 on EVM, the Solana sign-in message on Solana);
 * - the x402 extension's `{domain, address, uri, version, chainId, type, nonce, issuedAt, …, signature}` sent by
 *   stock `@x402/*` clients, from which the signed text is rebuilt exactly as those clients build it.
 *
 * Both become one normalised proof, then the same rules apply: the message's domain and URI are the
 * configured public origin (never a request header); the chain is Base (8453) or Solana mainnet; `issuedAt` is
 * at most `maxAgeMs` old and at most `clockSkewMs` in the future; `expirationTime` and `notBefore` are
 * honoured; the signature is checked (EVM EOAs offline, smart wallets through the Base RPC with EIP-1271 /
 * EIP-6492; Solana ed25519 with a base58 or base64 signature; signatures.ts does the offline checks fast);
 * and only then is the nonce consumed, once per wallet, atomically in the shared database, so that a bad
 * signature cannot burn someone's nonce.
 */
import { createSIWxMessage, decodeBase58 } from '@x402/extensions/sign-in-with-x';
import { BaseError, getAddress, HttpRequestError, isAddress, isHex, TimeoutError } from 'viem';
import { parseSiweMessage } from 'viem/siwe';
import { z } from 'zod';
import { ApiError } from '../../http/errors.ts';
import { normalizeWalletAddress } from '../../storage/accounts.ts';
import { BASE_NETWORK, SOLANA_NETWORK } from './discovery.ts';
import { isEd25519Signature, isEoaSignature } from './signatures.ts';

/** Oldest `issuedAt` accepted (the challenge lifetime). */
export const SIWX_MAX_AGE_MS = 5 * 60_000;
/** Tolerated clock difference between the wallet and the server, for `issuedAt`, `notBefore` and `timestamp`. */
export const SIWX_CLOCK_SKEW_MS = 30_000;

const SOLANA_REFERENCE = SOLANA_NETWORK.slice('solana:'.length);

export type SiwxCode =
  | 'INVALID_PAYLOAD'
  | 'PARSE_ERROR'
  | 'INVALID_MESSAGE'
  | 'ADDRESS_MISMATCH'
  | 'INVALID_CHAIN_ID'
  | 'CHAIN_MISMATCH'
  | 'UNSUPPORTED_CHAIN'
  | 'MISSING_NONCE'
  | 'DOMAIN_MISMATCH'
  | 'TIMESTAMP_MISMATCH'
  | 'EXPIRED'
  | 'FUTURE_TIMESTAMP'
  | 'NOT_BEFORE'
  | 'INVALID_SIGNATURE'
  | 'INVALID_WALLET'
  | 'NONCE_REUSED'
  | 'FACTORY_NOT_ALLOWED'
  | 'VERIFIER_UNAVAILABLE';

/** A refused proof: 401 with `code: X402_SIGN_IN_<code>`. */
export function signInError(code: SiwxCode, message: string, cause?: unknown): ApiError {
  return new ApiError(401, message, { code: `X402_SIGN_IN_${code}`, cause });
}

/** The wallet a valid proof identifies. */
export type VerifiedSignIn = {
  kind: 'evm' | 'solana';
  /** As signed (EIP-55 checksummed on EVM). */
  address: string;
  /** Canonical form for storage and comparison (EVM lowercased). */
  normalizedAddress: string;
  nonce: string;
};

/**
 * Checks a signature that offline ECDSA recovery did not accept (EIP-1271 / EIP-6492 smart wallets);
 * `factory-not-allowed` for a counterfactual wallet whose ERC-6492 factory is not trusted.
 */
export type EvmSmartWalletVerifier = (args: {
  address: `0x${string}`;
  message: string;
  signature: `0x${string}`;
}) => Promise<'valid' | 'invalid' | 'factory-not-allowed'>;

export type SiwxVerifierDeps = {
  publicOrigin: string;
  /** Atomically records a nonce for a wallet; false when it was used before. */
  consumeNonce(input: { address: string; nonce: string; expiresAtMs: number }): Promise<boolean>;
  /** Smart-wallet verification through the Base RPC; without it only EOAs are accepted. */
  smartWalletVerifier?: EvmSmartWalletVerifier | undefined;
  now?: () => number;
  maxAgeMs?: number;
  clockSkewMs?: number;
};

const messageShape = z.object({
  address: z.string().min(1),
  message: z.string().min(1).max(4096),
  signature: z.string().min(1),
  timestamp: z.number().int().nonnegative().optional(),
  chainId: z.union([z.number().int(), z.string()]),
  type: z.enum(['eip191', 'ed25519']).optional(),
});

const fieldsShape = z.object({
  domain: z.string().min(1),
  address: z.string().min(1),
  statement: z.string().optional(),
  uri: z.string().min(1),
  version: z.string(),
  chainId: z.string().min(1),
  type: z.enum(['eip191', 'ed25519']),
  nonce: z.string(),
  issuedAt: z.string().min(1),
  expirationTime: z.string().optional(),
  notBefore: z.string().optional(),
  requestId: z.string().optional(),
  resources: z.array(z.string()).optional(),
  signatureScheme: z.enum(['eip191', 'eip1271', 'eip6492', 'siws']).optional(),
  signature: z.string().min(1),
});

/** The signed message's fields, whichever shape they came in. */
type Proof = {
  kind: 'evm' | 'solana';
  address: string;
  message: string;
  signature: string;
  domain: string;
  uri: string;
  version: string;
  nonce: string | undefined;
  issuedAt: string | undefined;
  expirationTime: string | undefined;
  notBefore: string | undefined;
  timestamp: number | undefined;
};

/** Decodes the header: standard base64 (padding optional) of UTF-8 JSON. */
function decodeHeader(header: string): unknown {
  const text = header.trim();
  if (text === '' || !/^[A-Za-z0-9+/]+={0,2}$/.test(text)) {
    throw signInError('PARSE_ERROR', 'Sign-In-With-X header is not base64');
  }
  try {
    return JSON.parse(Buffer.from(text, 'base64').toString('utf8'));
  } catch (cause) {
    throw signInError('PARSE_ERROR', 'Sign-In-With-X header is not base64-encoded JSON', cause);
  }
}

/** Chain of the interface's `chainId`: Base as 8453, "8453" or "eip155:8453"; Solana as its CAIP-2 id. */
function chainOfHeader(chainId: number | string): 'evm' | 'solana' {
  const text = String(chainId).trim();
  if (/^\d+$/.test(text) || /^eip155:\d+$/.test(text)) {
    if (text === '8453' || text === BASE_NETWORK) return 'evm';
    throw signInError('UNSUPPORTED_CHAIN', `Unsupported chain ${text}: sign in on Base (chain id 8453)`);
  }
  if (/^solana:[1-9A-HJ-NP-Za-km-z]{32,44}$/.test(text)) {
    if (text === SOLANA_NETWORK) return 'solana';
    throw signInError('UNSUPPORTED_CHAIN', `Unsupported chain ${text}: sign in on Solana mainnet`);
  }
  throw signInError('INVALID_CHAIN_ID', `Invalid chainId ${JSON.stringify(chainId)}`);
}

/** Parses "Key: value" lines and the two header lines of a Solana sign-in message. */
function parseSolanaMessage(message: string): {
  domain: string;
  address: string;
  fields: Map<string, string>;
} {
  const lines = message.split('\n');
  const header = /^(\S+) wants you to sign in with your Solana account:$/.exec(lines[0] ?? '');
  const address = lines[1]?.trim();
  if (!header?.[1] || !address) {
    throw signInError('INVALID_MESSAGE', 'Not a Solana sign-in message');
  }
  const fields = new Map<string, string>();
  for (const line of lines.slice(2)) {
    const match = /^(URI|Version|Chain ID|Nonce|Issued At|Expiration Time|Not Before|Request ID): (.*)$/.exec(
      line,
    );
    if (match?.[1] && match[2] !== undefined && !fields.has(match[1])) fields.set(match[1], match[2].trim());
  }
  return { domain: header[1], address, fields };
}

function fromMessageShape(payload: z.infer<typeof messageShape>): Proof {
  const kind = chainOfHeader(payload.chainId);
  if ((payload.type === 'ed25519') !== (kind === 'solana')) {
    throw signInError('CHAIN_MISMATCH', `Signature type ${payload.type ?? 'eip191'} does not fit the chain`);
  }
  if (kind === 'evm') {
    const parsed = parseSiweMessage(payload.message);
    if (!parsed.domain || !parsed.address || !parsed.uri || !parsed.version || !parsed.chainId) {
      throw signInError('INVALID_MESSAGE', 'The message is not an EIP-4361 sign-in message');
    }
    if (parsed.address.toLowerCase() !== payload.address.toLowerCase()) {
      throw signInError('ADDRESS_MISMATCH', 'The message was made for another address than `address`');
    }
    if (parsed.chainId !== 8453) {
      throw signInError('CHAIN_MISMATCH', `The message names chain ${parsed.chainId}, not Base (8453)`);
    }
    return {
      kind,
      address: payload.address,
      message: payload.message,
      signature: payload.signature,
      domain: parsed.domain,
      uri: parsed.uri,
      version: parsed.version,
      nonce: parsed.nonce,
      issuedAt: parsed.issuedAt?.toISOString(),
      expirationTime: parsed.expirationTime?.toISOString(),
      notBefore: parsed.notBefore?.toISOString(),
      timestamp: payload.timestamp,
    };
  }
  const parsed = parseSolanaMessage(payload.message);
  if (parsed.address !== payload.address) {
    throw signInError('ADDRESS_MISMATCH', 'The message was made for another address than `address`');
  }
  const chain = parsed.fields.get('Chain ID');
  if (chain === undefined) throw signInError('INVALID_MESSAGE', 'The message has no Chain ID');
  if (![SOLANA_REFERENCE, SOLANA_NETWORK, 'mainnet'].includes(chain)) {
    throw signInError('CHAIN_MISMATCH', `The message names chain ${chain}, not Solana mainnet`);
  }
  const uri = parsed.fields.get('URI');
  const version = parsed.fields.get('Version');
  if (!uri || !version) throw signInError('INVALID_MESSAGE', 'The message lacks URI or Version');
  return {
    kind,
    address: payload.address,
    message: payload.message,
    signature: payload.signature,
    domain: parsed.domain,
    uri,
    version,
    nonce: parsed.fields.get('Nonce'),
    issuedAt: parsed.fields.get('Issued At'),
    expirationTime: parsed.fields.get('Expiration Time'),
    notBefore: parsed.fields.get('Not Before'),
    timestamp: payload.timestamp,
  };
}

function fromFieldsShape(payload: z.infer<typeof fieldsShape>): Proof {
  let kind: 'evm' | 'solana';
  if (payload.chainId.startsWith('eip155:')) {
    if (payload.chainId !== BASE_NETWORK) {
      throw signInError('UNSUPPORTED_CHAIN', `Unsupported chain ${payload.chainId}: sign in on Base`);
    }
    kind = 'evm';
  } else if (payload.chainId.startsWith('solana:')) {
    if (payload.chainId !== SOLANA_NETWORK) {
      throw signInError(
        'UNSUPPORTED_CHAIN',
        `Unsupported chain ${payload.chainId}: sign in on Solana mainnet`,
      );
    }
    kind = 'solana';
  } else {
    throw signInError('INVALID_CHAIN_ID', `Invalid chainId ${JSON.stringify(payload.chainId)}`);
  }
  if ((payload.type === 'ed25519') !== (kind === 'solana')) {
    throw signInError(
      'CHAIN_MISMATCH',
      `Signature type ${payload.type} does not fit chain ${payload.chainId}`,
    );
  }
  if (!payload.nonce) throw signInError('MISSING_NONCE', 'The sign-in message has no nonce');
  let message: string;
  try {
    message = createSIWxMessage(
      {
        domain: payload.domain,
        uri: payload.uri,
        statement: payload.statement,
        version: payload.version,
        chainId: payload.chainId,
        type: payload.type,
        nonce: payload.nonce,
        issuedAt: payload.issuedAt,
        expirationTime: payload.expirationTime,
        notBefore: payload.notBefore,
        requestId: payload.requestId,
        resources: payload.resources,
      } as Parameters<typeof createSIWxMessage>[0],
      payload.address,
    );
  } catch (cause) {
    throw signInError('INVALID_MESSAGE', 'The sign-in fields do not form a valid message', cause);
  }
  return {
    kind,
    address: payload.address,
    message,
    signature: payload.signature,
    domain: payload.domain,
    uri: payload.uri,
    version: payload.version,
    nonce: payload.nonce,
    issuedAt: payload.issuedAt,
    expirationTime: payload.expirationTime,
    notBefore: payload.notBefore,
    timestamp: undefined,
  };
}

function parseTime(value: string, field: string): number {
  const ms = Date.parse(value);
  if (Number.isNaN(ms)) throw signInError('INVALID_MESSAGE', `${field} is not an ISO 8601 time`);
  return ms;
}

function decodeSolanaSignature(signature: string): Uint8Array | undefined {
  const candidates: Array<() => Uint8Array> = [
    () => decodeBase58(signature),
    () => {
      if (!/^[A-Za-z0-9+/]+={0,2}$/.test(signature)) throw new Error('not base64');
      return new Uint8Array(Buffer.from(signature, 'base64'));
    },
  ];
  for (const decode of candidates) {
    try {
      const bytes = decode();
      if (bytes.length === 64) return bytes;
    } catch {}
  }
  return undefined;
}

function isTransportFailure(error: unknown): boolean {
  return (
    error instanceof BaseError &&
    Boolean(error.walk((e) => e instanceof HttpRequestError || e instanceof TimeoutError))
  );
}

export type SiwxVerifier = ReturnType<typeof createSiwxVerifier>;

export function createSiwxVerifier(deps: SiwxVerifierDeps) {
  const origin = new URL(deps.publicOrigin);
  const now = deps.now ?? Date.now;
  const maxAgeMs = deps.maxAgeMs ?? SIWX_MAX_AGE_MS;
  const skewMs = deps.clockSkewMs ?? SIWX_CLOCK_SKEW_MS;

  async function checkEvmSignature(proof: Proof): Promise<void> {
    if (!isAddress(proof.address, { strict: false })) {
      throw signInError('INVALID_WALLET', 'address is not an EVM address');
    }
    if (!isHex(proof.signature) || proof.signature.length < 4) {
      throw signInError('INVALID_SIGNATURE', 'The signature is not hex');
    }
    const args = {
      address: getAddress(proof.address),
      message: proof.message,
      signature: proof.signature as `0x${string}`,
    };
    // An EOA signature is checked offline; only what recovery rejects goes to the RPC (smart wallets).
    const offline = await isEoaSignature(args.address, args.message, args.signature);
    if (offline) return;
    if (deps.smartWalletVerifier) {
      let verdict: Awaited<ReturnType<EvmSmartWalletVerifier>>;
      try {
        verdict = await deps.smartWalletVerifier(args);
      } catch (cause) {
        if (isTransportFailure(cause)) {
          throw signInError(
            'VERIFIER_UNAVAILABLE',
            'The Base RPC needed to verify the signature failed',
            cause,
          );
        }
        verdict = 'invalid';
      }
      if (verdict === 'valid') return;
      if (verdict === 'factory-not-allowed') {
        throw signInError(
          'FACTORY_NOT_ALLOWED',
          'The wallet is not deployed and its ERC-6492 factory is not one this service trusts',
        );
      }
    }
    throw signInError('INVALID_SIGNATURE', 'The signature does not match the wallet');
  }

  function checkSolanaSignature(proof: Proof): void {
    let key: Uint8Array;
    try {
      key = decodeBase58(proof.address);
    } catch (cause) {
      throw signInError('INVALID_WALLET', 'address is not a Solana address', cause);
    }
    if (key.length !== 32) throw signInError('INVALID_WALLET', 'address is not a Solana address');
    const signature = decodeSolanaSignature(proof.signature);
    if (!signature) {
      throw signInError('INVALID_SIGNATURE', 'The signature is not 64 bytes of base58 or base64');
    }
    if (!isEd25519Signature(proof.message, signature, key)) {
      throw signInError('INVALID_SIGNATURE', 'The signature does not match the wallet');
    }
  }

  return {
    /** Verifies the header and consumes its nonce; throws the 401 ApiError to answer with. */
    async verify(header: string): Promise<VerifiedSignIn> {
      const decoded = decodeHeader(header);
      if (typeof decoded !== 'object' || decoded === null || Array.isArray(decoded)) {
        throw signInError('INVALID_PAYLOAD', 'Sign-In-With-X payload must be a JSON object');
      }
      let proof: Proof;
      if ('message' in decoded) {
        const parsed = messageShape.safeParse(decoded);
        if (!parsed.success) {
          throw signInError(
            'INVALID_PAYLOAD',
            `Invalid Sign-In-With-X payload: ${z.prettifyError(parsed.error)}`,
          );
        }
        proof = fromMessageShape(parsed.data);
      } else {
        const parsed = fieldsShape.safeParse(decoded);
        if (!parsed.success) {
          throw signInError(
            'INVALID_PAYLOAD',
            `Invalid Sign-In-With-X payload: ${z.prettifyError(parsed.error)}`,
          );
        }
        proof = fromFieldsShape(parsed.data);
      }

      if (proof.domain !== origin.host) {
        throw signInError('DOMAIN_MISMATCH', `The message is for ${proof.domain}, not ${origin.host}`);
      }
      let uriOrigin: string | undefined;
      try {
        uriOrigin = new URL(proof.uri).origin;
      } catch {}
      if (uriOrigin !== origin.origin) {
        throw signInError('DOMAIN_MISMATCH', `The message URI is not on ${origin.origin}`);
      }
      if (proof.version !== '1') throw signInError('INVALID_MESSAGE', 'The message version must be 1');
      if (!proof.nonce) throw signInError('MISSING_NONCE', 'The sign-in message has no nonce');
      if (!/^[A-Za-z0-9]{8,64}$/.test(proof.nonce)) {
        throw signInError('INVALID_MESSAGE', 'The nonce must be 8 to 64 letters and digits');
      }
      if (!proof.issuedAt) throw signInError('INVALID_MESSAGE', 'The message has no Issued At time');

      const at = now();
      const issuedAt = parseTime(proof.issuedAt, 'Issued At');
      if (issuedAt > at + skewMs)
        throw signInError('FUTURE_TIMESTAMP', 'The message is issued in the future');
      if (at - issuedAt > maxAgeMs) {
        throw signInError('EXPIRED', `The message is older than ${maxAgeMs / 1000} seconds: sign a new one`);
      }
      if (proof.expirationTime !== undefined && parseTime(proof.expirationTime, 'Expiration Time') <= at) {
        throw signInError('EXPIRED', 'Sign-In-With-X message has expired');
      }
      if (proof.notBefore !== undefined && parseTime(proof.notBefore, 'Not Before') > at + skewMs) {
        throw signInError('NOT_BEFORE', 'The message is not valid yet (Not Before)');
      }
      if (proof.timestamp !== undefined) {
        if (proof.timestamp > at + skewMs) {
          throw signInError('FUTURE_TIMESTAMP', 'timestamp is in the future');
        }
        if (Math.abs(proof.timestamp - issuedAt) > maxAgeMs) {
          throw signInError('TIMESTAMP_MISMATCH', 'timestamp does not match the message Issued At time');
        }
      }

      if (proof.kind === 'evm') await checkEvmSignature(proof);
      else checkSolanaSignature(proof);

      const normalizedAddress = normalizeWalletAddress(proof.address);
      const fresh = await deps.consumeNonce({
        address: normalizedAddress,
        nonce: proof.nonce,
        expiresAtMs: issuedAt + maxAgeMs + skewMs,
      });
      if (!fresh)
        throw signInError('NONCE_REUSED', 'This sign-in nonce was already used: sign a new message');
      return {
        kind: proof.kind,
        address: proof.kind === 'evm' ? getAddress(proof.address) : proof.address,
        normalizedAddress,
        nonce: proof.nonce,
      };
    },
  };
}
