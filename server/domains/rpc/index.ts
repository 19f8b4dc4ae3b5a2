/**
 * Assembly of the JSON-RPC proxy from the configuration: networks with their upstreams (environment over the
 * `rpc` section of SERVICE_CONFIG), one HTTP upstream per served network, the credit counter and the service.
 */
import type { Config } from '../../config.ts';
import { parseUsdToNano } from '../../money.ts';
import { createHttpRpcUpstream } from '../../providers/rpc/http.ts';
import type { RpcUpstream } from '../../providers/rpc/port.ts';
import type { Database } from '../../storage/database.ts';
import type { RateLimitsRepository } from '../../storage/rate-limits.ts';
import { createRpcCredits, type RpcCreditsRepository } from '../../storage/rpc-credits.ts';
import type { Charges } from '../billing/charges.ts';
import { createRpcHandlers } from './handlers.ts';
import { resolveNetworks } from './networks.ts';
import { createRpcService, type IdempotencyPort, type RpcService } from './service.ts';

export type RpcDomainDeps = {
  config: Config['rpc'];
  /** The `rpc` section of the catalogue file (`catalog.extra.rpc`), unchecked. */
  section: unknown;
  database: Database;
  rateLimits: RateLimitsRepository;
  charges: Charges;
  idempotency?: IdempotencyPort;
  /**
   * Hold the callers' credit windows in this process and write them behind every `flushMs` (rpc-credits.ts
   * `held`): only where no other process counts in the database (one process on SQLite).
   */
  heldCredits?: { flushMs: number };
};

export type RpcDomain = {
  service: RpcService;
  credits: RpcCreditsRepository;
  handlers: ReturnType<typeof createRpcHandlers>;
  close(): void;
};

export function createRpcDomain(deps: RpcDomainDeps): RpcDomain {
  const networks = resolveNetworks({
    upstreamsBySlug: deps.config.upstreams,
    section: deps.section,
    timeoutMs: deps.config.upstreamTimeoutMs,
  });
  const upstreams = new Map<string, RpcUpstream>();
  for (const network of networks.values()) {
    if (network.upstreams.length === 0) continue;
    upstreams.set(
      network.slug,
      createHttpRpcUpstream({ endpoints: network.upstreams, maxResponseBytes: deps.config.maxResponseBytes }),
    );
  }
  const credits = createRpcCredits(
    deps.database,
    deps.heldCredits ? { held: true, heldCredits: deps.heldCredits } : {},
  );
  const service = createRpcService({
    networks,
    upstreams,
    charges: deps.charges,
    rateLimits: deps.rateLimits,
    credits,
    ...(deps.idempotency ? { idempotency: deps.idempotency } : {}),
    pricePerCreditNano: parseUsdToNano(deps.config.pricePerCreditUsd),
    limits: {
      requestsPerMinute: deps.config.requestsPerMinute,
      staffRequestsPerMinute: deps.config.staffRequestsPerMinute,
      staffAccounts: new Set(deps.config.staffAccounts),
      creditsPerDay: deps.config.creditsPerDay,
    },
  });
  return {
    service,
    credits,
    handlers: createRpcHandlers(service),
    close() {
      for (const upstream of upstreams.values()) upstream.close();
    },
  };
}
