/**
 * The networks the JSON-RPC proxy knows (the interface's table): slug, method family, chain id, test network
 * or not, and base credits; and how the operator's configuration (the `RPC_UPSTREAM_<SLUG>` variables and the
 * `rpc` section of the `SERVICE_CONFIG` file) turns them into served networks with upstream nodes. Resolved
 * once at start.
 */
import { z } from 'zod';
import { extend } from '../../objects.ts';
import type { RpcFamily } from './methods.ts';

export type RpcNetworkDefinition = {
  slug: string;
  family: RpcFamily;
  /** Decimal chain id (EVM), short-string id (Starknet), genesis-hash prefix (Solana); null when unknown. */
  chainId: string | null;
  testnet: boolean;
  /** Credits of one standard (1x) call. */
  baseCredits: number;
};

export type UpstreamEndpoint = { url: string; timeoutMs: number };

/** A network with its configuration applied. Served when it has at least one upstream. */
export type RpcNetwork = RpcNetworkDefinition & { upstreams: UpstreamEndpoint[] };

const evm = (slug: string, chainId: string | null, testnet: boolean, baseCredits = 20) =>
  ({ slug, family: 'evm', chainId, testnet, baseCredits }) as const;

/** Every network of the interface, sorted by slug. */
export const RPC_NETWORKS: readonly RpcNetworkDefinition[] = [
  evm('arbitrum-mainnet', '42161', false),
  evm('arbitrum-sepolia', '421614', true),
  evm('avalanche-fuji', '43113', true),
  evm('avalanche-mainnet', '43114', false),
  evm('base-mainnet', '8453', false),
  evm('base-sepolia', '84532', true),
  evm('blast-mainnet', '81457', false),
  evm('blast-sepolia', '168587773', true),
  evm('bsc-mainnet', '56', false),
  evm('bsc-testnet', '97', true),
  evm('ethereum-holesky', '17000', true),
  evm('ethereum-mainnet', '1', false),
  evm('ethereum-sepolia', '11155111', true),
  evm('linea-mainnet', '59144', false),
  evm('linea-sepolia', '59141', true),
  evm('optimism-mainnet', '10', false),
  evm('optimism-sepolia', '11155420', true),
  evm('polygon-amoy', '80002', true),
  evm('polygon-mainnet', '137', false),
  // The interface does not give Robinhood Chain's price or ids: 20 like the other EVM chains until the
  // operator sets them in the `rpc` section of SERVICE_CONFIG.
  evm('robinhood-mainnet', null, false),
  evm('robinhood-testnet', null, true),
  {
    slug: 'solana-devnet',
    family: 'solana',
    chainId: 'EtWTRABZaYq6iMfeYKouRu166VU2xqa1',
    testnet: true,
    baseCredits: 30,
  },
  {
    slug: 'solana-mainnet',
    family: 'solana',
    chainId: '5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp',
    testnet: false,
    baseCredits: 30,
  },
  { slug: 'starknet-mainnet', family: 'starknet', chainId: 'SN_MAIN', testnet: false, baseCredits: 20 },
  { slug: 'starknet-sepolia', family: 'starknet', chainId: 'SN_SEPOLIA', testnet: true, baseCredits: 20 },
  evm('zksync-mainnet', '324', false, 30),
  evm('zksync-sepolia', '300', true, 30),
];

export const RPC_NETWORK_SLUGS: readonly string[] = RPC_NETWORKS.map((n) => n.slug);

/** `ethereum-mainnet` -> `RPC_UPSTREAM_ETHEREUM_MAINNET`. */
export function upstreamVariable(slug: string): string {
  return `RPC_UPSTREAM_${slug.toUpperCase().replaceAll('-', '_')}`;
}

const httpUrl = z.url({ protocol: /^https?$/, error: 'an http(s) URL' });

/** Splits a comma-separated list of upstream URLs (order = failover order). */
export function parseUpstreamList(value: string): string[] {
  return value
    .split(',')
    .map((url) => url.trim())
    .filter(Boolean);
}

/** The zod check of one `RPC_UPSTREAM_<SLUG>` value. */
export const upstreamListSchema = z
  .string()
  .transform(parseUpstreamList)
  .pipe(z.array(httpUrl).min(1, 'at least one http(s) URL'));

const slugSchema = z.enum(RPC_NETWORK_SLUGS as [string, ...string[]], {
  error: (issue) => `unknown network '${String(issue.input)}'`,
});

/** The `rpc` section of a SERVICE_CONFIG file: per-network overrides, all optional. */
export const rpcSectionSchema = z
  .strictObject({
    networks: z
      .partialRecord(
        slugSchema,
        z.strictObject({
          baseCredits: z.number().int().min(1).max(1_000_000).optional(),
          chainId: z.string().min(1).max(64).nullable().optional(),
          upstreams: z.array(httpUrl).min(1).optional(),
          timeoutMs: z.number().int().min(100).max(600_000).optional(),
        }),
      )
      .optional(),
  })
  .optional();

export type RpcSection = z.output<typeof rpcSectionSchema>;

export class RpcConfigError extends Error {
  override readonly name = 'RpcConfigError';
}

export type ResolveNetworksInput = {
  /** Upstream URLs from the environment, by slug (these win over the file). */
  upstreamsBySlug: Readonly<Record<string, readonly string[]>>;
  /** The `rpc` section of the catalogue file, unchecked. */
  section: unknown;
  /** Default per-attempt timeout of an upstream call. */
  timeoutMs: number;
};

/** Applies the configuration to the table. Throws RpcConfigError listing every problem of the `rpc` section. */
export function resolveNetworks(input: ResolveNetworksInput): Map<string, RpcNetwork> {
  const parsed = rpcSectionSchema.safeParse(input.section);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `rpc.${i.path.join('.')}: ${i.message}`);
    throw new RpcConfigError(`Invalid rpc section in SERVICE_CONFIG:\n  - ${problems.join('\n  - ')}`);
  }
  const overrides = parsed.data?.networks ?? {};
  const networks = new Map<string, RpcNetwork>();
  for (const definition of RPC_NETWORKS) {
    const override = overrides[definition.slug] ?? {};
    const timeoutMs = override.timeoutMs ?? input.timeoutMs;
    const urls = input.upstreamsBySlug[definition.slug] ?? override.upstreams ?? [];
    networks.set(
      definition.slug,
      extend(definition, {
        baseCredits: override.baseCredits ?? definition.baseCredits,
        chainId: override.chainId === undefined ? definition.chainId : override.chainId,
        upstreams: urls.map((url) => ({ url, timeoutMs })),
      }),
    );
  }
  return networks;
}
