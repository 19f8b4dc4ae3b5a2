/**
 * Image prices, exactly, from the model's `model_spec.pricing` in nano-USD: per image at the quality tier
 * (`quality[resolution][quality]`) for models with quality tiers, else at the resolution tier
 * (`resolutions[resolution]`), else `generation`; times the variants; plus `enhance_prompt` once when the
 * prompt was actually rewritten. The reservation is the same arithmetic with the enhancement counted whenever
 * it was asked for, so a capture never needs more than was reserved.
 */
import type { CatalogModel } from '../../catalog/types.ts';
import type { CaptureItem } from '../../storage/ledger.ts';

export type PriceTier = { resolution?: string; quality?: string };

/** Nano-USD per image at a tier; throws when the catalogue has no price for it (a catalogue error). */
export function imagePriceNano(model: CatalogModel, tier: PriceTier): bigint {
  const p = model.pricing;
  const byQuality = p?.quality as
    | Record<string, Record<string, { usd: bigint } | undefined> | undefined>
    | undefined;
  const byResolution = p?.resolutions as Record<string, { usd: bigint } | undefined> | undefined;
  if (tier.resolution && tier.quality && byQuality) {
    const price = byQuality[tier.resolution]?.[tier.quality];
    if (price) return price.usd;
  }
  if (tier.resolution && byResolution) {
    const price = byResolution[tier.resolution];
    if (price) return price.usd;
  }
  if (p?.generation) return p.generation.usd;
  throw new Error(`model ${model.id} has no image price for ${JSON.stringify(tier)}`);
}

export function enhancePriceNano(model: CatalogModel): bigint {
  return model.pricing?.enhance_prompt?.usd ?? 0n;
}

export function worstCaseNano(
  model: CatalogModel,
  input: { tier: PriceTier; variants: number; enhance: boolean },
): bigint {
  return (
    imagePriceNano(model, input.tier) * BigInt(input.variants) +
    (input.enhance ? enhancePriceNano(model) : 0n)
  );
}

/** The charge lines of a finished generation. */
export function chargeItems(
  model: CatalogModel,
  input: { tier: PriceTier; images: number; enhanced: boolean },
): CaptureItem[] {
  const price = imagePriceNano(model, input.tier);
  const items: CaptureItem[] = [
    {
      sku: 'image.generation',
      units: input.images,
      unitPriceNano: price,
      amountNano: price * BigInt(input.images),
      details: { ...input.tier },
    },
  ];
  const enhance = enhancePriceNano(model);
  if (input.enhanced && enhance > 0n)
    items.push({ sku: 'image.enhance_prompt', units: 1, unitPriceNano: enhance, amountNano: enhance });
  return items;
}
