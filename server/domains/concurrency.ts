/**
 * In-flight requests per model in this process, bounded by the catalogue's `maxConcurrency`: one more is
 * refused with 503 at capacity. Shared by every inference domain.
 */
import type { CatalogModel } from '../catalog/types.ts';
import { ApiError } from '../http/errors.ts';

export const AT_CAPACITY_MESSAGE = 'The model is at capacity. Please try again later.';

export type ModelSlots = ReturnType<typeof createSlots>;

export function createSlots() {
  const inFlight = new Map<string, number>();
  return {
    /** Takes a slot or throws 503; the returned function frees it (idempotent). */
    acquire(model: CatalogModel): () => void {
      const current = inFlight.get(model.id) ?? 0;
      if (current >= model.maxConcurrency)
        throw new ApiError(503, AT_CAPACITY_MESSAGE, {
          code: 'MODEL_AT_CAPACITY',
          headers: { 'Retry-After': '1' },
        });
      inFlight.set(model.id, current + 1);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        inFlight.set(model.id, (inFlight.get(model.id) ?? 1) - 1);
      };
    },
  };
}
