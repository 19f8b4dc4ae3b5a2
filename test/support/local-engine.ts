/**
 * The local engine's request as the engine tests send it: one user message asking for a long answer, no bound
 * worth the name, one choice, the given seed; `overrides` replace whole fields.
 */
import type { ChatProviderRequest } from '../../server/providers/chat/types.ts';

export function engineRequest(
  seed: number,
  overrides: Partial<ChatProviderRequest> = {},
): ChatProviderRequest {
  return {
    model: 'llama-3.3-70b',
    messages: [{ role: 'user', content: 'Write 300 words about rivers.' }],
    maxTokens: 4096,
    n: 1,
    sampling: { seed },
    ...overrides,
  };
}
