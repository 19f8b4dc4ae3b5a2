/**
 * The embedded embedding engine: feature hashing over word unigrams, word bigrams and character trigrams,
 * with sublinear term weights (function words down-weighted), signed buckets and L2 normalisation. Deterministic (a function of the model
 * id and the text only) and meaningful in the way a bag-of-n-grams is: texts that share words and word parts
 * score a higher cosine similarity than unrelated texts. Shorter vectors (`dimensions`) are the renormalised
 * prefix of the full one, as with Matryoshka-trained models (each feature is hashed into every block).
 */
import type { EmbeddingProvider, EmbeddingProviderRequest, EmbeddingProviderResult } from './types.ts';

/** FNV-1a, 32 bits, over the UTF-16 code units of `text`, from a seed. */
function fnv1a(text: string, seed: number): number {
  let hash = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  // Final avalanche (murmur3 fmix32) so that nearby inputs spread over the buckets.
  hash ^= hash >>> 16;
  hash = Math.imul(hash, 0x85ebca6b) >>> 0;
  hash ^= hash >>> 13;
  hash = Math.imul(hash, 0xc2b2ae35) >>> 0;
  hash ^= hash >>> 16;
  return hash >>> 0;
}

/** Lower-cased words: runs of letters, marks and digits (any script). */
export function words(text: string): string[] {
  return (
    text
      .normalize('NFKC')
      .toLowerCase()
      .match(/[\p{L}\p{M}\p{N}]+/gu) ?? []
  );
}

/**
 * Function words carry little meaning: they weigh little as words and give no word parts, or every English
 * sentence would look alike.
 */
const STOP_WORDS = new Set(
  (
    'a an and are as at be been but by can could did do does for from had has have he her his i if in into is ' +
    'it its me my no not of on or our she so than that the their them then there these they this those to ' +
    'us was we were what when where which who will with would you your'
  ).split(' '),
);

/** Weight of each kind of feature: whole words most, word pairs less, word parts least. */
const KIND_WEIGHT = { w: 1, s: 0.15, b: 0.7, c: 0.35 } as const;

/** The weighted features of a text: word unigrams, word bigrams and the character trigrams of each word. */
export function features(text: string): Map<string, number> {
  const counts = new Map<string, number>();
  const add = (feature: string) => counts.set(feature, (counts.get(feature) ?? 0) + 1);
  const list = words(text);
  list.forEach((word, i) => {
    const stop = STOP_WORDS.has(word);
    add(`${stop ? 's' : 'w'}:${word}`);
    const next = list[i + 1];
    if (next !== undefined && !(stop && STOP_WORDS.has(next))) add(`b:${word} ${next}`);
    if (stop) return;
    const chars = Array.from(`<${word}>`);
    for (let j = 0; j + 3 <= chars.length; j++) add(`c:${chars.slice(j, j + 3).join('')}`);
  });
  // Sublinear term frequency, scaled by kind.
  const weighted = new Map<string, number>();
  for (const [feature, count] of counts)
    weighted.set(feature, KIND_WEIGHT[feature[0] as keyof typeof KIND_WEIGHT] * (1 + Math.log(count)));
  return weighted;
}

/**
 * The blocks of a vector of length `dimensions`: [0, 64), [64, 128), [128, 256), [256, 512)…, each twice the
 * last. Every feature lands once in every block, so any prefix that ends on a block boundary holds every
 * feature: shortened vectors stay meaningful (the Matryoshka property, by construction).
 */
function blocks(dimensions: number): [start: number, size: number][] {
  const out: [number, number][] = [];
  let start = 0;
  let size = 64;
  while (start < dimensions) {
    out.push([start, Math.min(size, dimensions - start)]);
    start += size;
    if (start > 64) size *= 2;
  }
  return out;
}

/** The full-length vector of one text, L2-normalised (all zeros for a text without words). */
export function hashEmbedding(text: string, dimensions: number, seed: number): Float32Array {
  const sums = new Float64Array(dimensions);
  const layout = blocks(dimensions);
  for (const [feature, weight] of features(text)) {
    layout.forEach(([start, size], level) => {
      const hash = fnv1a(feature, seed ^ Math.imul(level + 1, 0x9e3779b9));
      const index = start + ((hash >>> 1) % size);
      sums[index] = (sums[index] ?? 0) + ((hash & 1) === 0 ? weight : -weight);
    });
  }
  return normalise(sums);
}

/** Scales a vector to unit length; a zero vector stays zero. */
export function normalise(values: ArrayLike<number>): Float32Array {
  let norm = 0;
  for (let i = 0; i < values.length; i++) norm += (values[i] ?? 0) ** 2;
  norm = Math.sqrt(norm);
  const out = new Float32Array(values.length);
  if (norm === 0) return out;
  for (let i = 0; i < values.length; i++) out[i] = (values[i] ?? 0) / norm;
  return out;
}

export function createLocalEmbeddingEngine(options: {
  /** Native vector length of a model (the catalogue's `embeddingDimensions`). */
  nativeDimensions(model: string): number;
}): EmbeddingProvider {
  return {
    name: 'local',
    async embed(request: EmbeddingProviderRequest): Promise<EmbeddingProviderResult> {
      const native = options.nativeDimensions(request.model);
      const seed = fnv1a(request.model, 0);
      const vectors = request.inputs.map((text) => {
        const full = hashEmbedding(text, native, seed);
        return request.dimensions < native ? normalise(full.subarray(0, request.dimensions)) : full;
      });
      return { vectors };
    },
  };
}
