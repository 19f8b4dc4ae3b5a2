/**
 * The wallet-credit domain, assembled: Sign-In-With-X for the auth layer, the x402 handlers, the wallet 402
 * for the charges, the per-wallet in-flight cap and the `X-Balance-Remaining` header. The composition root
 * (`server/services.ts`) plugs these into the app; nothing here knows about Express.
 */
import type { Request } from 'express';
import type { Logger } from 'pino';
import type { Config } from '../../config.ts';
import type { Principal, WalletPrincipal } from '../../http/auth.ts';
import type { ReplyHeaders } from '../../http/contract.ts';
import { ApiError } from '../../http/errors.ts';
import type { OperationId } from '../../http/spec.ts';
import { formatUsdFixed } from '../../money.ts';
import type { Eip3009Chain } from '../../providers/x402/evm-authorizations.ts';
import type { Facilitator } from '../../providers/x402/facilitator.ts';
import type { SolanaChain } from '../../providers/x402/solana-status.ts';
import type { AccountsRepository } from '../../storage/accounts.ts';
import type { Database } from '../../storage/database.ts';
import type { InsufficientBalanceError } from '../../storage/errors.ts';
import type { LedgerRepository } from '../../storage/ledger.ts';
import { createSiwxNonces } from '../../storage/siwx-nonces.ts';
import { createWalletSlots } from '../../storage/wallet-slots.ts';
import { createPendingSettlementStore, createX402Payments } from '../../storage/x402-payments.ts';
import { createTtlCache } from '../ttl-cache.ts';
import type { DiscoveryOptions } from './discovery.ts';
import { createWalletHandlers } from './handlers.ts';
import { MINIMUM_BALANCE_NANO, walletPaymentRequired } from './payment-required.ts';
import { createTopUpService, type TopUpService } from './top-up.ts';

/**
 * A port whose every method is asynchronous, backed by a module loaded on its first call: the x402, viem and
 * Solana stacks (about 80 MB of memory) load only once a wallet actually signs in or pays.
 */
function lazyPort<T extends object>(load: () => Promise<T>): T {
  let loaded: Promise<T> | undefined;
  return new Proxy({} as T, {
    get: (_target, name) => {
      if (name === 'then') return undefined; // not a thenable
      return async (...args: unknown[]) => {
        loaded ??= load();
        const port = (await loaded) as Record<string | symbol, unknown>;
        const method = port[name];
        // An optional method the loaded port lacks answers undefined, as `port.method?.()` would.
        return typeof method === 'function' ? method.apply(port, args) : undefined;
      };
    },
  });
}

/** Paid requests one wallet may have in flight at once. */
export const WALLET_MAX_IN_FLIGHT = 5;

export type WalletDomainDeps = {
  config: Config;
  database: Database;
  accounts: AccountsRepository;
  ledger: LedgerRepository;
  logger: Logger;
  /** Operations paid from credit (those that document 402). */
  paidOperations: ReadonlySet<OperationId>;
  /** Replaces the facilitator the configuration describes (tests). */
  facilitator?: Facilitator;
  /** Every so often: reconcile pending top-ups, prune nonces and leaked slots (0 or absent: never). */
  housekeepingIntervalMs?: number;
  now?: () => number;
};

/**
 * The facilitator the configuration describes: over HTTP when `X402_FACILITATOR_URL` is set, otherwise in
 * process for each rail whose RPC and key are set; undefined when there is none. Built lazily (the Solana key
 * import is asynchronous) behind the synchronous port.
 */
