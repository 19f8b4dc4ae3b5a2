/**
 * The media handler groups (embeddings, speech, transcription) built from the composition root's parts, so
 * that `server/services.ts` wires them in one line.
 */
import type { CatalogService } from '../../catalog/service.ts';
import type { Config } from '../../config.ts';
import type { HandlerGroups } from '../../handlers.ts';
import type { Metrics } from '../../observability/metrics.ts';
import type { AccountsRepository } from '../../storage/accounts.ts';
import { createSpeechProviders, createTranscriptionProviders } from '../audio/providers.ts';
import { createSpeechHandlers } from '../audio/speech.ts';
import { createTranscriptionHandlers } from '../audio/transcription.ts';
import type { Charges } from '../billing/charges.ts';
import type { createRateLimiter } from '../limits/rate-limiter.ts';
import { createEmbeddingHandlers } from './handlers.ts';
import { createEmbeddingProviders } from './providers.ts';
import { createEmbeddingService } from './service.ts';

export type MediaDeps = {
  config: Config;
  catalog: CatalogService;
  charges: Charges;
  metrics: Metrics;
  accounts: AccountsRepository;
  limiter: ReturnType<typeof createRateLimiter>;
  tierOf(accountId: string): Promise<string>;
  fetch?: typeof fetch;
};

export function createMediaHandlers(deps: MediaDeps): HandlerGroups {
  const isPro = async (accountId: string) => (await deps.accounts.get(accountId)).pro;
  const embeddings = createEmbeddingService({
    catalog: deps.catalog,
    charges: deps.charges,
    isPro,
    providerFor: createEmbeddingProviders(deps),
    tokenCount: async (principal, modelId, tokens) =>
      deps.limiter.tokenCount(principal, await deps.tierOf(principal.accountId), modelId, tokens),
  });
  return {
    ...createEmbeddingHandlers({ embeddings }),
    ...createSpeechHandlers({
      catalog: deps.catalog,
      charges: deps.charges,
      isPro,
      providerFor: createSpeechProviders(deps),
    }),
    ...createTranscriptionHandlers({
      catalog: deps.catalog,
      charges: deps.charges,
      isPro,
      providerFor: createTranscriptionProviders(deps),
    }),
  };
}
