import { describe, expect, test } from 'vitest';
import {
  decodeDataUrl,
  decodeFileData,
  FileTooLargeError,
  fileToText,
  UnsupportedFileError,
} from '../../server/domains/chat/files/convert.ts';
import {
  buildDocx,
  buildPdf,
  buildPptx,
  buildXlsx,
  buildZip,
  withDeclaredSizes,
} from '../fixtures/files/build.ts';

const MIME = {
  pdf: 'application/pdf',
  docx: 'application/vnd.openxmlformats-officedocument.wordprocessingml.document',
  pptx: 'application/vnd.openxmlformats-officedocument.presentationml.presentation',
  xlsx: 'application/vnd.openxmlformats-officedocument.spreadsheetml.sheet',
};
const utf8 = (text: string) => new Uint8Array(Buffer.from(text, 'utf8'));

async function refusal(promise: Promise<unknown>): Promise<UnsupportedFileError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(UnsupportedFileError);
  return error as UnsupportedFileError;
}

describe('fileToText: PDF', () => {
  test('behavior: the text layer of every page comes out, pages in order, with line breaks', async () => {
    const data = buildPdf([['Quarterly report', 'Revenue grew (a lot) in Q3'], ['Second page: conclusions']]);
    const result = await fileToText({ filename: 'report.pdf', mimeType: MIME.pdf, data });
    expect(result.format).toBe('pdf');
    expect(result.text).toContain('Quarterly report\nRevenue grew (a lot) in Q3');
    expect(result.text.indexOf('Revenue grew')).toBeLessThan(result.text.indexOf('Second page: conclusions'));
  });

  test('behavior: the caller keeps its buffer (PDF.js gets a copy)', async () => {
    const data = buildPdf([['keep me']]);
    await fileToText({ data });
    expect(data.byteLength).toBeGreaterThan(0);
    expect(Buffer.from(data.subarray(0, 5)).toString('latin1')).toBe('%PDF-');
  });

  test('behavior: a damaged PDF is an UnsupportedFileError, not a crash', async () => {
    const data = new Uint8Array(Buffer.from('%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage', 'latin1'));
    const error = await refusal(fileToText({ filename: 'x.pdf', data }));
    expect(error.message).toMatch(/PDF/);
  });
});

describe('fileToText: DOCX', () => {
  test('behavior: paragraphs come out as text, entities decoded', async () => {
    const data = buildDocx(['Meeting notes', 'Tom & Jérôme agreed on <budget> "B"', 'Next steps']);
    const result = await fileToText({ filename: 'notes.docx', mimeType: MIME.docx, data });
    expect(result.format).toBe('docx');
    expect(result.text).toContain('Meeting notes');
    expect(result.text).toContain('Tom & Jérôme agreed on <budget> "B"');
    expect(result.text.split(/\n+/)).toEqual([
      'Meeting notes',
      'Tom & Jérôme agreed on <budget> "B"',
      'Next steps',
    ]);
  });
});

describe('fileToText: PPTX', () => {
  test('behavior: slides in presentation order (not file order), a line per paragraph, breaks kept', async () => {
    const data = buildPptx(
      [
        ['File one title', 'bullet & more'],
        ['File two title', 'line a\nline b'],
      ],
      [2, 1],
    );
    const result = await fileToText({ filename: 'deck.pptx', mimeType: MIME.pptx, data });
    expect(result.format).toBe('pptx');
    expect(result.text).toBe(
      'Slide 1:\nFile two title\nline a\nline b\n\nSlide 2:\nFile one title\nbullet & more',
    );
  });
});

describe('fileToText: XLSX', () => {
  test('behavior: every sheet by name; shared, inline, numeric and boolean cells; gaps keep columns', async () => {
    const data = buildXlsx([
      {
        name: 'Budget',
        rows: [
          ['Item', 'Cost', 'Approved'],
          ['Servers', 1200.5, true],
          ['Travel', null, false, '=inline note'],
        ],
      },
      { name: 'Notes & more', rows: [['Item'], [null, 'second column']] },
    ]);
    const result = await fileToText({ filename: 'budget.xlsx', mimeType: MIME.xlsx, data });
    expect(result.format).toBe('xlsx');
    expect(result.text).toBe(
      [
        'Sheet: Budget',
        'Item\tCost\tApproved',
        'Servers\t1200.5\tTRUE',
        'Travel\t\tFALSE\tinline note',
        '',
        'Sheet: Notes & more',
        'Item',
        '\tsecond column',
      ].join('\n'),
    );
  });
});

