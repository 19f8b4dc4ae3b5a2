/**
 * The tokenizer reads `o200k_base` from the package's `.tiktoken` data file instead of importing the
 * package's generated module: the ranks must be exactly the module's (so token counts, and with them
 * reservations and bills, are the same), and both tokenize alike.
 */
import packaged from 'gpt-tokenizer/bpeRanks/o200k_base';
import { decode as packagedDecode, encode as packagedEncode } from 'gpt-tokenizer/encoding/o200k_base';
import { describe, expect, test } from 'vitest';
import {
  countTokens,
  decodeTokens,
  encodeText,
  loadO200kRanks,
} from '../../server/providers/chat/tokenizer.ts';

describe('o200k_base ranks from the data file', () => {
  test('behavior: every rank equals the packaged module entry (strings, byte arrays and holes alike)', {
    timeout: 60_000,
  }, () => {
    const ranks = loadO200kRanks();
    expect(ranks.length).toBe(packaged.length);
    let strings = 0;
    let bytes = 0;
    let holes = 0;
    const mismatches: number[] = [];
    for (let rank = 0; rank < packaged.length; rank++) {
      const expected = packaged[rank];
      const actual = ranks[rank];
      if (rank in ranks !== rank in packaged) mismatches.push(rank);
      else if (!(rank in packaged)) holes++;
      else if (typeof expected === 'string') {
        strings++;
        if (actual !== expected) mismatches.push(rank);
      } else {
        bytes++;
        if (!Array.isArray(actual) || actual.join() !== (expected as number[]).join()) mismatches.push(rank);
      }
    }
    expect(mismatches.slice(0, 10)).toEqual([]);
    // The data has both kinds: a loader that made everything a string (or bytes) would fail above.
    expect(strings).toBeGreaterThan(190_000);
    expect(bytes).toBeGreaterThan(0);
    expect(strings + bytes + holes).toBe(packaged.length);
  });

  test('behavior: tokenizes and decodes as the packaged encoding', () => {
    const texts = [
      'Write 500 words about the benchmark.',
      'naïve café — 東京 🚀 <|endoftext|> \u0000 \ud83d',
      '    indented\n\tcode() { return x ?? y; }',
      'ÀÁÂÃÄÅ Ωμέγα привет مرحبا नमस्ते',
    ];
    for (const text of texts) {
      const options = { allowedSpecial: new Set<string>(), disallowedSpecial: new Set<string>() };
      expect(encodeText(text)).toEqual(packagedEncode(text, options));
      expect(countTokens(text)).toBe(packagedEncode(text, options).length);
      expect(decodeTokens(encodeText(text))).toBe(packagedDecode(packagedEncode(text, options)));
    }
  });
});