function configuredFacilitator(config: Config, database: Database): Facilitator | undefined {
  const x = config.x402;
  const facilitatorUrl = x.facilitatorUrl;
  if (facilitatorUrl)
    return lazyPort(async () =>
      (await import('../../providers/x402/http.ts')).createHttpFacilitator({ url: facilitatorUrl }),
    );
  const evm =
    x.baseRpcUrl && x.facilitatorPrivateKey
      ? {
          rpcUrl: x.baseRpcUrl,
          privateKey: x.facilitatorPrivateKey,
          eip6492AllowedFactories: x.eip6492Factories,
          pendingSettlementStore: createPendingSettlementStore(database),
        }
      : undefined;
  const solana =
    x.solanaRpcUrl && x.solanaFacilitatorPrivateKey
      ? { rpcUrl: x.solanaRpcUrl, secretKeyBase58: x.solanaFacilitatorPrivateKey }
      : undefined;
  if (!evm && !solana) return undefined;
  let built: Promise<Facilitator> | undefined;
  const get = () => {
    built ??= import('../../providers/x402/in-process.ts').then(({ createInProcessFacilitator }) =>
      createInProcessFacilitator({
        ...(evm ? { evm } : {}),
        ...(solana ? { solana } : {}),
      }),
    );
    return built;
  };
  return {
    verify: async (payload, requirements) => (await get()).verify(payload, requirements),
    settle: async (payload, requirements) => (await get()).settle(payload, requirements),
    supported: async () => (await get()).supported(),
    transactionId: async (payload, requirements) => (await get()).transactionId?.(payload, requirements),
  };
}

