/**
 * Billing: the account's balance, its usage history (cursor pages, JSON or CSV) and usage analytics, all
 * read from the one ledger. Amounts leave as USD numbers; everything inside stays integer nano-USD.
 */

import type { BillingUsageAnalytics, BillingUsageEntry } from '../../../generated/api.d.ts';
import type { HandlerTable } from '../../http/contract.ts';
import { badRequest } from '../../http/errors.ts';
import { preferredMediaType } from '../../http/negotiate.ts';
import { NANO_PER_USD, nanoToUsdNumber } from '../../money.ts';
import type { ApiKeysRepository } from '../../storage/api-keys.ts';
import type { Currency, LedgerEntry, LedgerRepository } from '../../storage/ledger.ts';
import { requireApiKeyPrincipal } from '../principal.ts';

export type BillingHandlerDeps = {
  ledger: LedgerRepository;
  keys: ApiKeysRepository;
  /** The type of a catalogue model (`text`, `image`, …), for analytics. */
  modelType(modelId: string): string | undefined;
  now?: () => number;
};

const DAY_MS = 86_400_000;
const MAX_DAYS = 90;
const USAGE_TYPES = ['CHARGE', 'REFUND'] as const;

/** The filters a usage-history cursor carries, so that the next page is asked for with the cursor alone. */
type Cursor = {
  after: number;
  start?: number;
  end?: number;
  currency?: Currency;
  size: number;
  page: number;
};

export function encodeCursor(cursor: Cursor): string {
  return Buffer.from(JSON.stringify(cursor)).toString('base64url');
}

export function decodeCursor(value: string): Cursor {
  try {
    const c = JSON.parse(Buffer.from(value, 'base64url').toString('utf8')) as Cursor;
    const int = (n: unknown) => Number.isSafeInteger(n) && (n as number) >= 0;
    if (!int(c.after) || !int(c.size) || !int(c.page) || c.size < 10 || c.size > 1000)
      throw new Error('shape');
    if ((c.start !== undefined && !int(c.start)) || (c.end !== undefined && !int(c.end)))
      throw new Error('shape');
    if (c.currency !== undefined && c.currency !== 'USD' && c.currency !== 'DIEM') throw new Error('shape');
    return c;
  } catch {
    throw badRequest('The cursor is invalid or expired; start again without it', 'INVALID_CURSOR');
  }
}

const unitType = (type: string | undefined) =>
  ({
    text: 'tokens',
    embedding: 'tokens',
    decision: 'tokens',
    image: 'images',
    tts: 'characters',
    asr: 'seconds',
  })[type ?? ''] ?? 'units';

function usageEntry(entry: LedgerEntry): BillingUsageEntry {
  const details = (entry.details ?? {}) as Record<string, unknown>;
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  const unitPrice = entry.unitPriceNano === null ? 0 : Number(entry.unitPriceNano) / Number(NANO_PER_USD);
  return {
    timestamp: new Date(entry.createdAtMs).toISOString(),
    sku: entry.sku ?? (entry.type === 'REFUND' ? 'refund' : 'usage'),
    units: entry.units === null ? 0 : Number(entry.units),
    pricePerUnitUsd: unitPrice,
    amount: nanoToUsdNumber(entry.amountNano),
    currency: entry.currency,
    notes: [entry.type === 'REFUND' ? 'Refund' : 'Charge', entry.modelId].filter(Boolean).join(' '),
    inferenceDetails: entry.requestId
      ? {
          requestId: entry.requestId,
          promptTokens: num(details.promptTokens),
          completionTokens: num(details.completionTokens),
          inferenceExecutionTime: num(details.executionMs),
        }
      : null,
  };
}

const CSV_COLUMNS = [
  'timestamp',
  'sku',
  'units',
  'pricePerUnitUsd',
  'amount',
  'currency',
  'notes',
  'requestId',
  'promptTokens',
  'completionTokens',
  'inferenceExecutionTime',
] as const;

