/**
 * The test contracts, compiled with `solc` from npm (wasm, nothing downloaded) and placed on a test node:
 * the EIP-3009 USDC stand-in at the real Base USDC address (so stock x402 clients accept it as USDC), and an
 * EIP-1271 smart wallet with its ERC-6492 (CREATE2) factory, and Multicall3's `tryAggregate` where Base has it.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  type Abi,
  createPublicClient,
  createWalletClient,
  encodeFunctionData,
  type Hex,
  http,
  parseAbi,
  publicActions,
  serializeErc6492Signature,
} from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { base } from 'viem/chains';

const require = createRequire(import.meta.url);
const solc = require('solc') as { compile(input: string): string };

export const BASE_USDC = '0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913' as const;

export const USDC_ABI = parseAbi([
  'function mint(address to, uint256 value)',
  'function balanceOf(address) view returns (uint256)',
  'function authorizationState(address, bytes32) view returns (bool)',
]);

type Compiled = { abi: Abi; bytecode: Hex; deployedBytecode: Hex };
let compiled: Record<string, Compiled> | undefined;

/** Compiles TestUSDC.sol once per process. */
export function compileTestContracts(): Record<string, Compiled> {
  if (compiled) return compiled;
  const source = readFileSync(join(dirname(fileURLToPath(import.meta.url)), 'TestUSDC.sol'), 'utf8');
  const output = JSON.parse(
    solc.compile(
      JSON.stringify({
        language: 'Solidity',
        sources: { 'TestUSDC.sol': { content: source } },
        settings: {
          optimizer: { enabled: true, runs: 200 },
          evmVersion: 'cancun',
          outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object', 'evm.deployedBytecode.object'] } },
        },
      }),
    ),
  ) as {
    errors?: Array<{ severity: string; formattedMessage: string }>;
    contracts: Record<
      string,
      Record<
        string,
        { abi: Abi; evm: { bytecode: { object: string }; deployedBytecode: { object: string } } }
      >
    >;
  };
  const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
  if (errors.length > 0) throw new Error(errors.map((e) => e.formattedMessage).join('\n'));
  const contracts = output.contracts['TestUSDC.sol'] ?? {};
  compiled = Object.fromEntries(
    Object.entries(contracts).map(([name, c]) => [
      name,
      {
        abi: c.abi,
        bytecode: `0x${c.evm.bytecode.object}` as Hex,
        deployedBytecode: `0x${c.evm.deployedBytecode.object}` as Hex,
      },
    ]),
  );
  return compiled;
}

type Rpc = <T = unknown>(method: string, params?: unknown[]) => Promise<T>;

export const MULTICALL3 = '0xcA11bde05977b3631167028862bE2a173976CA11' as const;

/** Puts the test USDC at the Base USDC address of an anvil node, and Multicall3 where Base has it. */
export async function installTestUsdc(rpc: Rpc): Promise<void> {
  const { TestUSDC: usdc, TestMulticall3: multicall } = compileTestContracts();
  if (!usdc || !multicall) throw new Error('TestUSDC.sol did not compile');
  await rpc('anvil_setCode', [BASE_USDC, usdc.deployedBytecode]);
  await rpc('anvil_setCode', [MULTICALL3, multicall.deployedBytecode]);
}

/** A viem client for the node, signing with `privateKey`. */
export function testClient(url: string, privateKey: Hex) {
  return createWalletClient({
    account: privateKeyToAccount(privateKey),
    chain: base,
    transport: http(url),
  }).extend(publicActions);
}

export async function mintUsdc(url: string, privateKey: Hex, to: Hex, atomic: bigint): Promise<void> {
  const client = testClient(url, privateKey);
  const hash = await client.writeContract({
    address: BASE_USDC,
    abi: USDC_ABI,
    functionName: 'mint',
    args: [to, atomic],
  });
  await client.waitForTransactionReceipt({ hash });
}

export async function usdcBalance(url: string, owner: Hex): Promise<bigint> {
  const client = createPublicClient({ chain: base, transport: http(url) });
  return client.readContract({ address: BASE_USDC, abi: USDC_ABI, functionName: 'balanceOf', args: [owner] });
}

/** Deploys the EIP-1271 test wallet owned by `owner`; returns its address. */
export async function deploySmartWallet(url: string, deployerKey: Hex, owner: Hex): Promise<Hex> {
  const wallet = compileTestContracts().TestSmartWallet;
  if (!wallet) throw new Error('TestSmartWallet did not compile');
  const client = testClient(url, deployerKey);
  const hash = await client.deployContract({ abi: wallet.abi, bytecode: wallet.bytecode, args: [owner] });
  const receipt = await client.waitForTransactionReceipt({ hash });
  if (!receipt.contractAddress) throw new Error('smart wallet not deployed');
  return receipt.contractAddress;
}

const FACTORY_ABI = parseAbi([
  'function deploy(address owner, bytes32 salt) returns (address)',
  'function addressOf(address owner, bytes32 salt) view returns (address)',
]);

/** Deploys the ERC-6492 wallet factory; returns its address. */
export async function deployWalletFactory(url: string, deployerKey: Hex): Promise<Hex> {
  const factory = compileTestContracts().TestSmartWalletFactory;
  if (!factory) throw new Error('TestSmartWalletFactory did not compile');
  const client = testClient(url, deployerKey);
  const hash = await client.deployContract({ abi: factory.abi, bytecode: factory.bytecode });
  const receipt = await client.waitForTransactionReceipt({ hash });
  if (!receipt.contractAddress) throw new Error('wallet factory not deployed');
  return receipt.contractAddress;
}

/** A wallet that does not exist yet: its CREATE2 address and the factory call that would deploy it. */
export async function counterfactualWallet(url: string, factory: Hex, owner: Hex, salt: Hex) {
  const client = createPublicClient({ chain: base, transport: http(url) });
  const address = await client.readContract({
    address: factory,
    abi: FACTORY_ABI,
    functionName: 'addressOf',
    args: [owner, salt],
  });
  const factoryCalldata = encodeFunctionData({
    abi: FACTORY_ABI,
    functionName: 'deploy',
    args: [owner, salt],
  });
  return {
    address,
    factory,
    factoryCalldata,
    /** Wraps the owner's signature as ERC-6492: (factory, factoryCalldata, signature) ++ magic suffix. */
    wrap: (signature: Hex) =>
      serializeErc6492Signature({ address: factory, data: factoryCalldata, signature }),
    /** Deploys it through the factory (as anyone may). */
    async deploy(deployerKey: Hex) {
      const wallet = testClient(url, deployerKey);
      const hash = await wallet.sendTransaction({ to: factory, data: factoryCalldata });
      await wallet.waitForTransactionReceipt({ hash });
    },
  };
}
