/**
 * The event-stream reader's decoding (client/sse.ts): a chunk is decoded whole, the first bytes of a character
 * it ends in the middle of held for the next (`Utf8Chunks`), so the text, and the events, are those of the
 * whole stream decoded at once however the bytes are cut, a byte-order mark dropped at the stream's start only.
 */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { createSseParser, incompleteTail, type SseEvent, Utf8Chunks } from '../../client/sse.ts';

const encode = (text: string) => new TextEncoder().encode(text);

/** `bytes` cut at `cuts` (positions, in any order, duplicates giving empty chunks). */
function cut(bytes: Uint8Array, cuts: number[]): Uint8Array[] {
  const at = [0, ...cuts.map((c) => c % (bytes.length + 1)).sort((a, b) => a - b), bytes.length];
  return at.slice(1).map((end, i) => bytes.slice(at[i], end));
}

function decodeInChunks(chunks: Uint8Array[]): { text: string; pieces: string[] } {
  const decoder = new Utf8Chunks();
  const pieces = chunks.map((chunk) => decoder.text(chunk));
  pieces.push(decoder.rest());
  return { text: pieces.join(''), pieces };
}

function eventsInChunks(chunks: Uint8Array[]): SseEvent[] {
  const parser = createSseParser();
  return [...chunks.flatMap((chunk) => [...parser.push(chunk)]), ...parser.end()];
}

/** Text with every width of UTF-8 character, byte-order marks and line ends among them. */
const mixedText = fc
  .array(fc.constantFrom('a', ' ', 'é', '€', '😀', '\uFEFF', '\n', '\r', 'data: ', ':', '\u0800', '\uFFFD'), {
    maxLength: 40,
  })
  .map((parts) => parts.join(''));

describe('Utf8Chunks', () => {
  test('property: the text of any cut of any bytes is what one TextDecoder makes of them whole', () => {
    fc.assert(
      fc.property(
        fc.oneof(mixedText.map(encode), fc.uint8Array({ maxLength: 40 })),
        fc.array(fc.nat(), { maxLength: 8 }),
        (bytes, cuts) => {
          expect(decodeInChunks(cut(bytes, cuts)).text).toBe(new TextDecoder().decode(bytes));
        },
      ),
      { numRuns: 2000 },
    );
  });

  test('behavior: a character cut in two is held whole for the next chunk, and a stream that ends inside one ends with U+FFFD', () => {
    const euro = encode('€'); // E2 82 AC
    expect(decodeInChunks([encode('a'), euro.slice(0, 2), euro.slice(2), encode('b')]).pieces).toEqual([
      'a',
      '',
      '€',
      'b',
      '',
    ]);
    expect(decodeInChunks([encode('ok'), euro.slice(0, 2)]).pieces).toEqual(['ok', '', '\uFFFD']);
  });

  test("behavior: the held bytes are a copy, not a view of the chunk's memory, which its owner may reuse", () => {
    const decoder = new Utf8Chunks();
    const chunk = Buffer.from(encode('a€').subarray(0, 3)); // 'a', then E2 82 of the euro sign
    expect(decoder.text(chunk)).toBe('a');
    chunk.fill(0);
    expect(decoder.text(Uint8Array.of(0xac))).toBe('€');
  });

  test('behavior: the byte-order mark is dropped at the stream start only, also when its bytes come in pieces', () => {
    const mark = encode('\uFEFFa\uFEFF');
    expect(decodeInChunks([mark.slice(0, 1), mark.slice(1, 2), mark.slice(2)]).text).toBe('a\uFEFF');
    // A chunk after the first that starts with the mark keeps it.
    expect(decodeInChunks([encode('a'), encode('\uFEFFb')]).text).toBe('a\uFEFFb');
  });

  test('behavior: incompleteTail counts the bytes of an unfinished character, none for a whole or invalid one', () => {
    const cases: Array<[number[], number]> = [
      [[], 0],
      [[0x61], 0],
      [[0xc3], 1],
      [[0xc3, 0xa9], 0],
      [[0xe2, 0x82], 2],
      [[0xe2, 0x82, 0xac], 0],
      [[0xf0, 0x9f, 0x98], 3],
      [[0xf0, 0x9f, 0x98, 0x80], 0],
      [[0x80, 0x80, 0x80], 0],
      [[0xc0], 0],
      [[0xff], 0],
      [[0x61, 0xf4], 1],
    ];
    for (const [bytes, held] of cases)
      expect(incompleteTail(Uint8Array.from(bytes)), String(bytes)).toBe(held);
  });
});

describe('createSseParser', () => {
  test('property: the events of any cut of a stream are those of the stream in one chunk', () => {
    const event = fc.record({
      event: fc.constantFrom('', 'message', 'error', 'é€'),
      data: fc.array(
        mixedText.map((t) => t.replace(/[\r\n]/g, '')),
        { minLength: 1, maxLength: 3 },
      ),
    });
    fc.assert(
      fc.property(
        fc.array(event, { maxLength: 6 }),
        fc.constantFrom('\n', '\r\n', '\r'),
        fc.array(fc.nat(), { maxLength: 8 }),
        (events, newline, cuts) => {
          const text = events
            .map(
              (e) =>
                `${e.event ? `event: ${e.event}${newline}` : ''}${e.data.map((d) => `data: ${d}${newline}`).join('')}${newline}`,
            )
            .join('');
          const bytes = encode(`\uFEFF${text}`);
          const whole = eventsInChunks([bytes]);
          expect(whole).toHaveLength(events.length);
          expect(eventsInChunks(cut(bytes, cuts))).toEqual(whole);
        },
      ),
      { numRuns: 1000 },
    );
  });
});