function csvCell(value: unknown): string {
  const text = value === null || value === undefined ? '' : String(value);
  // Quote when needed, and defuse spreadsheet formulas.
  const safe = /^[=+\-@\t\r]/.test(text) && !/^-?\d/.test(text) ? `'${text}` : text;
  return /[",\n\r]/.test(safe) ? `"${safe.replace(/"/g, '""')}"` : safe;
}

export function toCsv(rows: BillingUsageEntry[]): string {
  const lines = [CSV_COLUMNS.join(',')];
  for (const r of rows) {
    const d = r.inferenceDetails;
    lines.push(
      [
        r.timestamp,
        r.sku,
        r.units,
        r.pricePerUnitUsd,
        r.amount,
        r.currency,
        r.notes,
        d?.requestId,
        d?.promptTokens,
        d?.completionTokens,
        d?.inferenceExecutionTime,
      ]
        .map(csvCell)
        .join(','),
    );
  }
  return `${lines.join('\r\n')}\r\n`;
}

/** The analytics window: `lookback` days including today, or `startDate`..`endDate` inclusive; 90 days at most. */
export function analyticsWindow(
  query: { lookback?: string; startDate?: string; endDate?: string },
  now: number,
): { startMs: number; endMs: number; days: number } {
  const today = Math.floor(now / DAY_MS) * DAY_MS;
  if (query.startDate !== undefined || query.endDate !== undefined) {
    if (!query.startDate || !query.endDate) throw badRequest('startDate and endDate must be sent together');
    const start = Date.parse(`${query.startDate}T00:00:00Z`);
    const end = Date.parse(`${query.endDate}T00:00:00Z`) + DAY_MS;
    if (Number.isNaN(start) || Number.isNaN(end))
      throw badRequest('startDate and endDate must be YYYY-MM-DD dates');
    if (end <= start) throw badRequest('endDate must not be before startDate');
    const days = (end - start) / DAY_MS;
    if (days > MAX_DAYS) throw badRequest(`The window is at most ${MAX_DAYS} days`);
    return { startMs: start, endMs: end, days };
  }
  const days = Number((query.lookback ?? '7d').slice(0, -1));
  if (!Number.isInteger(days) || days < 1 || days > MAX_DAYS)
    throw badRequest(`lookback is at most ${MAX_DAYS}d`);
  return { startMs: today - (days - 1) * DAY_MS, endMs: today + DAY_MS, days };
}

type Tally = { usd: bigint; diem: bigint; units: number };
const tally = (): Tally => ({ usd: 0n, diem: 0n, units: 0 });
const bump = (t: Tally, e: LedgerEntry) => {
  // Spend is positive in analytics: a CHARGE (negative) adds, a REFUND (positive) subtracts.
  if (e.currency === 'USD') t.usd -= e.amountNano;
  else t.diem -= e.amountNano;
  if (e.type === 'CHARGE' && e.units !== null) t.units += Number(e.units);
};

/**
 * The account's usage entries between two instants, page by page. At module level, as every generator function
 * (`test/unit/generator-scope.test.ts` says why).
 */
async function* entriesBetween(
  ledger: BillingHandlerDeps['ledger'],
  accountId: string,
  startMs: number,
  endMs: number,
): AsyncGenerator<LedgerEntry> {
  let after: number | undefined;
  for (;;) {
    const page = await ledger.listEntriesSince(accountId, {
      ...(after === undefined ? {} : { afterSeq: after }),
      startMs,
      endMs,
      types: [...USAGE_TYPES],
      limit: 1000,
    });
    yield* page;
    if (page.length < 1000) return;
    after = page.at(-1)?.seq;
  }
}

export function createBillingHandlers(
  deps: BillingHandlerDeps,
): Pick<HandlerTable, 'getBillingBalance' | 'getBillingUsageHistory' | 'getBillingUsageAnalytics'> {
  const now = deps.now ?? Date.now;

  return {
    async getBillingBalance({ principal }) {
      const caller = requireApiKeyPrincipal(principal);
      const b = await deps.ledger.getBalance(caller.accountId, now());
      const currency = b.diemAvailableNano > 0n ? 'DIEM' : b.usdAvailableNano > 0n ? 'USD' : null;
      return {
        status: 200,
        body: {
          canConsume: currency !== null,
          consumptionCurrency: currency,
          balances: {
            usd: nanoToUsdNumber(b.usdNano),
            diem: nanoToUsdNumber(b.diemAllowanceNano - b.diemUsedTodayNano),
          },
          diemEpochAllocation: nanoToUsdNumber(b.diemAllowanceNano),
        },
      };
    },

    async getBillingUsageHistory({ principal, query, sentQuery, headers }) {
      const caller = requireApiKeyPrincipal(principal);
      let cursor: Cursor;
      if (query.cursor !== undefined) {
        const others = ['startTimestamp', 'endTimestamp', 'currency', 'pageSize'].filter((k) =>
          sentQuery.has(k),
        );
        if (others.length > 0)
          throw badRequest(`Send the cursor alone (it carries ${others.join(', ')})`, 'INVALID_CURSOR');
        cursor = decodeCursor(query.cursor);
      } else {
        const start = query.startTimestamp === undefined ? undefined : Date.parse(query.startTimestamp);
        const end = query.endTimestamp === undefined ? undefined : Date.parse(query.endTimestamp);
        cursor = {
          after: 0,
          size: query.pageSize ?? 1000,
          page: 1,
          ...(start === undefined ? {} : { start }),
          ...(end === undefined ? {} : { end }),
          ...(query.currency ? { currency: query.currency } : {}),
        };
      }
      const filter = {
        ...(cursor.start === undefined ? {} : { startMs: cursor.start }),
        ...(cursor.end === undefined ? {} : { endMs: cursor.end }),
        ...(cursor.currency ? { currency: cursor.currency } : {}),
        types: [...USAGE_TYPES],
      };
      const entries = await deps.ledger.listEntriesSince(caller.accountId, {
        ...filter,
        ...(cursor.after > 0 ? { afterSeq: cursor.after } : {}),
        limit: cursor.size + 1,
      });
      const page = entries.slice(0, cursor.size);
      const total = await deps.ledger.countEntries(caller.accountId, filter);
      const last = page.at(-1);
      const nextCursor =
        entries.length > cursor.size && last
          ? encodeCursor({ ...cursor, after: last.seq, page: cursor.page + 1 })
          : null;
      const rows = page.map(usageEntry);
      const pagination = {
        'x-pagination-limit': cursor.size,
        'x-pagination-page': cursor.page,
        'x-pagination-total': total,
        'x-pagination-total-pages': Math.ceil(total / cursor.size),
        ...(nextCursor ? { 'x-next-cursor': nextCursor } : {}),
      };
      if (preferredMediaType(headers.accept, ['application/json', 'text/csv']) === 'text/csv') {
        const stamp = new Date(now()).toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
        return {
          status: 200,
          contentType: 'text/csv; charset=utf-8',
          body: toCsv(rows),
          headers: {
            ...pagination,
            'Content-Disposition': `attachment; filename="billing-usage-history-${stamp}.csv"`,
          },
        };
      }
      return { status: 200, body: { data: rows, nextCursor }, headers: pagination };
    },

    async getBillingUsageAnalytics({ principal, query }) {
      const caller = requireApiKeyPrincipal(principal);
      const window = analyticsWindow(query, now());
      const byDate = new Map<string, Tally>();
      const byModel = new Map<string, { total: Tally; skus: Map<string, Tally> }>();
      const byKey = new Map<string, Tally>();
      const modelDaily = new Map<number, Map<string, bigint>>();
      const keyDaily = new Map<number, Map<string, bigint>>();
      for await (const e of entriesBetween(deps.ledger, caller.accountId, window.startMs, window.endMs)) {
        const day = Math.floor(e.createdAtMs / DAY_MS) * DAY_MS;
        const dateKey = new Date(day).toISOString().slice(0, 10);
        bump(byDate.get(dateKey) ?? byDate.set(dateKey, tally()).get(dateKey) ?? tally(), e);
        const model = e.modelId ?? 'other';
        const m = byModel.get(model) ?? byModel.set(model, { total: tally(), skus: new Map() }).get(model);
        if (m) {
          bump(m.total, e);
          const sku = e.sku ?? 'usage';
          bump(m.skus.get(sku) ?? m.skus.set(sku, tally()).get(sku) ?? tally(), e);
        }
        const key = e.apiKeyId ?? '';
        bump(byKey.get(key) ?? byKey.set(key, tally()).get(key) ?? tally(), e);
        const spend = -e.amountNano;
        const md = modelDaily.get(day) ?? modelDaily.set(day, new Map()).get(day);
        md?.set(model, (md.get(model) ?? 0n) + spend);
        const kd = keyDaily.get(day) ?? keyDaily.set(day, new Map()).get(day);
        kd?.set(key, (kd.get(key) ?? 0n) + spend);
      }
      const descriptions = new Map<string, string>();
      for (const k of await deps.keys.list(caller.accountId, { includeRevoked: true })) {
        descriptions.set(k.id, k.description);
      }
      const keyName = (id: string) => (id === '' ? 'No key' : (descriptions.get(id) ?? id));
      const usd = nanoToUsdNumber;
      const spendOf = (t: Tally) => t.usd + t.diem;
      const models = [...byModel.entries()].sort((a, b) => Number(spendOf(b[1].total) - spendOf(a[1].total)));
      const keys = [...byKey.entries()].sort((a, b) => Number(spendOf(b[1]) - spendOf(a[1])));
      const days: number[] = [];
      for (let d = window.startMs; d < window.endMs; d += DAY_MS) days.push(d);
      const series = (map: Map<number, Map<string, bigint>>, name: (k: string) => string) =>
        days.map((date) => ({
          date,
          ...Object.fromEntries(
            [...(map.get(date) ?? new Map<string, bigint>())].map(([k, v]) => [name(k), usd(v)]),
          ),
        }));
      const body: BillingUsageAnalytics = {
        lookback: `${window.days}d`,
        byDate: days.map((d) => {
          const key = new Date(d).toISOString().slice(0, 10);
          const t = byDate.get(key) ?? tally();
          return { date: key, USD: usd(t.usd), DIEM: usd(t.diem) };
        }),
        byModel: models.map(([modelName, m]) => {
          const type = deps.modelType(modelName);
          return {
            modelName,
            unitType: unitType(type),
            modelType: type ?? null,
            totalUsd: usd(m.total.usd),
            totalDiem: usd(m.total.diem),
            totalUnits: m.total.units,
            breakdown: [...m.skus].map(([type, t]) => ({
              type,
              usd: usd(t.usd),
              diem: usd(t.diem),
              units: t.units,
            })),
          };
        }),
        byModelDaily: series(modelDaily, (k) => k),
        topModels: models.slice(0, 5).map(([name]) => name),
        byKey: keys.map(([id, t]) => ({
          apiKeyId: id === '' ? null : id,
          description: keyName(id),
          totalUsd: usd(t.usd),
          totalDiem: usd(t.diem),
          totalUnits: t.units,
        })),
        byKeyDaily: series(keyDaily, keyName),
        topKeyNames: keys.slice(0, 5).map(([id]) => keyName(id)),
      };
      return { status: 200, body };
    },
  };
}
