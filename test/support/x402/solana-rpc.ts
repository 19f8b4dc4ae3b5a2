/**
 * A loopback stand-in for the few Solana JSON-RPC methods the `@x402/svm` client and facilitator call
 * (no Solana validator installs from npm here): `getAccountInfo` (the USDC mint: 82 bytes of SPL mint data
 * with 6 decimals), `getLatestBlockhash`, `simulateTransaction` (always succeeds), `sendTransaction` (returns
 * the transaction's first signature and records it; a transaction already processed is refused, as a node
 * does), `getSignatureStatuses` (confirmed once sent) and `isBlockhashValid` (every blockhash it handed out is
 * valid until `expireBlockhashes`). It moves no tokens: it stands in for the network, not for the protocol
 * code under test.
 */
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { encodeBase58 } from '@x402/extensions/sign-in-with-x';

export const SOLANA_USDC_MINT = 'EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v';
const TOKEN_PROGRAM = 'TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA';

export type SolanaRpcStandIn = {
  url: string;
  /** Base64 transactions received by `sendTransaction`, in order. */
  sent: string[];
  calls: string[];
  /** Every blockhash handed out so far becomes too old to land a transaction. */
  expireBlockhashes(): void;
  close(): Promise<void>;
};

function mintData(): string {
  const data = Buffer.alloc(82);
  data.writeUInt32LE(0, 0); // no mint authority
  data.writeBigUInt64LE(1_000_000_000_000n, 36); // supply
  data.writeUInt8(6, 44); // decimals
  data.writeUInt8(1, 45); // initialised
  return data.toString('base64');
}

/** The first signature of a wire-format transaction (compact-u16 count, then 64-byte signatures). */
function firstSignature(base64: string): string {
  const bytes = Buffer.from(base64, 'base64');
  let offset = 0;
  let count = 0;
  for (let shift = 0; ; shift += 7) {
    const byte = bytes[offset++] ?? 0;
    count |= (byte & 0x7f) << shift;
    if ((byte & 0x80) === 0) break;
  }
  if (count < 1) throw new Error('transaction has no signatures');
  return encodeBase58(new Uint8Array(bytes.subarray(offset, offset + 64)));
}

export async function startSolanaRpcStandIn(): Promise<SolanaRpcStandIn> {
  const sent: string[] = [];
  const calls: string[] = [];
  const confirmed = new Set<string>();
  const blockhashes = new Set<string>();
  const context = { slot: 1000 };
  const handle = (method: string, params: unknown[]): unknown => {
    calls.push(method);
    switch (method) {
      case 'getAccountInfo': {
        if (params[0] !== SOLANA_USDC_MINT) return { context, value: null };
        return {
          context,
          value: {
            data: [mintData(), 'base64'],
            executable: false,
            lamports: 1_461_600,
            owner: TOKEN_PROGRAM,
            rentEpoch: 0,
            space: 82,
          },
        };
      }
      case 'getLatestBlockhash': {
        const blockhash = encodeBase58(new Uint8Array(randomBytes(32)));
        blockhashes.add(blockhash);
        return { context, value: { blockhash, lastValidBlockHeight: 2000 } };
      }
      case 'isBlockhashValid':
        return { context, value: blockhashes.has(String(params[0])) };
      case 'simulateTransaction':
        return {
          context,
          value: { err: null, logs: [], accounts: null, unitsConsumed: 5000, returnData: null },
        };
      case 'sendTransaction': {
        const transaction = String(params[0]);
        sent.push(transaction);
        const signature = firstSignature(transaction);
        if (confirmed.has(signature)) {
          throw Object.assign(
            new Error('Transaction simulation failed: This transaction has already been processed'),
            {
              code: -32002,
            },
          );
        }
        confirmed.add(signature);
        return signature;
      }
      case 'getSignatureStatuses':
        return {
          context,
          value: ((params[0] as string[]) ?? []).map((signature) =>
            confirmed.has(signature)
              ? { slot: 1000, confirmations: null, err: null, confirmationStatus: 'confirmed' }
              : null,
          ),
        };
      default:
        throw Object.assign(new Error(`Method not found: ${method}`), { code: -32601 });
    }
  };
  const server = createServer((req, res) => {
    let text = '';
    req.on('data', (chunk: Buffer) => {
      text += chunk.toString();
    });
    req.on('end', () => {
      const request = JSON.parse(text) as { id: unknown; method: string; params?: unknown[] };
      let reply: object;
      try {
        reply = { jsonrpc: '2.0', id: request.id, result: handle(request.method, request.params ?? []) };
      } catch (error) {
        const e = error as { code?: number; message: string };
        reply = { jsonrpc: '2.0', id: request.id, error: { code: e.code ?? -32000, message: e.message } };
      }
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(reply));
    });
  });
  server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    sent,
    calls,
    expireBlockhashes: () => blockhashes.clear(),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A 64-byte Solana secret key (seed then public key) and its address, from node:crypto. */
export async function solanaKeyPair(): Promise<{
  secretKey: Uint8Array;
  secretKeyBase58: string;
  address: string;
}> {
  const { generateKeyPairSync } = await import('node:crypto');
  const { publicKey, privateKey } = generateKeyPairSync('ed25519');
  const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url');
  const pub = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url');
  const secretKey = new Uint8Array(Buffer.concat([seed, pub]));
  return { secretKey, secretKeyBase58: encodeBase58(secretKey), address: encodeBase58(new Uint8Array(pub)) };
}
