/**
 * `POST /decisions`: a thin translation between the contract and the decision service.
 */
import type { HandlerGroups } from '../../handlers.ts';
import { ApiError } from '../../http/errors.ts';
import type { DecisionService } from './service.ts';

export function createDecisionHandlers(deps: { decisions: DecisionService }): HandlerGroups {
  return {
    createDecision: async ({ body, principal, requestId, signal }) => {
      // The validator's security handlers guarantee a principal here; this is a guard, not a path.
      if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
      const { response, model, router } = await deps.decisions.decide({ body, principal, requestId, signal });
      return {
        status: 200,
        body: response,
        headers: {
          'x-service-model-id': model.id,
          'x-service-model-name': model.spec.name,
          'x-service-model-router': router,
        },
      };
    },
  };
}