export function createWalletDomain(deps: WalletDomainDeps) {
  const { config, accounts, ledger } = deps;
  const discovery: DiscoveryOptions = {
    publicOrigin: config.publicOrigin,
    payToBase: config.x402.payToBase,
    payToSolana: config.x402.payToSolana,
    solanaFeePayer: config.x402.solanaFeePayer,
  };
  const facilitator = deps.facilitator ?? configuredFacilitator(config, deps.database);
  const { baseRpcUrl, solanaRpcUrl } = config.x402;
  const topUp: TopUpService | undefined =
    facilitator && (discovery.payToBase || discovery.payToSolana)
      ? createTopUpService({
          facilitator,
          payments: createX402Payments(deps.database),
          ledger,
          accounts,
          discovery,
          logger: deps.logger,
          chain: baseRpcUrl
            ? lazyPort<Eip3009Chain>(async () =>
                (await import('../../providers/x402/evm-authorizations.ts')).createEip3009Chain(baseRpcUrl),
              )
            : undefined,
          solana: solanaRpcUrl
            ? lazyPort<SolanaChain>(async () =>
                (await import('../../providers/x402/solana-status.ts')).createSolanaChain(solanaRpcUrl),
              )
            : undefined,
        })
      : undefined;
  const nonces = createSiwxNonces(deps.database);
  const slots = createWalletSlots(deps.database);
  // Built on the first sign-in: it needs viem and the x402 extensions.
  const verifier = lazyPort(async () => {
    const [{ createSiwxVerifier }, smart] = await Promise.all([
      import('./siwx.ts'),
      baseRpcUrl ? import('../../providers/x402/smart-wallet-verifier.ts') : undefined,
    ]);
    return createSiwxVerifier({
      publicOrigin: config.publicOrigin,
      consumeNonce: (input) => nonces.consume(input),
      smartWalletVerifier:
        smart && baseRpcUrl
          ? smart.createSmartWalletVerifier({
              rpcUrl: baseRpcUrl,
              allowedFactories: config.x402.eip6492Factories,
            })
          : undefined,
      now: deps.now,
    });
  });

  // A wallet's account id, by its normalised address: made on its first sign-in and never changed or deleted
  // afterwards, so it is kept for good (up to 10,000 wallets), and a wallet's later requests skip the
  // find-or-create (an insert that does nothing, then a select).
  const walletAccountIds = createTtlCache(
    async (address: string) => (await accounts.findOrCreateWalletAccount(address)).account.id,
    { ttlMs: Number.POSITIVE_INFINITY },
  );

  async function verifySignInWithX(header: string, _req?: Request): Promise<WalletPrincipal> {
    const signIn = await verifier.verify(header);
    const accountId = await walletAccountIds.get(signIn.normalizedAddress);
    return { kind: 'wallet', accountId, walletAddress: signIn.address };
  }

  const paymentRequired = (input: { currentBalanceNano?: bigint; requiredNano?: bigint }) =>
    walletPaymentRequired(discovery, input);

  /** Reconciles pending top-ups, drops old nonces and leaked slots. */
  async function housekeeping(at: number = Date.now()): Promise<void> {
    await Promise.all([nonces.prune(at), slots.prune(at)]);
    if (topUp) {
      const counts = await topUp.reconcile(at);
      if (counts.credited + counts.failed > 0) deps.logger.info(counts, 'x402 pending top-ups reconciled');
    }
  }
  const timer = deps.housekeepingIntervalMs
    ? setInterval(() => {
        housekeeping().catch((error: unknown) =>
          deps.logger.error({ err: error }, 'wallet housekeeping failed'),
        );
      }, deps.housekeepingIntervalMs)
    : undefined;
  timer?.unref();

  const isPaid = (operationId: OperationId, principal: Principal) =>
    principal.kind === 'wallet' && deps.paidOperations.has(operationId);

  /** A paid request's slot (WalletDomain.acquireSlot). */
  async function takeSlot(accountId: string): Promise<() => void> {
    const { id, balance } = await slots.take({
      accountId,
      max: WALLET_MAX_IN_FLIGHT,
      leaseMs: config.reservationTtlMs,
    });
    if (id === undefined) {
      throw new ApiError(
        429,
        `Too many concurrent requests: a wallet may have at most ${WALLET_MAX_IN_FLIGHT} paid requests in flight`,
        { code: 'X402_CONCURRENCY_LIMIT' },
      );
    }
    const free = () =>
      slots
        .release(id)
        .catch((error: unknown) => deps.logger.warn({ err: error }, 'wallet slot release failed'));
    const available = balance.usdAvailableNano + balance.diemAvailableNano;
    if (available < MINIMUM_BALANCE_NANO) {
      await free();
      throw paymentRequired({ currentBalanceNano: available });
    }
    return () => {
      void free();
    };
  }

  async function balanceRemaining(accountId: string): Promise<ReplyHeaders> {
    const balance = await ledger.getBalance(accountId);
    return { 'X-Balance-Remaining': formatUsdFixed(balance.usdAvailableNano, 6) };
  }

  return {
    verifySignInWithX,
    discovery,
    topUp,
    handlers: createWalletHandlers({ ledger, publicOrigin: config.publicOrigin, topUp }),

    /** For createCharges: the wallet 402 with what the wallet could spend. */
    walletPaymentRequired(_principal: Principal, requiredNano: bigint, refusal: InsufficientBalanceError) {
      return paymentRequired({
        currentBalanceNano: refusal.usdAvailableNano + refusal.diemAvailableNano,
        requiredNano,
      });
    },

    /**
     * A paid request of a wallet takes one of its WALLET_MAX_IN_FLIGHT slots, across every process (429 when
     * none is free), and is admitted only if the wallet holds the admission minimum (the wallet 402 before any
     * work, its slot freed first). One round trip: the balance is read with the slot, under the same lock.
     * Returns what frees the slot once the request is done; undefined at once (no promise) when the request
     * takes no slot.
     */
    acquireSlot(input: {
      operationId: OperationId;
      principal: Principal;
    }): Promise<(() => void) | undefined> | undefined {
      return isPaid(input.operationId, input.principal) ? takeSlot(input.principal.accountId) : undefined;
    },

    /**
     * `X-Balance-Remaining`: the wallet's spendable credit in USD once the handler is done; undefined (no
     * promise) for a request that is not a wallet's paid one.
     */
    replyHeaders(input: {
      operationId: OperationId;
      principal: Principal;
    }): Promise<ReplyHeaders> | undefined {
      return isPaid(input.operationId, input.principal)
        ? balanceRemaining(input.principal.accountId)
        : undefined;
    },

    housekeeping,
    /** Stops the housekeeping timer. */
    close() {
      if (timer) clearInterval(timer);
    },
  };
}

export type WalletDomain = ReturnType<typeof createWalletDomain>;