describe('fileToText: TXT', () => {
  test('behavior: UTF-8 passes through (byte-order mark dropped, CRLF normalised)', async () => {
    const data = new Uint8Array([0xef, 0xbb, 0xbf, ...utf8('héllo wörld\r\nline two ✓')]);
    const result = await fileToText({ filename: 'a.txt', mimeType: 'text/plain', data });
    expect(result).toEqual({ text: 'héllo wörld\nline two ✓', format: 'txt' });
  });

  test('behavior: UTF-16 with a byte-order mark is decoded', async () => {
    const data = new Uint8Array([0xff, 0xfe, ...Buffer.from('utf sixteen', 'utf16le')]);
    expect((await fileToText({ data })).text).toBe('utf sixteen');
  });

  test('behavior: markdown, CSV and JSON count as text', async () => {
    expect((await fileToText({ filename: 'r.md', data: utf8('# Title') })).format).toBe('txt');
    expect((await fileToText({ mimeType: 'text/csv', data: utf8('a,b\n1,2') })).format).toBe('txt');
    expect((await fileToText({ mimeType: 'application/json', data: utf8('{"a":1}') })).text).toBe('{"a":1}');
  });

  test('behavior: invalid UTF-8 and binary bytes are refused', async () => {
    await refusal(fileToText({ filename: 'a.txt', data: new Uint8Array([0x68, 0x69, 0xff, 0xfe, 0xfd]) }));
    await refusal(fileToText({ filename: 'a.txt', data: utf8('abc\u0000def') }));
    const controls = utf8(`${'\u0001\u0002\u0003'.repeat(5)}mostly text`);
    expect((await refusal(fileToText({ data: controls }))).message).toMatch(/binary/);
  });
});

describe('fileToText: format detection', () => {
  test('behavior: the content decides; a missing or generic mime type and a wrong-looking name do not matter', async () => {
    const pdf = buildPdf([['detected by magic']]);
    expect((await fileToText({ mimeType: 'application/octet-stream', data: pdf })).format).toBe('pdf');
    expect((await fileToText({ data: buildDocx(['x']) })).format).toBe('docx');
    expect((await fileToText({ data: buildPptx([['x']]) })).format).toBe('pptx');
    expect((await fileToText({ data: buildXlsx([{ name: 'S', rows: [['x']] }]) })).format).toBe('xlsx');
  });

  test('behavior: a declared format the bytes contradict is refused', async () => {
    const asPdf = await refusal(fileToText({ mimeType: MIME.pdf, data: utf8('just text') }));
    expect(asPdf.message).toMatch(/declared as pdf/);
    await refusal(fileToText({ filename: 'deck.pptx', data: buildDocx(['a word file']) }));
    await refusal(fileToText({ mimeType: MIME.xlsx, data: buildPdf([['pdf']]) }));
  });

  test('behavior: unsupported types are refused: images, other zips, legacy Office, declared non-text', async () => {
    const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0]);
    await refusal(fileToText({ filename: 'a.png', data: png }));
    const otherZip = await refusal(fileToText({ data: buildZip({ 'readme.txt': 'hello' }) }));
    expect(otherZip.message).toMatch(/zip/);
    const ole = new Uint8Array([0xd0, 0xcf, 0x11, 0xe0, 0xa1, 0xb1, 0x1a, 0xe1, 0, 0, 0, 0]);
    expect((await refusal(fileToText({ filename: 'old.doc', data: ole }))).message).toMatch(/legacy/);
    await refusal(fileToText({ mimeType: 'image/png', data: utf8('pretends to be an image') }));
    await refusal(fileToText({ filename: 'movie.mp4', data: utf8('text named like a video') }));
    await refusal(fileToText({ data: new Uint8Array() }));
  });
});

