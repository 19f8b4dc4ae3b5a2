/**
 * The facilitator in process: the reference `x402Facilitator` with the `exact` schemes of `@x402/evm` (Base,
 * EIP-3009 `transferWithAuthorization` submitted by our own account through our Base RPC) and `@x402/svm`
 * (Solana: our fee payer co-signs and sends the transfer through our Solana RPC). Broadcast-but-unconfirmed
 * EVM settlements are remembered in the shared database (`PendingSettlementStore`), so that a later settle of
 * the same payload, on any process, reconciles instead of broadcasting again.
 */

import {
  createKeyPairSignerFromBytes,
  getBase64Encoder,
  getTransactionDecoder,
  type KeyPairSigner,
  signBytes,
} from '@solana/kit';
import { type PendingSettlementStore, x402Facilitator } from '@x402/core/facilitator';
import type { Network } from '@x402/core/types';
import { type FacilitatorEvmSigner, toFacilitatorEvmSigner } from '@x402/evm';
import { ExactEvmScheme } from '@x402/evm/exact/facilitator';
import { decodeBase58, encodeBase58 } from '@x402/extensions/sign-in-with-x';
import { toFacilitatorSvmSigner } from '@x402/svm';
import { ExactSvmScheme } from '@x402/svm/exact/facilitator';
import { createWalletClient, http, publicActions } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { base } from 'viem/chains';
import type { Facilitator } from './facilitator.ts';

export const BASE_NETWORK = 'eip155:8453';
export const SOLANA_NETWORK = 'solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp';

export type InProcessFacilitatorOptions = {
  evm?: {
    rpcUrl: string;
    privateKey: `0x${string}`;
    /** ERC-6492 factories the facilitator may call to deploy a counterfactual payer. */
    eip6492AllowedFactories?: string[];
    pendingSettlementStore?: PendingSettlementStore;
    /** How long settle waits for the receipt before answering `settlement_pending` (default 180 s). */
    confirmationTimeoutMs?: number;
  };
  solana?: { rpcUrl: string; secretKeyBase58: string };
};

/** @x402/evm's verdict for a token address without code. */
const ASSET_NOT_CONTRACT = 'asset_not_deployed_contract';

/**
 * @x402/evm starts its token check (`eth_getCode` of the asset) in the background and, on many invalid
 * payloads, returns without awaiting it: when the Base node fails, that rejection is unhandled and Node ends
 * the whole process (one bad payment while the node hiccups took the server down). Here a failed `getCode`
 * reads as "no code" instead of rejecting; the facilitator then re-checks that verdict directly (above), so
 * a node failure still surfaces as an error of the request that awaited it.
 */
function guardAssetChecks(signer: FacilitatorEvmSigner, assets: ReadonlySet<string>): FacilitatorEvmSigner {
  return {
    ...signer,
    getCode: (args: Parameters<FacilitatorEvmSigner['getCode']>[0]) => {
      const code = signer.getCode(args);
      // Only the tokens payments ask for (the payer checks of @x402/evm already catch their own failures).
      return assets.has(args.address.toLowerCase()) ? code.catch(() => undefined) : code;
    },
  };
}

export async function createInProcessFacilitator(options: InProcessFacilitatorOptions): Promise<Facilitator> {
  const facilitator = new x402Facilitator();
  let evmSigner: FacilitatorEvmSigner | undefined;
  /** Token addresses (lower case) of the payments seen: their background `getCode` is guarded. */
  const tokens = new Set<string>();
  if (options.evm) {
    const client = createWalletClient({
      account: privateKeyToAccount(options.evm.privateKey),
      chain: base,
      transport: http(options.evm.rpcUrl, { timeout: 30_000 }),
    }).extend(publicActions);
    const signer = toFacilitatorEvmSigner(
      client as unknown as Parameters<typeof toFacilitatorEvmSigner>[0],
      options.evm.confirmationTimeoutMs === undefined
        ? undefined
        : { confirmationTimeoutMs: options.evm.confirmationTimeoutMs },
    );
    facilitator.register(
      BASE_NETWORK as Network,
      new ExactEvmScheme(guardAssetChecks(signer, tokens), {
        eip6492AllowedFactories: options.evm.eip6492AllowedFactories ?? [],
        ...(options.evm.pendingSettlementStore
          ? { pendingSettlementStore: options.evm.pendingSettlementStore }
          : {}),
      }),
    );
    evmSigner = signer;
  }
  let feePayer: KeyPairSigner | undefined;
  if (options.solana) {
    feePayer = await createKeyPairSignerFromBytes(decodeBase58(options.solana.secretKeyBase58));
    const signer = toFacilitatorSvmSigner(feePayer, { defaultRpcUrl: options.solana.rpcUrl });
    facilitator.register(SOLANA_NETWORK as Network, new ExactSvmScheme(signer));
  }
  /** A verdict of "the token has no code" is re-checked: a node failure throws instead of passing for it. */
  const recheckAsset = async <T extends { invalidReason?: string; errorReason?: string }>(
    requirements: { network: string; asset: string },
    result: T,
  ): Promise<T> => {
    const reason = result.invalidReason ?? result.errorReason;
    if (evmSigner && requirements.network === BASE_NETWORK && reason === ASSET_NOT_CONTRACT) {
      await evmSigner.getCode({ address: requirements.asset as `0x${string}` });
    }
    return result;
  };
  return {
    verify: async (payload, requirements) => {
      tokens.add(requirements.asset.toLowerCase());
      return recheckAsset(requirements, await facilitator.verify(payload, requirements));
    },
    settle: async (payload, requirements) => {
      tokens.add(requirements.asset.toLowerCase());
      return recheckAsset(requirements, await facilitator.settle(payload, requirements));
    },
    supported: async () => facilitator.getSupported() as Awaited<ReturnType<Facilitator['supported']>>,
    async transactionId(payload) {
      const transaction = (payload.payload as { transaction?: unknown }).transaction;
      if (!feePayer || payload.accepted.network !== SOLANA_NETWORK || typeof transaction !== 'string') {
        return undefined;
      }
      return solanaTransactionId(transaction, feePayer);
    },
  };
}

/**
 * A Solana transaction's id is its first signature, the fee payer's. When the fee payer is ours and has not
 * signed yet, it is the signature ed25519 (deterministic) would give the message: the same one settle sends.
 */
async function solanaTransactionId(base64: string, feePayer: KeyPairSigner): Promise<string | undefined> {
  const decoded = getTransactionDecoder().decode(getBase64Encoder().encode(base64));
  const [first] = Object.entries(decoded.signatures);
  if (!first) return undefined;
  const [address, signature] = first;
  if (signature) return encodeBase58(new Uint8Array(signature));
  if (address !== feePayer.address) return undefined;
  return encodeBase58(new Uint8Array(await signBytes(feePayer.keyPair.privateKey, decoded.messageBytes)));
}
