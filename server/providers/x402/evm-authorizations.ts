/**
 * What a Base node says about an EIP-3009 authorization, for the top-up reconciler: whether the token has used
 * it (`authorizationState(authorizer, nonce)`), the transaction that used it (the token's `AuthorizationUsed`
 * log) with the `Transfer`s that transaction made, and the chain's own clock (the latest block's timestamp,
 * which is what the token compares `validBefore` with). Read-only: nothing here sends a transaction.
 */
import { createPublicClient, getAddress, type Hex, http, parseAbi, parseEventLogs } from 'viem';

const TOKEN_ABI = parseAbi([
  'function authorizationState(address authorizer, bytes32 nonce) view returns (bool)',
  'event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce)',
  'event Transfer(address indexed from, address indexed to, uint256 value)',
]);

/** Blocks asked for in one `eth_getLogs` (RPC providers cap the range). */
const LOG_CHUNK_BLOCKS = 2_000n;

export type AuthorizationRef = { token: string; authorizer: string; nonce: Hex };

export type AuthorizationUse = {
  transaction: Hex;
  transfers: Array<{ from: string; to: string; value: bigint }>;
};

/** The port the reconciler reads the chain through. */
export type Eip3009Chain = {
  /** Seconds: the timestamp of the latest block. */
  latestTimestamp(): Promise<bigint>;
  /** True once the token used (or cancelled) the authorization. */
  authorizationUsed(ref: AuthorizationRef): Promise<boolean>;
  /**
   * The transaction that used the authorization, searched in the blocks from the first one stamped at or
   * after `sinceSeconds` to the latest; undefined when no such log exists there (e.g. it was cancelled).
   */
  findAuthorizationUse(
    ref: AuthorizationRef & { sinceSeconds: bigint },
  ): Promise<AuthorizationUse | undefined>;
};

export function createEip3009Chain(rpcUrl: string): Eip3009Chain {
  const client = createPublicClient({ transport: http(rpcUrl, { timeout: 15_000, retryCount: 1 }) });

  /** The first block stamped at or after `seconds` (binary search over block timestamps). */
  async function firstBlockAtOrAfter(seconds: bigint, latest: { number: bigint; timestamp: bigint }) {
    if (latest.timestamp < seconds) return latest.number;
    let low = 0n;
    let high = latest.number;
    while (low < high) {
      const middle = (low + high) / 2n;
      const block = await client.getBlock({ blockNumber: middle });
      if (block.timestamp >= seconds) high = middle;
      else low = middle + 1n;
    }
    return low;
  }

  return {
    async latestTimestamp() {
      return (await client.getBlock({ blockTag: 'latest' })).timestamp;
    },

    authorizationUsed: ({ token, authorizer, nonce }) =>
      client.readContract({
        address: getAddress(token),
        abi: TOKEN_ABI,
        functionName: 'authorizationState',
        args: [getAddress(authorizer), nonce],
      }),

    async findAuthorizationUse({ token, authorizer, nonce, sinceSeconds }) {
      const latest = await client.getBlock({ blockTag: 'latest' });
      const address = getAddress(token);
      for (let from = await firstBlockAtOrAfter(sinceSeconds, latest); from <= latest.number; ) {
        const to =
          from + LOG_CHUNK_BLOCKS - 1n < latest.number ? from + LOG_CHUNK_BLOCKS - 1n : latest.number;
        const logs = await client.getLogs({
          address,
          event: TOKEN_ABI[1],
          args: { authorizer: getAddress(authorizer), nonce },
          fromBlock: from,
          toBlock: to,
        });
        const used = logs.find((log) => !log.removed && log.transactionHash);
        if (used?.transactionHash) {
          const receipt = await client.getTransactionReceipt({ hash: used.transactionHash });
          if (receipt.status !== 'success') return undefined;
          const transfers = parseEventLogs({ abi: TOKEN_ABI, eventName: 'Transfer', logs: receipt.logs })
            .filter((log) => log.address.toLowerCase() === address.toLowerCase())
            .map((log) => ({ from: log.args.from, to: log.args.to, value: log.args.value }));
          return { transaction: used.transactionHash, transfers };
        }
        from = to + 1n;
      }
      return undefined;
    },
  };
}
