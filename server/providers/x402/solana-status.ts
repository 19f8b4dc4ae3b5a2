/**
 * What a Solana node says about a settlement transaction, for the top-up reconciler: its status by id
 * (`getSignatureStatuses`, with history) and whether its recent blockhash can still land it
 * (`isBlockhashValid`). A transaction that is unknown while its blockhash is no longer valid can never land.
 * Read-only: nothing here sends a transaction.
 */
import { getBase64Encoder, getCompiledTransactionMessageDecoder, getTransactionDecoder } from '@solana/kit';

export type SolanaTransactionStatus = 'confirmed' | 'failed' | 'processed' | 'unknown';

/** The port the reconciler reads Solana through. */
export type SolanaChain = {
  status(transactionId: string): Promise<SolanaTransactionStatus>;
  /** False once the blockhash expired (a transaction using it can no longer be included). */
  blockhashValid(blockhash: string): Promise<boolean>;
};

/** The recent blockhash a wire transaction (base64) was built on. */
export function transactionBlockhash(base64: string): string {
  const { messageBytes } = getTransactionDecoder().decode(getBase64Encoder().encode(base64));
  return getCompiledTransactionMessageDecoder().decode(messageBytes).lifetimeToken;
}

export function createSolanaChain(rpcUrl: string, options: { timeoutMs?: number } = {}): SolanaChain {
  let id = 0;
  async function call<T>(method: string, params: unknown[]): Promise<T> {
    const response = await fetch(rpcUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: ++id, method, params }),
      signal: AbortSignal.timeout(options.timeoutMs ?? 15_000),
    });
    const body = (await response.json()) as { result?: T; error?: { message?: string } };
    if (!response.ok || body.error || body.result === undefined) {
      throw new Error(`Solana RPC ${method} failed: ${body.error?.message ?? response.status}`);
    }
    return body.result;
  }
  return {
    async status(transactionId) {
      const { value } = await call<{
        value: Array<{ err: unknown; confirmationStatus?: string | null } | null>;
      }>('getSignatureStatuses', [[transactionId], { searchTransactionHistory: true }]);
      const status = value[0];
      if (!status) return 'unknown';
      if (status.err) return 'failed';
      return status.confirmationStatus === 'confirmed' || status.confirmationStatus === 'finalized'
        ? 'confirmed'
        : 'processed';
    },
    async blockhashValid(blockhash) {
      const { value } = await call<{ value: boolean }>('isBlockhashValid', [
        blockhash,
        { commitment: 'confirmed' },
      ]);
      return value;
    },
  };
}
