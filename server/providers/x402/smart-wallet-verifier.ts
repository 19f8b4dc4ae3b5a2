/**
 * Smart-wallet signatures for Sign-In-With-X, checked through the Base RPC: EIP-1271 for a deployed wallet
 * (`isValidSignature` on the wallet) and ERC-6492 for a counterfactual one (viem's deployless universal
 * validator simulates the factory call and the check in one `eth_call`, so verification never deploys the
 * wallet). A counterfactual wallet is accepted only when its factory is on the allow-list
 * (`X402_EIP6492_FACTORIES`, the same list the Base facilitator may deploy payers through): the simulation runs
 * the factory's code, so only trusted factories are run.
 */
import {
  createPublicClient,
  getAddress,
  http,
  isAddressEqual,
  isErc6492Signature,
  parseErc6492Signature,
} from 'viem';

export type SmartWalletVerdict = 'valid' | 'invalid' | 'factory-not-allowed';

export type SmartWalletVerifier = (args: {
  address: `0x${string}`;
  message: string;
  signature: `0x${string}`;
}) => Promise<SmartWalletVerdict>;

export function createSmartWalletVerifier(options: {
  rpcUrl: string;
  /** Factories trusted for counterfactual (ERC-6492) wallets; empty: none is. */
  allowedFactories: readonly string[];
}): SmartWalletVerifier {
  const client = createPublicClient({ transport: http(options.rpcUrl, { timeout: 10_000, retryCount: 1 }) });
  const allowed = options.allowedFactories.map((factory) => getAddress(factory));
  return async (args) => {
    if (isErc6492Signature(args.signature)) {
      const { address: factory } = parseErc6492Signature(args.signature);
      const code = await client.getCode({ address: args.address });
      const deployed = code !== undefined && code !== '0x';
      if (!deployed && !(factory && allowed.some((a) => isAddressEqual(a, factory)))) {
        return 'factory-not-allowed';
      }
    }
    return (await client.verifyMessage(args)) ? 'valid' : 'invalid';
  };
}