describe('fileToText: caps', () => {
  test('behavior: input larger than maxInputBytes is refused', async () => {
    const error = await refusal(fileToText({ data: utf8('x'.repeat(2_000)) }, { maxInputBytes: 1_000 }));
    expect(error).toBeInstanceOf(FileTooLargeError);
  });

  test('behavior: text longer than maxChars is cut and marked', async () => {
    const result = await fileToText({ data: utf8('abcdefghij'.repeat(100)) }, { maxChars: 50 });
    expect(result.text.startsWith('abcdefghij'.repeat(5))).toBe(true);
    expect(result.text).toMatch(/\n\[truncated: .* 50 characters\]$/);
    const pdf = await fileToText({ data: buildPdf([['page one text'], ['page two text']]) }, { maxChars: 5 });
    expect(pdf.text).toMatch(/^page \n\[truncated/);
  });

  test('behavior: a document whose parts unzip past maxUnzippedBytes is refused before it is inflated', async () => {
    const docx = buildDocx(['z'.repeat(50_000)]);
    expect(await refusal(fileToText({ data: docx }, { maxUnzippedBytes: 10_000 }))).toBeInstanceOf(
      FileTooLargeError,
    );
    const xlsx = buildXlsx([{ name: 'S', rows: [['y'.repeat(50_000)]] }]);
    expect(await refusal(fileToText({ data: xlsx }, { maxUnzippedBytes: 10_000 }))).toBeInstanceOf(
      FileTooLargeError,
    );
    // The same files pass with the default cap.
    expect((await fileToText({ data: docx })).text).toHaveLength(50_000);
  });
});

describe('fileToText: zip bombs', () => {
  test('behavior: a DOCX whose parts lie about their size is refused (parts are cut at the declared size)', async () => {
    // 30 MB of text that compresses to almost nothing, declared as 4 KB per part.
    const bomb = withDeclaredSizes(buildDocx(['a'.repeat(30_000_000)]), 4_096);
    // Inflated whole, this would parse; stopped at the declared size, the XML is cut and the file is refused.
    const error = await refusal(fileToText({ filename: 'bomb.docx', data: bomb }));
    expect(error.message).toMatch(/damaged/);
  });

  test('behavior: XLSX parts that lie about their size are read only up to the declared size', async () => {
    const bomb = withDeclaredSizes(buildXlsx([{ name: 'S', rows: [['b'.repeat(30_000_000)]] }]), 4_096);
    const result = await fileToText({ data: bomb }, { maxChars: 100_000_000 });
    expect(result.text.length).toBeLessThan(4_096);
  });
});

describe('decodeDataUrl', () => {
  test('behavior: base64 data URLs give the bytes and the media type', () => {
    const pdf = buildPdf([['x']]);
    const url = `data:application/pdf;base64,${Buffer.from(pdf).toString('base64')}`;
    const decoded = decodeDataUrl(url);
    expect(decoded.mimeType).toBe('application/pdf');
    expect(Buffer.from(decoded.data).equals(Buffer.from(pdf))).toBe(true);
  });

  test('behavior: parameters are allowed, percent-encoding is decoded, the type defaults to text/plain', () => {
    const withCharset = decodeDataUrl('data:text/plain;charset=utf-8;base64,aMOpbGxv');
    expect(Buffer.from(withCharset.data).toString('utf8')).toBe('héllo');
    const plain = decodeDataUrl('data:,hello%20world%C3%A9');
    expect(plain.mimeType).toBe('text/plain');
    expect(Buffer.from(plain.data).toString('utf8')).toBe('hello worldé');
  });

  test('behavior: malformed input throws UnsupportedFileError', () => {
    for (const bad of [
      'hello',
      'data:application/pdf;base64',
      'data:application/pdf;base64,@@@not-base64',
      'data:application/pdf;base64,A',
      'data:not a type;base64,AAAA',
      'data:,bad%zzescape',
      'https://example.com/file.pdf',
    ]) {
      expect(() => decodeDataUrl(bad), bad).toThrow(UnsupportedFileError);
    }
  });

  test('behavior: file_data also accepts bare base64 (and refuses junk)', () => {
    expect(Buffer.from(decodeFileData('aGVsbG8=').data).toString()).toBe('hello');
    expect(decodeFileData('data:text/plain;base64,aGk=').mimeType).toBe('text/plain');
    expect(() => decodeFileData('not base64 at all!')).toThrow(UnsupportedFileError);
  });
});
