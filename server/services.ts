/**
 * The composition root: from the parsed configuration to everything `createApp` needs. The only place that
 * knows which implementation serves which port.
 */
import type { Logger } from 'pino';
import type { AppDeps } from './app.ts';
import { loadCatalog } from './catalog/load.ts';
import { type CatalogService, createCatalogService } from './catalog/service.ts';
import type { Config } from './config.ts';
import { type Charges, createCharges } from './domains/billing/charges.ts';
import { createBillingHandlers } from './domains/billing/handlers.ts';
import { createCatalogHandlers } from './domains/catalog/handlers.ts';
import { createFileConverter } from './domains/chat/files/converter.ts';
import { createChatHandlers } from './domains/chat/handlers.ts';
import { createChatProviders } from './domains/chat/providers.ts';
import { createChatService } from './domains/chat/service.ts';
import { createScraper } from './domains/chat/web/scrape.ts';
import { createDecisionHandlers } from './domains/decisions/handlers.ts';
import { createDecisionService } from './domains/decisions/service.ts';
import { createMediaHandlers } from './domains/embeddings/media.ts';
import { createImageHandlers } from './domains/images/handlers.ts';
import { createImageProviders } from './domains/images/providers.ts';
import { createImageService } from './domains/images/service.ts';
import { cacheApiKeys } from './domains/keys/cache.ts';
import { createKeyHandlers } from './domains/keys/handlers.ts';
import { createRateLimiter } from './domains/limits/rate-limiter.ts';
import { createRpcDomain, type RpcDomain } from './domains/rpc/index.ts';
import { createTtlCache } from './domains/ttl-cache.ts';
import { mountVideoDownloads } from './domains/video/download-route.ts';
import { createVideoHandlers } from './domains/video/handlers.ts';
import { createVideoProviders } from './domains/video/providers.ts';
import { createVideoService, type VideoService } from './domains/video/service.ts';
import { createVideoWorker, type VideoWorker } from './domains/video/worker.ts';
import { discoveryPaymentRequired } from './domains/wallet/discovery.ts';
import { createWalletDomain, type WalletDomain } from './domains/wallet/index.ts';
import { createHandlers } from './handlers.ts';
import type { ApiKeyPrincipal, AuthPorts, Principal } from './http/auth.ts';
import { NO_HEADERS, type ReplyHeaders } from './http/contract.ts';
import { createInFlight } from './http/in-flight.ts';
import { loadContract } from './http/spec.ts';
import { formatUsdFixed, nanoToUsdNumber } from './money.ts';
import { extend, innerMap, whenReady } from './objects.ts';
import { createMetrics } from './observability/metrics.ts';
import { createSearxngSearch } from './providers/search/searxng.ts';
import type { Facilitator } from './providers/x402/facilitator.ts';
import { type AccountsRepository, createAccounts } from './storage/accounts.ts';
import { type ApiKeysRepository, type AuthenticateResult, createApiKeys } from './storage/api-keys.ts';
import { type CreateDatabaseOptions, createDatabase, type Database } from './storage/database.ts';
import { createIdempotency, type IdempotencyStore } from './storage/idempotency.ts';
import { type BalanceBefore, balanceBefore, createLedger, type LedgerRepository } from './storage/ledger.ts';
import { migrate } from './storage/migrations.ts';
import { createRateLimits, type RateLimitsRepository } from './storage/rate-limits.ts';
import { createVideoJobs, type VideoJobsRepository } from './storage/video-jobs.ts';

export type Services = {
  config: Config;
  database: Database;
  catalog: CatalogService;
  accounts: AccountsRepository;
  keys: ApiKeysRepository;
  ledger: LedgerRepository;
  rateLimits: RateLimitsRepository;
  idempotency: IdempotencyStore;
  rpc: RpcDomain;
  /** Video jobs: the store, the service and this instance's worker (`main.ts` starts and stops it). */
  video: { jobs: VideoJobsRepository; service: VideoService; worker: VideoWorker };
  /** Reserve -> capture -> release for every paid operation (wallets get the wallet 402). */
  charges: Charges;
  wallet: WalletDomain;
  app: AppDeps;
  close(): Promise<void>;
};

export type ServicesOptions = {
  /** Replaces the x402 facilitator the configuration describes (tests). */
  facilitator?: Facilitator;
  /** Options of the database connection (tests count round trips with `onQuery`). */
  database?: CreateDatabaseOptions;
};

