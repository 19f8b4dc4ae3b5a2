/**
 * The facilitator over HTTP: any service speaking the x402 facilitator API (`POST /verify`, `POST /settle`,
 * `GET /supported`), through the reference `HTTPFacilitatorClient` (which schema-checks replies and reports a
 * settle timeout as an error, i.e. indeterminate).
 */
import { HTTPFacilitatorClient } from '@x402/core/http';
import type { Facilitator } from './facilitator.ts';

export function createHttpFacilitator(options: { url: string; timeoutMs?: number }): Facilitator {
  const client = new HTTPFacilitatorClient({ url: options.url, timeoutMs: options.timeoutMs ?? 90_000 });
  let supported: ReturnType<Facilitator['supported']> | undefined;
  return {
    verify: (payload, requirements) => client.verify(payload, requirements),
    settle: (payload, requirements) => client.settle(payload, requirements),
    supported() {
      supported ??= client.getSupported().catch((error: unknown) => {
        supported = undefined;
        throw error;
      });
      return supported;
    },
  };
}
