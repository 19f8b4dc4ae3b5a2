/**
 * Charges.captureDetached: the capture of an answered request starts once the caller's turn is over (its
 * microtasks run out: the answer, written in them, leaves first), while what must see the account as the
 * request left it (`settled`) waits for it from the moment it is asked for. The ledger is a fake of its port
 * that records when the capture reached it.
 */
import { expect, test } from 'vitest';
import { createCharges } from '../../server/domains/billing/charges.ts';
import type { CaptureItem, LedgerRepository, Reservation } from '../../server/storage/ledger.ts';

const reservation: Reservation = {
  id: 'res-1',
  accountId: 'acct-1',
  apiKeyId: 'key-1',
  requestId: 'req-1',
  modelId: 'model-1',
  usdNano: 1_000n,
  diemNano: 0n,
  epochDay: 20_000,
  status: 'held',
  createdAtMs: 0,
  expiresAtMs: 60_000,
  settledAtMs: null,
};
const items: CaptureItem[] = [
  { sku: 'rpc_credit', amountNano: 400n, units: 20, unitPriceNano: 20n, modelId: 'model-1' },
];

function recordingLedger() {
  const events: string[] = [];
  const ledger = {
    async captureWith(captured: Reservation, input: { items: CaptureItem[] }) {
      events.push(`capture ${captured.id} ${input.items.length}`);
      return { usdNano: 400n, diemNano: 0n, entries: [] };
    },
    async release() {
      events.push('release');
    },
  } as unknown as LedgerRepository;
  return { ledger, events };
}

test('behavior: a detached capture starts after the caller turn, its amounts known at once and settled waiting for it', async () => {
  const { ledger, events } = recordingLedger();
  const charges = createCharges({ ledger, reservationTtlMs: 60_000 });
  const capture = charges.captureDetached(reservation, items);
  expect({ usdNano: capture.usdNano, diemNano: capture.diemNano }).toEqual({ usdNano: 400n, diemNano: 0n });
  const settled = charges.settled('acct-1');
  expect(settled).toBeInstanceOf(Promise);
  // The caller's own continuations (the answer's write) come first, however many.
  for (let hop = 0; hop < 20; hop++) await Promise.resolve();
  events.push('answered');
  await settled;
  expect(events).toEqual(['answered', 'capture res-1 1']);
  await capture.done;
  expect(charges.settled('acct-1')).toBeUndefined();
});
