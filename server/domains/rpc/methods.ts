/**
 * The JSON-RPC method catalogue: which methods each family (`evm`, `solana`, `starknet`) serves and at which
 * price tier, and why a refused method is refused. Built once at start; `classifyMethod` is a map lookup
 * (plus a prefix check for the namespaces served as a whole), so it costs nothing per request.
 */

export type RpcFamily = 'evm' | 'solana' | 'starknet';

/** Price multiplier of a method: standard 1x, advanced 2x, large 4x. */
export type RpcTier = 1 | 2 | 4;

export type RefusalReason = 'websocket' | 'filter' | 'key' | 'unsupported';

export type MethodClass = { allowed: true; tier: RpcTier } | { allowed: false; reason: RefusalReason };

const EVM_STANDARD = [
  // Core reads and writes.
  'eth_blockNumber',
  'eth_call',
  'eth_callMany',
  'eth_chainId',
  'eth_createAccessList',
  'eth_estimateGas',
  'eth_feeHistory',
  'eth_gasPrice',
  'eth_blobBaseFee',
  'eth_maxPriorityFeePerGas',
  'eth_getBalance',
  'eth_getBlockByHash',
  'eth_getBlockByNumber',
  'eth_getBlockReceipts',
  'eth_getBlockTransactionCountByHash',
  'eth_getBlockTransactionCountByNumber',
  'eth_getCode',
  'eth_getLogs',
  'eth_getProof',
  'eth_getStorageAt',
  'eth_getTransactionByBlockHashAndIndex',
  'eth_getTransactionByBlockNumberAndIndex',
  'eth_getTransactionByHash',
  'eth_getTransactionCount',
  'eth_getTransactionReceipt',
  'eth_getUncleByBlockHashAndIndex',
  'eth_getUncleByBlockNumberAndIndex',
  'eth_getUncleCountByBlockHash',
  'eth_getUncleCountByBlockNumber',
  'eth_protocolVersion',
  'eth_sendRawTransaction',
  'eth_simulateV1',
  'eth_syncing',
  'net_listening',
  'net_peerCount',
  'net_version',
  'web3_clientVersion',
  'web3_sha3',
  // ERC-4337 bundlers.
  'eth_sendUserOperation',
  'eth_estimateUserOperationGas',
  'eth_getUserOperationByHash',
  'eth_getUserOperationReceipt',
  'eth_supportedEntryPoints',
  'pimlico_getUserOperationGasPrice',
  'pimlico_getUserOperationStatus',
];

const EVM_ADVANCED = [
  'trace_block',
  'trace_call',
  'trace_callMany',
  'trace_filter',
  'trace_get',
  'trace_rawTransaction',
  'trace_transaction',
  'debug_traceBlock',
  'debug_traceBlockByHash',
  'debug_traceBlockByNumber',
  'debug_traceCall',
  'debug_traceTransaction',
  'debug_storageRangeAt',
  'txpool_inspect',
  'txpool_status',
];

const EVM_LARGE = [
  'trace_replayBlockTransactions',
  'trace_replayTransaction',
  'txpool_content',
  'arbtrace_replayBlockTransactions',
  'arbtrace_replayTransaction',
];

/** Chain-specific namespaces served whole: prefix and tier (`arbtrace_*` except the replays above is 2x). */
const EVM_NAMESPACES: ReadonlyArray<[prefix: string, tier: RpcTier]> = [
  ['zks_', 1],
  ['linea_', 1],
  ['bor_', 1],
  ['arbtrace_', 2],
];

const EVM_FILTER = [
  'eth_newFilter',
  'eth_newBlockFilter',
  'eth_newPendingTransactionFilter',
  'eth_getFilterChanges',
  'eth_getFilterLogs',
  'eth_uninstallFilter',
];

const EVM_KEY = [
  'eth_sign',
  'eth_accounts',
  'eth_mining',
  'eth_hashrate',
  'eth_getWork',
  'eth_submitWork',
  'eth_submitHashrate',
  'eth_coinbase',
  'eth_sendTransaction',
  'eth_signTransaction',
  'eth_signTypedData',
  'eth_signTypedData_v3',
  'eth_signTypedData_v4',
];
const EVM_KEY_PREFIXES = ['personal_', 'miner_'];

