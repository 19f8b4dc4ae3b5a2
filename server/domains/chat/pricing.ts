/**
 * Chat prices, exactly: catalogue prices are nano-USD per million tokens (per search, per scraped page), so
 * a charge is `ceil(tokens × price / 1e6)` nano-USD per line. The reservation is the worst case of the same
 * arithmetic, so a capture never needs more than was reserved.
 */
import type { CatalogModel } from '../../catalog/types.ts';
import type { ProviderUsage } from '../../providers/chat/types.ts';
import type { CaptureItem } from '../../storage/ledger.ts';

const MILLION = 1_000_000n;

export type TokenPrices = { input: bigint; output: bigint; cacheRead: bigint; cacheWrite: bigint };

const ceilDiv = (a: bigint, b: bigint) => (a + b - 1n) / b;

/** USD nano per million tokens, the extended tier applying above its prompt-size threshold. */
export function tokenPrices(model: CatalogModel, promptTokens: number): TokenPrices {
  const p = model.pricing;
  const extended = p?.extended && promptTokens > p.extended.context_token_threshold ? p.extended : undefined;
  const input = (extended?.input ?? p?.input)?.usd ?? 0n;
  const output = (extended?.output ?? p?.output)?.usd ?? 0n;
  return {
    input,
    output,
    cacheRead: (extended?.cache_input ?? p?.cache_input)?.usd ?? input,
    cacheWrite: (extended?.cache_write ?? p?.cache_write)?.usd ?? input,
  };
}

export type Extras = { searches: number; scrapes: number };

export function searchPrice(model: CatalogModel): bigint {
  return model.pricing?.web_search?.usd ?? 0n;
}

export function scrapePrice(model: CatalogModel): bigint {
  return model.pricing?.web_scraping?.usd ?? model.pricing?.web_search?.usd ?? 0n;
}

/** The most a request can cost: every prompt token at the dearer of input and cache write, the full bound. */
export function worstCaseNano(
  model: CatalogModel,
  input: { promptTokens: number; completionTokens: number; extras: Extras },
): bigint {
  const prices = tokenPrices(model, input.promptTokens);
  const promptPrice = prices.cacheWrite > prices.input ? prices.cacheWrite : prices.input;
  return (
    ceilDiv(BigInt(input.promptTokens) * promptPrice, MILLION) +
    ceilDiv(BigInt(input.completionTokens) * prices.output, MILLION) +
    BigInt(input.extras.searches) * searchPrice(model) +
    BigInt(input.extras.scrapes) * scrapePrice(model)
  );
}

/** How many completion tokens `budgetNano` pays for once the prompt and extras are paid. */
export function affordableCompletionTokens(
  model: CatalogModel,
  input: { promptTokens: number; extras: Extras; budgetNano: bigint; choices: number },
): number {
  const fixed = worstCaseNano(model, {
    promptTokens: input.promptTokens,
    completionTokens: 0,
    extras: input.extras,
  });
  const left = input.budgetNano - fixed;
  const prices = tokenPrices(model, input.promptTokens);
  if (left < 0n) return 0;
  if (prices.output === 0n) return Number.MAX_SAFE_INTEGER;
  // ceil(t × price / 1e6) <= left  <=>  t <= floor(left × 1e6 / price)
  const total = (left * MILLION) / prices.output;
  return Number(total / BigInt(input.choices));
}

/** The charge lines of a finished request. */
export function chargeItems(model: CatalogModel, usage: ProviderUsage, extras: Extras): CaptureItem[] {
  const prices = tokenPrices(model, usage.promptTokens);
  const cached = Math.min(usage.cachedTokens, usage.promptTokens);
  const written = Math.min(usage.cacheCreationTokens, usage.promptTokens - cached);
  const plain = usage.promptTokens - cached - written;
  const line = (sku: string, units: number, price: bigint, perUnit = false): CaptureItem => ({
    sku,
    units: perUnit ? units : (units / 1e6).toString(),
    unitPriceNano: price,
    amountNano: perUnit ? BigInt(units) * price : ceilDiv(BigInt(units) * price, MILLION),
  });
  const items: CaptureItem[] = [];
  if (plain > 0) items.push(line('chat.input_tokens', plain, prices.input));
  if (cached > 0) items.push(line('chat.cache_read_tokens', cached, prices.cacheRead));
  if (written > 0) items.push(line('chat.cache_write_tokens', written, prices.cacheWrite));
  if (usage.completionTokens > 0)
    items.push(line('chat.output_tokens', usage.completionTokens, prices.output));
  if (extras.searches > 0) items.push(line('chat.web_search', extras.searches, searchPrice(model), true));
  if (extras.scrapes > 0) items.push(line('chat.web_scraping', extras.scrapes, scrapePrice(model), true));
  return items;
}
