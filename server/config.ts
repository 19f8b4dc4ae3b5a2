/**
 * Configuration, parsed once from the environment. Nothing else in the server reads `process.env`.
 * `loadConfig` fails fast with every problem listed, so a misconfigured server never starts half-working.
 * Every variable is documented in `.env.example` and the README.
 */
import { hostname } from 'node:os';
import { z } from 'zod';
import { RPC_NETWORK_SLUGS, upstreamListSchema, upstreamVariable } from './domains/rpc/networks.ts';
import { IDLE_POLL_US } from './http/idle-poll.ts';
import { ACCOUNT_CONCURRENCY, BATCH_MAX } from './storage/account-gate.ts';
import { CHECKPOINT_INTERVAL_MS } from './storage/database.ts';
import { FLUSH_MS } from './storage/held-counts.ts';

const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no', 'on', 'off'])
  .transform((v) => v === 'true' || v === '1' || v === 'yes' || v === 'on');

const port = z.coerce.number().int().min(0).max(65_535);

/** Decimal USD with at most 9 decimal places, kept as a string so it can be parsed exactly. */
const usd = z.string().regex(/^\d{1,9}(\.\d{1,9})?$/, 'a decimal USD amount such as 10 or 2.50');

const variables = z.object({
  NODE_ENV: z.enum(['development', 'test', 'production']).default('development'),
  PORT: port.default(3000),
  HOST: z.string().min(1).default('127.0.0.1'),
  PUBLIC_ORIGIN: z.url().optional(),
  DATABASE_URL: z
    .string()
    .regex(/^(sqlite:|postgres:\/\/|postgresql:\/\/)/, 'sqlite:<path>, sqlite::memory: or postgres://…')
    .default('sqlite:./data/service.db'),
  DATABASE_PREPARED_STATEMENTS: bool.default(true),
  DATABASE_ACCOUNT_CONCURRENCY: z.coerce.number().int().min(0).max(1_000).default(ACCOUNT_CONCURRENCY),
  DATABASE_ACCOUNT_BATCH: z.coerce.number().int().min(1).max(100).default(BATCH_MAX),
  SQLITE_CHECKPOINT_INTERVAL_MS: z.coerce
    .number()
    .int()
    .min(1)
    .max(3_600_000)
    .default(CHECKPOINT_INTERVAL_MS),
  SQLITE_RATE_LIMIT_FLUSH_MS: z.coerce.number().int().min(0).max(60_000).default(FLUSH_MS),
  SQLITE_MEMORY_HOLDS: bool.default(true),
  SERVICE_CONFIG: z.string().min(1).optional(),
  ADMIN_API_KEY: z.string().min(20, 'at least 20 characters').optional(),
  BOOTSTRAP_BALANCE_USD: usd.default('10'),
  VALIDATE_RESPONSES: bool.optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  CORS_ORIGINS: z.string().default('*'),
  SHUTDOWN_GRACE_MS: z.coerce.number().int().min(0).max(600_000).default(10_000),
  IDLE_POLL_US: z.coerce.number().int().min(0).max(100_000).default(IDLE_POLL_US),
  WORKERS: z.coerce.number().int().min(1).max(64).default(1),
  SERVICE_HOST_NAME: z.string().min(1).default(hostname()),
  SERVICE_COLO: z
    .string()
    .regex(/^[A-Z]{3}$/, 'three upper-case letters')
    .default('LOC'),
  RESERVATION_TTL_MS: z.coerce.number().int().min(1_000).max(86_400_000).default(900_000),
  API_KEY_CACHE_TTL_MS: z.coerce.number().int().min(0).max(60_000).default(1_000),
  X402_PAY_TO_BASE: z
    .string()
    .regex(/^0x[0-9a-fA-F]{40}$/, 'an EVM address')
    .optional(),
  X402_PAY_TO_SOLANA: z
    .string()
    .regex(/^[1-9A-HJ-NP-Za-km-z]{32,44}$/, 'a Solana address')
    .optional(),
  X402_SOLANA_FEE_PAYER: z
    .string()
    .regex(/^[1-9A-HJ-NP-Za-km-z]{32,44}$/, 'a Solana address')
    .optional(),
  JSON_BODY_LIMIT_MB: z.coerce.number().int().min(1).max(100).default(35),
  CHAT_TIMEOUT_MS: z.coerce.number().int().min(100).max(3_600_000).default(300_000),
  UPSTREAM_TIMEOUT_MS: z.coerce.number().int().min(100).max(3_600_000).default(120_000),
  LOCAL_CHAT_TOKEN_DELAY_MS: z.coerce.number().int().min(0).max(1_000).default(0),
  CHAT_CALL_BEFORE_HOLD: bool.default(false),
  RPC_PRICE_PER_CREDIT_USD: usd.default('0.0000007'),
  RPC_UPSTREAM_TIMEOUT_MS: z.coerce.number().int().min(100).max(600_000).default(10_000),
  RPC_MAX_RESPONSE_MB: z.coerce.number().int().min(1).max(512).default(32),
  RPC_REQUESTS_PER_MINUTE: z.coerce.number().int().min(1).default(100),
  RPC_STAFF_REQUESTS_PER_MINUTE: z.coerce.number().int().min(1).default(1000),
  RPC_STAFF_ACCOUNTS: z.string().default(''),
  RPC_CREDITS_PER_DAY: z.coerce.number().int().min(1).default(10_000_000),
  // RPC_UPSTREAM_<SLUG>: comma-separated upstream node URLs of one network, in failover order.
  ...(Object.fromEntries(
    RPC_NETWORK_SLUGS.map((slug) => [upstreamVariable(slug), upstreamListSchema.optional()]),
  ) as Record<string, z.ZodOptional<typeof upstreamListSchema>>),
  SEARXNG_URL: z
    .url()
    .regex(/^https?:\/\//, 'an http(s) URL')
    .optional(),
  SEARCH_TIMEOUT_MS: z.coerce.number().int().min(100).max(120_000).default(10_000),
  SCRAPE_ALLOW_PRIVATE_NETWORKS: bool.default(false),
  SCRAPE_MAX_BYTES: z.coerce.number().int().min(1_024).max(50_000_000).default(2_000_000),
  SCRAPE_TIMEOUT_MS: z.coerce.number().int().min(100).max(120_000).default(10_000),
  SCRAPE_MAX_REDIRECTS: z.coerce.number().int().min(0).max(20).default(5),
  VIDEO_WORKER_ENABLED: bool.default(true),
  VIDEO_WORKER_CONCURRENCY: z.coerce.number().int().min(1).max(64).default(1),
  VIDEO_WORKER_POLL_MS: z.coerce.number().int().min(10).max(60_000).default(1_000),
  VIDEO_JOB_LEASE_MS: z.coerce.number().int().min(1_000).max(3_600_000).default(60_000),
  VIDEO_MEDIA_TTL_HOURS: z.coerce.number().int().min(1).max(720).default(24),
  VIDEO_UPSTREAM_POLL_MS: z.coerce.number().int().min(10).max(60_000).default(2_000),
  X402_FACILITATOR_URL: z.url().optional(),
  X402_BASE_RPC_URL: z.url().optional(),
  X402_FACILITATOR_PRIVATE_KEY: z
    .string()
    .regex(/^0x[0-9a-fA-F]{64}$/, 'a 32-byte hex private key (0x…)')
    .optional(),
  X402_SOLANA_RPC_URL: z.url().optional(),
  X402_SOLANA_FACILITATOR_PRIVATE_KEY: z
    .string()
    .regex(/^[1-9A-HJ-NP-Za-km-z]{64,90}$/, 'a base58 64-byte Solana secret key')
    .optional(),
  X402_EIP6492_FACTORIES: z
    .string()
    .regex(/^(0x[0-9a-fA-F]{40})(,0x[0-9a-fA-F]{40})*$/, 'comma-separated EVM addresses')
    .optional(),
});

/** Every environment variable the server reads (the README and .env.example document each). */
export const CONFIG_VARIABLES = Object.keys(variables.shape);

const schema = variables.transform((env) => ({
  env: env.NODE_ENV,
  port: env.PORT,
  host: env.HOST,
  publicOrigin: (env.PUBLIC_ORIGIN ?? `http://${env.HOST}:${env.PORT}`).replace(/\/+$/, ''),
  databaseUrl: env.DATABASE_URL,
  /** PostgreSQL: hot statements as prepared statements; false behind a pooler that does not keep them. */
  databasePreparedStatements: env.DATABASE_PREPARED_STATEMENTS,
  /** PostgreSQL: this process's statements that lock one account's row at the database at once; 0: no limit. */
  databaseAccountConcurrency: env.DATABASE_ACCOUNT_CONCURRENCY,
  databaseAccountBatch: env.DATABASE_ACCOUNT_BATCH,
  /** SQLite: how often the checkpointer thread copies the WAL into the database file. */
  sqliteCheckpointIntervalMs: env.SQLITE_CHECKPOINT_INTERVAL_MS,
  /**
   * SQLite served by one process: how long its rate-limit counts and JSON-RPC credits wait in memory for
   * their rows (at most what a crash loses; held-counts.ts, held-credits.ts); 0 counts in the rows at once, as
   * `WORKERS` > 1 and PostgreSQL do.
   */
  sqliteRateLimitFlushMs: env.SQLITE_RATE_LIMIT_FLUSH_MS,
  sqliteMemoryHolds: env.SQLITE_MEMORY_HOLDS,
  serviceConfigPath: env.SERVICE_CONFIG,
  adminApiKey: env.ADMIN_API_KEY,
  bootstrapBalanceUsd: env.BOOTSTRAP_BALANCE_USD,
  validateResponses: env.VALIDATE_RESPONSES ?? env.NODE_ENV !== 'production',
  logLevel: env.LOG_LEVEL,
  corsOrigins: env.CORS_ORIGINS.split(',')
    .map((o) => o.trim())
    .filter(Boolean),
  shutdownGraceMs: env.SHUTDOWN_GRACE_MS,
  /** µs the event loop keeps polling after a lone request arrives and after its answer (http/idle-poll.ts). */
  idlePollUs: env.IDLE_POLL_US,
  /** Worker processes `main.ts` forks on this machine (node:cluster); 1 runs the server in this process. */
  workers: env.WORKERS,
  hostName: env.SERVICE_HOST_NAME,
  colo: env.SERVICE_COLO,
  reservationTtlMs: env.RESERVATION_TTL_MS,
  /** How long this process reuses an API-key lookup; bounds a revocation made by another process. */
  apiKeyCacheTtlMs: env.API_KEY_CACHE_TTL_MS,
  jsonBodyLimitBytes: env.JSON_BODY_LIMIT_MB * 1024 * 1024,
  chat: {
    timeoutMs: env.CHAT_TIMEOUT_MS,
    upstreamTimeoutMs: env.UPSTREAM_TIMEOUT_MS,
    localTokenDelayMs: env.LOCAL_CHAT_TOKEN_DELAY_MS,
    /**
     * A chat served by upstreams alone may send its upstream call before its reservation is made, when the
     * hold is as good as certain (Charges.holdsAhead): the reservation then commits during the upstream's wait.
     */
    callBeforeHold: env.CHAT_CALL_BEFORE_HOLD,
  },
  rpc: {
    pricePerCreditUsd: env.RPC_PRICE_PER_CREDIT_USD,
    upstreamTimeoutMs: env.RPC_UPSTREAM_TIMEOUT_MS,
    maxResponseBytes: env.RPC_MAX_RESPONSE_MB * 1024 * 1024,
    requestsPerMinute: env.RPC_REQUESTS_PER_MINUTE,
    staffRequestsPerMinute: env.RPC_STAFF_REQUESTS_PER_MINUTE,
    staffAccounts: env.RPC_STAFF_ACCOUNTS.split(',')
      .map((id) => id.trim())
      .filter(Boolean),
    creditsPerDay: env.RPC_CREDITS_PER_DAY,
    upstreams: Object.fromEntries(
      RPC_NETWORK_SLUGS.flatMap((slug) => {
        const urls = (env as Record<string, unknown>)[upstreamVariable(slug)] as string[] | undefined;
        return urls ? [[slug, urls]] : [];
      }),
    ) as Record<string, string[]>,
  },
  x402: {
    payToBase: env.X402_PAY_TO_BASE,
    payToSolana: env.X402_PAY_TO_SOLANA,
    solanaFeePayer: env.X402_SOLANA_FEE_PAYER,
    facilitatorUrl: env.X402_FACILITATOR_URL,
    baseRpcUrl: env.X402_BASE_RPC_URL,
    facilitatorPrivateKey: env.X402_FACILITATOR_PRIVATE_KEY as `0x${string}` | undefined,
    solanaRpcUrl: env.X402_SOLANA_RPC_URL,
    solanaFacilitatorPrivateKey: env.X402_SOLANA_FACILITATOR_PRIVATE_KEY,
    eip6492Factories: env.X402_EIP6492_FACTORIES?.split(',') ?? [],
  },
  /** Web search for chat; `searxngUrl` unset means web search is unavailable. */
  search: { searxngUrl: env.SEARXNG_URL, timeoutMs: env.SEARCH_TIMEOUT_MS },
  /** Web scraping for chat: the options of `createScraper`. */
  scrape: {
    allowPrivateNetworks: env.SCRAPE_ALLOW_PRIVATE_NETWORKS,
    maxBytes: env.SCRAPE_MAX_BYTES,
    timeoutMs: env.SCRAPE_TIMEOUT_MS,
    maxRedirects: env.SCRAPE_MAX_REDIRECTS,
  },
  /** Video jobs: the in-process worker, job leases, media retention, upstream polling. */
  video: {
    workerEnabled: env.VIDEO_WORKER_ENABLED,
    concurrency: env.VIDEO_WORKER_CONCURRENCY,
    pollIntervalMs: env.VIDEO_WORKER_POLL_MS,
    leaseMs: env.VIDEO_JOB_LEASE_MS,
    mediaTtlMs: env.VIDEO_MEDIA_TTL_HOURS * 3_600_000,
    upstreamPollMs: env.VIDEO_UPSTREAM_POLL_MS,
  },
}));

export type Config = z.output<typeof schema> & {
  /**
   * Reads a secret the catalogue names by variable (an upstream's `apiKeyEnv`). Only upper-case names are
   * readable; the value never enters the configuration object itself, so it cannot be logged with it.
   */
  readSecret(name: string): string | undefined;
};

/** Raised when the environment is invalid; the message lists every problem, one per line. */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  readonly problems: string[];
  constructor(problems: string[]) {
    super(`Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.problems = problems;
  }
}

/** Parses the environment. Empty strings count as unset, so `FOO=` in a .env file falls back to the default. */
export function loadConfig(env: Record<string, string | undefined>): Config {
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const result = schema.safeParse(present);
  if (!result.success) {
    throw new ConfigError(
      result.error.issues.map((i) => `${i.path.join('.') || 'environment'}: ${i.message}`),
    );
  }
  const readSecret = (name: string) => (/^[A-Z][A-Z0-9_]*$/.test(name) ? present[name] : undefined);
  Object.defineProperty(result.data, 'readSecret', { value: readSecret, enumerable: false });
  return result.data as Config;
}
