/** HTTP handlers of the JSON-RPC proxy: translate the request, delegate to the RPC service, write its bytes. */
import type { HandlerGroups } from '../../handlers.ts';
import { unauthorized } from '../../http/errors.ts';
import type { RpcService } from './service.ts';

export function createRpcHandlers(service: RpcService): HandlerGroups {
  return {
    async listCryptoRpcNetworks() {
      return { status: 200, body: service.listNetworks() };
    },

    async callCryptoRpc(ctx) {
      if (!ctx.principal) throw unauthorized();
      const key = ctx.headers['idempotency-key'];
      const result = await service.call({
        principal: ctx.principal,
        network: ctx.path.network,
        body: ctx.body,
        idempotencyKey: Array.isArray(key) ? key[0] : key,
        signal: ctx.cancellation,
      });
      // The node's bytes as they came; only the media type is forced.
      return { status: 200, contentType: 'application/json', body: result.body, headers: result.headers };
    },
  };
}