const SOLANA_STANDARD = [
  'getAccountInfo',
  'getBalance',
  'getBlock',
  'getBlockCommitment',
  'getBlockHeight',
  'getBlockProduction',
  'getBlockTime',
  'getBlocks',
  'getBlocksWithLimit',
  'getClusterNodes',
  'getEpochInfo',
  'getEpochSchedule',
  'getFeeForMessage',
  'getFirstAvailableBlock',
  'getGenesisHash',
  'getHealth',
  'getHighestSnapshotSlot',
  'getIdentity',
  'getInflationGovernor',
  'getInflationRate',
  'getInflationReward',
  'getLatestBlockhash',
  'getLeaderSchedule',
  'getMaxRetransmitSlot',
  'getMaxShredInsertSlot',
  'getMinimumBalanceForRentExemption',
  'getMultipleAccounts',
  'getProgramAccounts',
  'getRecentPerformanceSamples',
  'getRecentPrioritizationFees',
  'getSignatureStatuses',
  'getSignaturesForAddress',
  'getSlot',
  'getSlotLeader',
  'getSlotLeaders',
  'getStakeMinimumDelegation',
  'getTokenAccountBalance',
  'getTokenAccountsByDelegate',
  'getTokenAccountsByOwner',
  'getTokenLargestAccounts',
  'getTokenSupply',
  'getTransaction',
  'getTransactionCount',
  'getVersion',
  'getVoteAccounts',
  'isBlockhashValid',
  'minimumLedgerSlot',
  'requestAirdrop',
  'sendTransaction',
  'simulateTransaction',
];
const SOLANA_LARGE = ['getLargestAccounts', 'getSupply'];

/** One family's catalogue: exact names, served namespaces, and the refusals with their reasons. */
type FamilyCatalogue = {
  exact: Map<string, MethodClass>;
  prefixes: ReadonlyArray<[prefix: string, cls: MethodClass]>;
};

function catalogue(
  entries: ReadonlyArray<[names: readonly string[], cls: MethodClass]>,
  prefixes: ReadonlyArray<[prefix: string, cls: MethodClass]> = [],
): FamilyCatalogue {
  const exact = new Map<string, MethodClass>();
  for (const [names, cls] of entries) for (const name of names) exact.set(name, cls);
  return { exact, prefixes };
}

const tier = (t: RpcTier): MethodClass => ({ allowed: true, tier: t });
const refuse = (reason: RefusalReason): MethodClass => ({ allowed: false, reason });

const CATALOGUES: Record<RpcFamily, FamilyCatalogue> = {
  evm: catalogue(
    [
      [EVM_STANDARD, tier(1)],
      [EVM_ADVANCED, tier(2)],
      [EVM_LARGE, tier(4)],
      [['eth_subscribe', 'eth_unsubscribe'], refuse('websocket')],
      [EVM_FILTER, refuse('filter')],
      [EVM_KEY, refuse('key')],
    ],
    [
      ...EVM_NAMESPACES.map(([prefix, t]): [string, MethodClass] => [prefix, tier(t)]),
      ...EVM_KEY_PREFIXES.map((prefix): [string, MethodClass] => [prefix, refuse('key')]),
    ],
  ),
  solana: catalogue([
    [SOLANA_STANDARD, tier(1)],
    [SOLANA_LARGE, tier(4)],
  ]),
  starknet: catalogue(
    [],
    [
      ['starknet_subscribe', refuse('websocket')],
      ['starknet_unsubscribe', refuse('websocket')],
      ['starknet_', tier(1)],
    ],
  ),
};

const SOLANA_WEBSOCKET = /^[a-z][A-Za-z]*(Subscribe|Unsubscribe)$/;

/** How `method` is served on a network of `family`: its tier, or why it is refused. */
export function classifyMethod(family: RpcFamily, method: string): MethodClass {
  const cat = CATALOGUES[family];
  const exact = cat.exact.get(method);
  if (exact) return exact;
  for (const [prefix, cls] of cat.prefixes) if (method.startsWith(prefix)) return cls;
  // Subscriptions are refused as WebSocket-only on every family, whatever namespace they use.
  if (family === 'solana' && SOLANA_WEBSOCKET.test(method)) return refuse('websocket');
  if (method === 'eth_subscribe' || method === 'eth_unsubscribe') return refuse('websocket');
  return refuse('unsupported');
}

const REASONS: Record<RefusalReason, string> = {
  websocket: 'WebSocket-only; this proxy speaks HTTP only, so poll instead',
  filter:
    'stateful filters are not supported (a filter lives on one node); use eth_getLogs with a block range',
  key: 'key and mining methods are not served; sign in the client and send with eth_sendRawTransaction',
  unsupported: 'not supported on this network',
};

/** A sentence saying why a method is refused. */
export function refusalText(reason: RefusalReason): string {
  return REASONS[reason];
}
