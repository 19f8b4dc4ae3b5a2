/**
 * The embedded embedding engine: deterministic, unit-length vectors whose cosine similarity ranks related
 * texts above unrelated ones; shorter vectors are the renormalised prefix of the full one.
 */
import { describe, expect, test } from 'vitest';
import { encodeFloat32Base64 } from '../../server/domains/embeddings/handlers.ts';
import {
  createLocalEmbeddingEngine,
  features,
  hashEmbedding,
} from '../../server/providers/embeddings/local.ts';
import { decodeFloat32Base64 } from '../../server/providers/embeddings/openai-compatible.ts';

const engine = createLocalEmbeddingEngine({ nativeDimensions: () => 1024 });
const cosine = (a: Float32Array, b: Float32Array) => a.reduce((sum, x, i) => sum + x * (b[i] ?? 0), 0);
const embed = async (inputs: string[], dimensions = 1024) =>
  (await engine.embed({ model: 'm', inputs, dimensions, customDimensions: dimensions !== 1024 })).vectors;

describe('local embedding engine', () => {
  test('behavior: similar texts score closer than unrelated ones', async () => {
    const [storm, storm2, waves, recipe, tax] = (await embed([
      'The lighthouse keeper logged the storm at dawn.',
      'At dawn the keeper of the lighthouse recorded a storm.',
      'Waves broke over the breakwater all night during the storm.',
      'Whisk the eggs with sugar and fold in the flour.',
      'Quarterly tax filings are due at the end of the month.',
    ])) as Float32Array[];
    const near = cosine(storm as Float32Array, storm2 as Float32Array);
    expect(near).toBeGreaterThan(0.5);
    expect(near).toBeGreaterThan(cosine(storm as Float32Array, waves as Float32Array));
    expect(cosine(storm as Float32Array, waves as Float32Array)).toBeGreaterThan(
      cosine(storm as Float32Array, recipe as Float32Array),
    );
    expect(Math.abs(cosine(storm as Float32Array, recipe as Float32Array))).toBeLessThan(0.2);
    expect(Math.abs(cosine(storm as Float32Array, tax as Float32Array))).toBeLessThan(0.2);
    // Word parts count too: an inflected form is closer than a different word.
    const [run, running, swim] = (await embed(['running', 'runner', 'swimming'])) as Float32Array[];
    expect(cosine(run as Float32Array, running as Float32Array)).toBeGreaterThan(
      cosine(running as Float32Array, swim as Float32Array) - 0.0001 + 0.05,
    );
  });

  test('behavior: deterministic, unit length, case and punctuation insensitive', async () => {
    const [a, b, c] = (await embed(['Hello, World!', 'hello world', 'Hello, World!'])) as Float32Array[];
    expect(Buffer.from((a as Float32Array).buffer)).toEqual(Buffer.from((c as Float32Array).buffer));
    expect(cosine(a as Float32Array, b as Float32Array)).toBeCloseTo(1, 5);
    expect(cosine(a as Float32Array, a as Float32Array)).toBeCloseTo(1, 5);
    expect((await embed(['...']))[0]?.every((x) => x === 0)).toBe(true);
  });

  test('behavior: the model id seeds the space', async () => {
    const one = hashEmbedding('the same text', 64, 1);
    const two = hashEmbedding('the same text', 64, 2);
    expect(Buffer.from(one.buffer)).not.toEqual(Buffer.from(two.buffer));
  });

  test('behavior: shorter vectors are the renormalised prefix of the full one', async () => {
    const [full] = (await embed(['Matryoshka vectors keep their head'])) as Float32Array[];
    const [short] = (await embed(['Matryoshka vectors keep their head'], 256)) as Float32Array[];
    expect(short?.length).toBe(256);
    expect(cosine(short as Float32Array, short as Float32Array)).toBeCloseTo(1, 5);
    const prefix = (full as Float32Array).subarray(0, 256);
    const ratio =
      ((short as Float32Array)[prefix.findIndex((x) => x !== 0)] as number) /
      (prefix.find((x) => x !== 0) as number);
    for (const [i, x] of (short as Float32Array).entries())
      expect(x).toBeCloseTo((prefix[i] as number) * ratio, 5);
  });

  test('behavior: features are word unigrams, bigrams and character trigrams', () => {
    expect([...features('Big cat').keys()].sort()).toEqual(
      ['b:big cat', 'c:<bi', 'c:<ca', 'c:at>', 'c:big', 'c:cat', 'c:ig>', 'w:big', 'w:cat'].sort(),
    );
  });
});

describe('base64 vectors', () => {
  test('behavior: little-endian float32 round trip', () => {
    const vector = Float32Array.from([0.5, -1.25, 2.5e-3]);
    const text = encodeFloat32Base64(vector);
    expect(Buffer.from(text, 'base64')).toEqual(
      Buffer.from([0, 0, 0, 0x3f, 0, 0, 0xa0, 0xbf, 0x0a, 0xd7, 0x23, 0x3b]),
    );
    expect(Array.from(decodeFloat32Base64(text))).toEqual(Array.from(vector));
  });
});