export async function createServices(
  config: Config,
  logger: Logger,
  options: ServicesOptions = {},
): Promise<Services> {
  const contract = loadContract();
  const loadedCatalog = loadCatalog(
    config.serviceConfigPath ? { overridePath: config.serviceConfigPath } : {},
  );
  const catalog = createCatalogService(loadedCatalog, { publicBaseUrl: config.publicOrigin });
  const databaseOptions: CreateDatabaseOptions = {
    preparedStatements: config.databasePreparedStatements,
    accountConcurrency: config.databaseAccountConcurrency,
    accountBatch: config.databaseAccountBatch,
    checkpointIntervalMs: config.sqliteCheckpointIntervalMs,
    // Each of several workers writes the one SQLite file (database.ts, sharedWriters).
    sharedWriters: config.workers > 1,
    ...options.database,
  };
  const database = await createDatabase(config.databaseUrl, databaseOptions);
  try {
    await migrate(database);
  } catch (error) {
    await database.close();
    throw error;
  }
  const accounts = createAccounts(database);
  const keys = cacheApiKeys(createApiKeys(database), { ttlMs: config.apiKeyCacheTtlMs });
  // The money this process's ledger entries moved, by type and currency (a counter: charges as positive amounts).
  // By type, then by currency: no label text made per entry (a new string, hashed before each lookup).
  const entriesMoved = new Map<string, Map<string, bigint>>();
  // One process on SQLite holds its requests' reservations in memory (held-reservations.ts); workers that
  // share the file hold them in its rows, as PostgreSQL's instances do.
  const ledger = createLedger(database, {
    holdsInMemory: databaseOptions.sharedWriters !== true && config.sqliteMemoryHolds,
    onEntries(entries) {
      for (const entry of entries) {
        const byCurrency = innerMap(entriesMoved, entry.type);
        const amount = entry.amountNano < 0n ? -entry.amountNano : entry.amountNano;
        byCurrency.set(entry.currency, (byCurrency.get(entry.currency) ?? 0n) + amount);
      }
    },
  });
  // One process on SQLite counts rate limits in memory and writes them behind (held-counts.ts); workers that
  // share the file count in its rows, as PostgreSQL's instances do.
  const countsHeld = databaseOptions.sharedWriters !== true && config.sqliteRateLimitFlushMs > 0;
  const rateLimits = createRateLimits(database, {
    held: countsHeld,
    heldCounts: { flushMs: config.sqliteRateLimitFlushMs },
  });
  const idempotency = createIdempotency(database);
  const metrics = createMetrics();
  const inFlight = createInFlight();
  // The account's Pro flag decides its rate-limit tier and access to Pro models; read on every request, so
  // reused for API_KEY_CACHE_TTL_MS (a change made elsewhere applies within that bound).
  const proFlags = createTtlCache(async (accountId: string) => (await accounts.get(accountId)).pro, {
    ttlMs: config.apiKeyCacheTtlMs,
  });
  const isPro = (accountId: string) => proFlags.get(accountId);
  const tierName = (pro: boolean) => (pro ? 'partner' : 'paid');
  /** The account's rate-limit tier: itself when its Pro flag is cached (no promise), else once read. */
  const tierAt = (accountId: string): string | Promise<string> => {
    const pro = proFlags.peek(accountId);
    return pro ? tierName(pro.value) : isPro(accountId).then(tierName);
  };
  const tierOf = async (accountId: string) => tierAt(accountId);
  const limiter = createRateLimiter({ rateLimits, catalog });
  const wallet = createWalletDomain({
    config,
    database,
    accounts,
    ledger,
    logger,
    ...(options.facilitator ? { facilitator: options.facilitator } : {}),
    housekeepingIntervalMs: 60_000,
    paidOperations: new Set(
      contract.operations.filter((op) => op.declaresPaymentRequired).map((op) => op.operationId),
    ),
  });
  // The balance the first reservation of each request found, by the request's principal (authentication answers
  // a new principal object for every request, AuthPorts): its `x-service-balance-*` headers without reading it.
  const balancesBefore = new WeakMap<Principal, BalanceBefore>();
  const charges = createCharges({
    ledger,
    reservationTtlMs: config.reservationTtlMs,
    walletPaymentRequired: wallet.walletPaymentRequired,
    reserved(principal, before) {
      if (!balancesBefore.has(principal)) balancesBefore.set(principal, before);
    },
    detachedFailed(reservation, error) {
      logger.error(
        { err: error, reservationId: reservation.id, requestId: reservation.requestId },
        'capture failed: its reservation was released and nothing was charged for the request',
      );
    },
  });
  let rpc: RpcDomain;
  try {
    rpc = createRpcDomain({
      config: config.rpc,
      section: loadedCatalog.extra.rpc,
      database,
      rateLimits,
      charges,
      idempotency,
      // Held as the rate limits' counts are, written behind with them (held-credits.ts).
      ...(countsHeld ? { heldCredits: { flushMs: config.sqliteRateLimitFlushMs } } : {}),
    });
  } catch (error) {
    wallet.close();
    await database.close();
    throw error;
  }

  /** The principal of an authenticated key (its last use written behind, at most once a second). */
  const keyPrincipal = (result: AuthenticateResult): ApiKeyPrincipal | undefined => {
    if (!result.ok) return undefined;
    keys
      .touchIfDue(result.key.id)
      ?.catch((error: unknown) => logger.warn({ err: error }, 'last-used update failed'));
    return {
      kind: 'apiKey',
      accountId: result.key.accountId,
      keyId: result.key.id,
      keyType: result.key.keyType,
      spendLimited: result.key.limitUsdNano !== null || result.key.limitDiemNano !== null,
    };
  };
  const auth: AuthPorts = {
    // A cached key at once, without a promise; the others once looked up.
    authenticateApiKey(secret) {
      const cached = keys.authenticateCached(secret);
      return cached ? keyPrincipal(cached) : keys.authenticate(secret).then(keyPrincipal);
    },
    verifySignInWithX: wallet.verifySignInWithX,
    paymentRequired: (req, op) =>
      discoveryPaymentRequired(
        { publicOrigin: config.publicOrigin, ...config.x402 },
        { path: req.originalUrl.split('?')[0] ?? '', description: op.summary },
      ),
  };

  const chat = createChatService({
    catalog,
    charges,
    isPro,
    providerFor: createChatProviders({ config, metrics }),
    callBeforeHold: config.chat.callBeforeHold,
    tokenCount: (principal, modelId, tokens) =>
      whenReady(tierAt(principal.accountId), (tier) => limiter.tokenCount(principal, tier, modelId, tokens)),
    convertFile: createFileConverter(),
    web: {
      scraper: createScraper(config.scrape),
      ...(config.search.searxngUrl
        ? {
            search: createSearxngSearch({
              baseUrl: config.search.searxngUrl,
              timeoutMs: config.search.timeoutMs,
            }),
          }
        : {}),
    },
  });

  const videoJobs = createVideoJobs(database);
  const videoWorker = createVideoWorker({
    jobs: videoJobs,
    ledger,
    catalog,
    providerFor: createVideoProviders({ config, upstreamPollMs: config.video.upstreamPollMs }),
    leaseMs: config.video.leaseMs,
    pollIntervalMs: config.video.pollIntervalMs,
    concurrency: config.video.concurrency,
    logger,
  });
  const video = createVideoService({
    catalog,
    charges,
    ledger,
    jobs: videoJobs,
    isPro,
    mediaTtlMs: config.video.mediaTtlMs,
    wake: () => videoWorker.wake(),
    publicOrigin: config.publicOrigin,
  });

  const handlers = createHandlers({
    ...createChatHandlers({ chat, timeoutMs: config.chat.timeoutMs, idempotency }),
    ...createCatalogHandlers(catalog),
    ...createImageHandlers({
      images: createImageService({
        catalog,
        charges,
        isPro,
        providerFor: createImageProviders({ config, metrics }),
      }),
    }),
    ...createKeyHandlers({
      keys,
      ledger,
      rateLimits,
      tierOf,
      rateLimitsFor: (tier) => catalog.rateLimits(tier) ?? [],
    }),
    ...createBillingHandlers({ ledger, keys, modelType: (id) => catalog.getModel(id)?.type }),
    ...rpc.handlers,
    ...createVideoHandlers({ video }),
    ...createDecisionHandlers({
      decisions: createDecisionService({
        catalog,
        charges,
        isPro,
        providerFor: createChatProviders({ config, metrics }),
      }),
    }),
    ...createMediaHandlers({ config, catalog, charges, metrics, accounts, limiter, tierOf }),
    ...wallet.handlers,
  });

  metrics.addGauge({
    name: 'http_requests_in_flight',
    help: 'Requests this process is serving: arrived and not yet answered or abandoned.',
    read: async () => ({ '': inFlight.count() }),
  });
  metrics.addGauge({
    name: 'ledger_usd',
    help: 'USD held across accounts (balance) and held by open reservations (reserved).',
    read: async () => {
      const totals = await ledger.totals();
      return {
        'kind="balance"': nanoToUsdNumber(totals.usdBalanceNano),
        'kind="reserved"': nanoToUsdNumber(totals.usdReservedNano),
      };
    },
  });
  metrics.addCounter({
    name: 'ledger_entries_usd_total',
    help: 'USD moved by the ledger entries this process wrote, by type and currency (charges counted positive).',
    read: async () =>
      Object.fromEntries(
        [...entriesMoved].flatMap(([type, byCurrency]) =>
          [...byCurrency].map(([currency, nano]) => [
            `type="${type}",currency="${currency}"`,
            nanoToUsdNumber(nano),
          ]),
        ),
      ),
  });

  const inferenceOperations = new Set(
    contract.operations.filter((op) => op.declaresPaymentRequired).map((op) => op.operationId),
  );

  const balanceHeadersOf = (before: BalanceBefore): ReplyHeaders => ({
    'x-service-balance-usd': formatUsdFixed(before.usdNano, 8),
    'x-service-balance-diem': formatUsdFixed(before.diemNano, 8),
  });

  /**
   * The balance before the request, which every inference answer reports: as its reservation found it (at
   * once), or, when it reserved nothing (it failed before, or costs nothing), read now (nothing was taken
   * meanwhile).
   */
  function balanceHeaders(principal: Principal): ReplyHeaders | Promise<ReplyHeaders> {
    const before = balancesBefore.get(principal);
    if (before) return balanceHeadersOf(before);
    return ledger.getBalance(principal.accountId).then(
      (balance) => balanceHeadersOf(balanceBefore(balance)),
      // The work is done (or failed for its own reason): a balance that cannot be read is not reported.
      () => NO_HEADERS,
    );
  }

  const app: AppDeps = {
    config,
    contract,
    logger,
    auth,
    handlers,
    metrics,
    readiness: () => database.ping(),
    mountRoutes: (express) => mountVideoDownloads(express, { video }),
    acquireSlot: (input) => wallet.acquireSlot(input),
    inFlight,
    settled: (accountId) => charges.settled(accountId),
    replyHeaders(input) {
      // `X-Balance-Remaining` is the balance after the request: after its capture, which the reply does not
      // otherwise wait for (Charges.captureDetached). A request without it (an API key's) waits for nothing.
      if (input.principal.kind !== 'wallet') return undefined;
      const settled = charges.settled(input.principal.accountId);
      return settled
        ? settled.then(() => wallet.replyHeaders(input) ?? NO_HEADERS)
        : wallet.replyHeaders(input);
    },
    admit({ operationId, principal, body }) {
      const requested = (body as { model?: unknown } | undefined)?.model;
      const model = typeof requested === 'string' ? requested : undefined;
      // Inference answers carry the model's deprecation notices.
      const withNotices = (limits: ReplyHeaders): ReplyHeaders => {
        const resolved =
          model && inferenceOperations.has(operationId) ? catalog.resolveModel(model) : undefined;
        if (!resolved) return limits;
        return extend(limits, catalog.deprecationHeaders(resolved.remappedFrom ?? resolved.model));
      };
      // The JSON-RPC proxy has its own per-minute and credit caps.
      if (operationId === 'callCryptoRpc') return withNotices(NO_HEADERS);
      // Polling a video job and cleaning it up are free: they count against the general per-minute budget,
      // not the model's (40 queued jobs a minute would allow little polling).
      const budget = operationId === 'retrieveVideo' || operationId === 'completeVideo' ? undefined : model;
      // At once, no promise, when the tier is cached and the counts are held (one SQLite process).
      const admission = whenReady(tierAt(principal.accountId), (tier) =>
        limiter.admit(principal, tier, budget),
      );
      return whenReady(admission, (admitted) => withNotices(admitted.headers));
    },
    answerHeaders: ({ operationId, principal }) =>
      inferenceOperations.has(operationId) ? balanceHeaders(principal) : NO_HEADERS,
  };

  return {
    config,
    database,
    catalog,
    accounts,
    keys,
    ledger,
    rateLimits,
    idempotency,
    rpc,
    video: { jobs: videoJobs, service: video, worker: videoWorker },
    charges,
    wallet,
    app,
    close: async () => {
      // The captures the answers already written did not wait for are committed before the database closes.
      await charges.idle();
      rpc.close();
      await videoWorker.stop();
      wallet.close();
      await rpc.credits.close();
      await rateLimits.close();
      return database.close();
    },
  };
}
