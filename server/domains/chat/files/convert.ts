/**
 * File content parts (PDF, DOCX, PPTX, XLSX, TXT) turned into text before they reach a model. The format is
 * decided by the bytes (magic numbers, and for OOXML the parts inside the zip), with the declared mime type and
 * file extension only able to refuse a mismatch, never to make bytes be parsed as something they are not.
 * Parsing uses real libraries: unpdf (PDF.js) for PDF, mammoth for DOCX, fflate + fast-xml-parser for the
 * PPTX and XLSX parts. Input, unzipped size and output are capped.
 */

import { XMLParser } from 'fast-xml-parser';
import { strFromU8, unzipSync, zipSync } from 'fflate';
import mammoth from 'mammoth';
import { getDocumentProxy } from 'unpdf';

export type FileFormat = 'pdf' | 'docx' | 'pptx' | 'xlsx' | 'txt';

/** A file that cannot be turned into text (unknown or mismatched format, corrupt, encrypted, too large). */
export class UnsupportedFileError extends Error {
  override readonly name: string = 'UnsupportedFileError';
}

/** The input is over one of the size caps. */
export class FileTooLargeError extends UnsupportedFileError {
  override readonly name = 'FileTooLargeError';
}

export type FileInput = { filename?: string; mimeType?: string; data: Uint8Array };

export type FileToTextOptions = {
  /** Largest file accepted (default 25 MiB, the interface's file cap). */
  maxInputBytes?: number;
  /** Largest total unzipped size of the parts read from a DOCX/PPTX/XLSX (default 100 MiB). */
  maxUnzippedBytes?: number;
  /** Longest text returned; longer text is cut and marked (default 200,000 characters). */
  maxChars?: number;
};

const DEFAULTS = { maxInputBytes: 25 * 1024 * 1024, maxUnzippedBytes: 100 * 1024 * 1024, maxChars: 200_000 };

const OOXML_MIME: Record<string, FileFormat> = {
  'application/vnd.openxmlformats-officedocument.wordprocessingml.document': 'docx',
  'application/vnd.openxmlformats-officedocument.presentationml.presentation': 'pptx',
  'application/vnd.openxmlformats-officedocument.spreadsheetml.sheet': 'xlsx',
};
const TEXT_EXTENSIONS = new Set([
  'txt',
  'text',
  'md',
  'markdown',
  'csv',
  'tsv',
  'json',
  'log',
  'xml',
  'yaml',
  'yml',
]);
const TEXT_MIME = /^(text\/[\w.+-]+|application\/(json|xml|x-yaml|yaml|x-ndjson|[\w.+-]+\+(json|xml)))$/;
/** Types that say nothing about the content. */
const UNINFORMATIVE_MIME = new Set(['', 'application/octet-stream', 'binary/octet-stream']);

/** Converts a file to text; rejects with {@link UnsupportedFileError} for anything it cannot read. */
export async function fileToText(
  input: FileInput,
  options: FileToTextOptions = {},
): Promise<{ text: string; format: FileFormat }> {
  const limits = { ...DEFAULTS, ...options };
  const { data } = input;
  if (data.byteLength === 0) throw new UnsupportedFileError('the file is empty');
  if (data.byteLength > limits.maxInputBytes) {
    throw new FileTooLargeError(`the file is larger than ${limits.maxInputBytes} bytes`);
  }
  const declared = declaredFormat(input);
  const format = detect(data, declared);
  let text: string;
  switch (format) {
    case 'pdf':
      text = await pdfToText(data, limits.maxChars);
      break;
    case 'docx':
      text = await docxToText(data, limits);
      break;
    case 'pptx':
      text = pptxToText(data, limits);
      break;
    case 'xlsx':
      text = xlsxToText(data, limits);
      break;
    case 'txt':
      text = bytesToText(data);
      break;
  }
  return { text: capText(text.trim(), limits.maxChars), format };
}

/** What the mime type and extension claim: a supported format, 'other' (an unsupported type), or nothing. */
function declaredFormat(input: FileInput): FileFormat | 'other' | undefined {
  const mime = (input.mimeType ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  const fromMime: FileFormat | 'other' | undefined = UNINFORMATIVE_MIME.has(mime)
    ? undefined
    : mime === 'application/pdf'
      ? 'pdf'
      : (OOXML_MIME[mime] ?? (TEXT_MIME.test(mime) ? 'txt' : 'other'));
  const extension = input.filename?.match(/\.([A-Za-z0-9]{1,10})$/)?.[1]?.toLowerCase();
  const fromExtension: FileFormat | 'other' | undefined =
    extension === undefined
      ? undefined
      : extension === 'pdf' || extension === 'docx' || extension === 'pptx' || extension === 'xlsx'
        ? extension
        : TEXT_EXTENSIONS.has(extension)
          ? 'txt'
          : 'other';
  // The mime type is the stronger claim; a bare extension is a hint.
  return fromMime ?? fromExtension;
}

function detect(data: Uint8Array, declared: FileFormat | 'other' | undefined): FileFormat {
  const actual = sniff(data);
  if (actual === 'ole') {
    throw new UnsupportedFileError(
      'legacy Office files (.doc, .xls, .ppt) are not supported: save the file as DOCX, XLSX or PPTX',
    );
  }
  if (actual === 'binary') throw new UnsupportedFileError(`unsupported file type${describe(declared)}`);
  if (actual === 'zip') throw new UnsupportedFileError('a zip archive that is not a DOCX, PPTX or XLSX file');
  if (actual !== 'txt') {
    if (declared !== undefined && declared !== actual && declared !== 'txt' && declared !== 'other') {
      throw new UnsupportedFileError(`the file was declared as ${declared} but its content is ${actual}`);
    }
    return actual;
  }
  if (declared === 'other') throw new UnsupportedFileError(`unsupported file type${describe(declared)}`);
  if (declared !== undefined && declared !== 'txt') {
    throw new UnsupportedFileError(`the file was declared as ${declared} but its content is not`);
  }
  return 'txt';
}

const describe = (declared: FileFormat | 'other' | undefined) =>
  declared && declared !== 'other' ? ` (declared as ${declared})` : '';

/** The format by content: PDF and OOXML by structure, known binary formats refused, the rest tried as text. */
function sniff(data: Uint8Array): FileFormat | 'ole' | 'zip' | 'binary' {
  // PDF readers accept the header anywhere in the first 1,024 bytes.
  const head = Buffer.from(data.subarray(0, 1024)).toString('latin1');
  if (head.includes('%PDF-')) return 'pdf';
  if (startsWith(data, [0x50, 0x4b, 0x03, 0x04])) {
    const names = zipEntryNames(data);
    if (names.has('word/document.xml')) return 'docx';
    if (names.has('ppt/presentation.xml')) return 'pptx';
    if (names.has('xl/workbook.xml')) return 'xlsx';
    return 'zip';
  }
  if (startsWith(data, [0xd0, 0xcf, 0x11, 0xe0, 0xa1, 0xb1, 0x1a, 0xe1])) return 'ole';
  for (const magic of BINARY_MAGIC) if (startsWith(data, magic)) return 'binary';
  return 'txt';
}

/** Images, audio, video, archives and executables: never text. */
const BINARY_MAGIC = [
  [0x89, 0x50, 0x4e, 0x47], // PNG
  [0xff, 0xd8, 0xff], // JPEG
  [0x47, 0x49, 0x46, 0x38], // GIF
  [0x52, 0x49, 0x46, 0x46], // RIFF (WAV, WebP, AVI)
  [0x1f, 0x8b], // gzip
  [0x50, 0x4b, 0x05, 0x06], // empty zip
  [0x37, 0x7a, 0xbc, 0xaf], // 7z
  [0x7f, 0x45, 0x4c, 0x46], // ELF
  [0x4d, 0x5a], // PE
  [0x49, 0x44, 0x33], // MP3 with ID3
  [0x4f, 0x67, 0x67, 0x53], // Ogg
];

const startsWith = (data: Uint8Array, magic: number[]) => magic.every((byte, i) => data[i] === byte);

function zipEntryNames(data: Uint8Array): Set<string> {
  const names = new Set<string>();
  try {
    unzipSync(data, {
      filter(file) {
        names.add(file.name);
        return false;
      },
    });
  } catch (error) {
    throw new UnsupportedFileError('the file is a damaged zip archive', { cause: error });
  }
  return names;
}

/**
 * Reads the named parts of a zip, refusing archives whose parts would unzip past the cap. fflate inflates each
 * part into a buffer of its declared size, so a part that lies about its size cannot grow past it.
 */
function unzipBytes(
  data: Uint8Array,
  wanted: (name: string) => boolean,
  maxUnzippedBytes: number,
): Map<string, Uint8Array> {
  let total = 0;
  let files: Record<string, Uint8Array>;
  try {
    files = unzipSync(data, {
      filter(file) {
        if (!wanted(file.name)) return false;
        total += file.originalSize;
        if (total > maxUnzippedBytes) {
          throw new FileTooLargeError(`the document unzips to more than ${maxUnzippedBytes} bytes`);
        }
        return true;
      },
    });
  } catch (error) {
    if (error instanceof UnsupportedFileError) throw error;
    throw new UnsupportedFileError('the file is a damaged zip archive', { cause: error });
  }
  return new Map(Object.entries(files));
}

function unzipParts(
  data: Uint8Array,
  wanted: (name: string) => boolean,
  maxUnzippedBytes: number,
): Map<string, string> {
  const parts = unzipBytes(data, wanted, maxUnzippedBytes);
  return new Map([...parts].map(([name, bytes]) => [name, strFromU8(bytes)]));
}

async function pdfToText(data: Uint8Array, maxChars: number): Promise<string> {
  let pdf: Awaited<ReturnType<typeof getDocumentProxy>>;
  try {
    // PDF.js takes ownership of (detaches) the buffer it is given: hand it a copy.
    pdf = await getDocumentProxy(new Uint8Array(data), { verbosity: 0, isEvalSupported: false });
  } catch (error) {
    const name = error instanceof Error ? error.name : '';
    if (name === 'PasswordException') {
      throw new UnsupportedFileError('the PDF is encrypted with a password', { cause: error });
    }
    throw new UnsupportedFileError('the file is not a readable PDF', { cause: error });
  }
  try {
    const pages: string[] = [];
    let length = 0;
    for (let number = 1; number <= pdf.numPages && length <= maxChars; number++) {
      const page = await pdf.getPage(number);
      const content = await page.getTextContent();
      let text = '';
      for (const item of content.items) {
        if ('str' in item) text += item.str + (item.hasEOL ? '\n' : '');
      }
      page.cleanup();
      pages.push(text.trim());
      length += text.length;
    }
    return pages.filter(Boolean).join('\n\n');
  } catch (error) {
    throw new UnsupportedFileError('the PDF is damaged', { cause: error });
  } finally {
    await pdf.destroy();
  }
}

async function docxToText(data: Uint8Array, limits: typeof DEFAULTS): Promise<string> {
  // mammoth unzips with its own library, which trusts nothing but the compressed stream: a zip bomb would be
  // inflated whole. So the parts are unzipped here first (fflate stops each part at its declared size, and the
  // declared sizes are capped), then handed to mammoth re-packed, stored without compression.
  const parts = unzipBytes(data, () => true, limits.maxUnzippedBytes);
  const repacked = zipSync(Object.fromEntries(parts), { level: 0 });
  try {
    const result = await mammoth.extractRawText({ buffer: Buffer.from(repacked) });
    return result.value.replace(/\n{3,}/g, '\n\n');
  } catch (error) {
    throw new UnsupportedFileError('the DOCX file is damaged', { cause: error });
  }
}

type XmlNode = Record<string, unknown>;

const xml = new XMLParser({
  preserveOrder: true,
  ignoreAttributes: false,
  attributeNamePrefix: '',
  trimValues: false,
  parseTagValue: false,
  parseAttributeValue: false,
  htmlEntities: true,
});

function parseXml(text: string | undefined, part: string): XmlNode[] {
  if (text === undefined) throw new UnsupportedFileError(`the document has no ${part} part`);
  try {
    return xml.parse(text) as XmlNode[];
  } catch (error) {
    throw new UnsupportedFileError(`the document's ${part} part is not valid XML`, { cause: error });
  }
}

const tagOf = (node: XmlNode) => Object.keys(node).find((key) => key !== ':@') ?? '';
const localName = (tag: string) => tag.slice(tag.indexOf(':') + 1);
const kids = (node: XmlNode) => {
  const value = node[tagOf(node)];
  return Array.isArray(value) ? (value as XmlNode[]) : [];
};
const attr = (node: XmlNode, name: string) => {
  const value = (node[':@'] as Record<string, unknown> | undefined)?.[name];
  return typeof value === 'string' ? value : undefined;
};

/** Every element with this local name, depth first, in document order. */
function findAll(nodes: XmlNode[], name: string, out: XmlNode[] = []): XmlNode[] {
  for (const node of nodes) {
    const tag = tagOf(node);
    if (tag === '#text') continue;
    if (localName(tag) === name) out.push(node);
    findAll(kids(node), name, out);
  }
  return out;
}

/** The character data directly and deeply inside nodes, skipping the named elements. */
function textIn(nodes: XmlNode[], skip: ReadonlySet<string> = new Set()): string {
  let out = '';
  for (const node of nodes) {
    const tag = tagOf(node);
    if (tag === '#text') out += String(node['#text']);
    else if (!skip.has(localName(tag))) out += textIn(kids(node), skip);
  }
  return out;
}

/** `Relationship` id -> part name, resolved against the folder of the part that owns the relationships. */
function relationships(text: string | undefined, folder: string): Map<string, string> {
  const map = new Map<string, string>();
  if (text === undefined) return map;
  for (const rel of findAll(parseXml(text, 'relationships'), 'Relationship')) {
    const id = attr(rel, 'Id');
    const target = attr(rel, 'Target');
    if (!id || !target || attr(rel, 'TargetMode') === 'External') continue;
    map.set(id, resolvePart(folder, target));
  }
  return map;
}

function resolvePart(folder: string, target: string): string {
  const parts = target.startsWith('/') ? [] : folder.split('/').filter(Boolean);
  for (const segment of target.split('/')) {
    if (segment === '..') parts.pop();
    else if (segment !== '.' && segment !== '') parts.push(segment);
  }
  return parts.join('/');
}

const byNumber = (a: string, b: string) =>
  Number(a.match(/(\d+)\.xml$/)?.[1] ?? 0) - Number(b.match(/(\d+)\.xml$/)?.[1] ?? 0);

/** Slides in presentation order (falling back to slide-file numbering), one paragraph a line. */
function pptxToText(data: Uint8Array, limits: typeof DEFAULTS): string {
  const parts = unzipParts(
    data,
    (name) => /^ppt\/(presentation\.xml|_rels\/presentation\.xml\.rels|slides\/slide\d+\.xml)$/.test(name),
    limits.maxUnzippedBytes,
  );
  const rels = relationships(parts.get('ppt/_rels/presentation.xml.rels'), 'ppt');
  const ordered = findAll(parseXml(parts.get('ppt/presentation.xml'), 'presentation'), 'sldId')
    .map((slide) => rels.get(attr(slide, 'r:id') ?? ''))
    .filter((name): name is string => name !== undefined && parts.has(name));
  const slides =
    ordered.length > 0 ? ordered : [...parts.keys()].filter((n) => n.includes('/slides/')).sort(byNumber);

  const out: string[] = [];
  let length = 0;
  for (const [index, name] of slides.entries()) {
    if (length > limits.maxChars) break;
    const paragraphs = findAll(parseXml(parts.get(name), name), 'p')
      .filter((p) => tagOf(p) === 'a:p')
      .map((p) => drawingParagraph(kids(p)).trim())
      .filter(Boolean);
    const text = `Slide ${index + 1}:\n${paragraphs.join('\n')}`;
    out.push(text);
    length += text.length;
  }
  return out.join('\n\n');
}

/** A DrawingML paragraph: its `a:t` runs, with `a:br` as a line break. */
function drawingParagraph(nodes: XmlNode[]): string {
  let out = '';
  for (const node of nodes) {
    const tag = tagOf(node);
    if (tag === 'a:t') out += textIn(kids(node));
    else if (tag === 'a:br') out += '\n';
    else if (tag !== '#text') out += drawingParagraph(kids(node));
  }
  return out;
}

/** Every sheet in workbook order: a `Sheet: name` line, then one tab-separated line per row. */
function xlsxToText(data: Uint8Array, limits: typeof DEFAULTS): string {
  const parts = unzipParts(
    data,
    (name) =>
      /^xl\/(workbook\.xml|_rels\/workbook\.xml\.rels|sharedStrings\.xml|worksheets\/sheet\d+\.xml)$/.test(
        name,
      ),
    limits.maxUnzippedBytes,
  );
  const rels = relationships(parts.get('xl/_rels/workbook.xml.rels'), 'xl');
  const shared = parts.has('xl/sharedStrings.xml')
    ? findAll(parseXml(parts.get('xl/sharedStrings.xml'), 'shared strings'), 'si').map((si) =>
        // Phonetic guides (`rPh`) repeat the text in another script; they are not part of the value.
        textIn(kids(si), new Set(['rPh', 'phoneticPr'])),
      )
    : [];
  const sheets = findAll(parseXml(parts.get('xl/workbook.xml'), 'workbook'), 'sheet').map((sheet) => ({
    name: attr(sheet, 'name') ?? 'Sheet',
    part: rels.get(attr(sheet, 'r:id') ?? ''),
  }));

  const out: string[] = [];
  let length = 0;
  for (const sheet of sheets) {
    if (length > limits.maxChars) break;
    if (!sheet.part || !parts.has(sheet.part)) continue;
    const lines = [`Sheet: ${sheet.name}`];
    for (const row of findAll(parseXml(parts.get(sheet.part), sheet.part), 'row')) {
      const cells: string[] = [];
      for (const cell of kids(row).filter((c) => localName(tagOf(c)) === 'c')) {
        const column = columnIndex(attr(cell, 'r')) ?? cells.length;
        while (cells.length < column) cells.push('');
        cells[column] = cellValue(cell, shared);
      }
      while (cells.length > 0 && cells.at(-1) === '') cells.pop();
      if (cells.length > 0) lines.push(cells.join('\t'));
      length += cells.join('\t').length;
      if (length > limits.maxChars) break;
    }
    out.push(lines.join('\n'));
  }
  return out.join('\n\n');
}

function cellValue(cell: XmlNode, shared: string[]): string {
  const child = (name: string) => kids(cell).find((c) => localName(tagOf(c)) === name);
  const v = child('v');
  const raw = v ? textIn(kids(v)) : '';
  switch (attr(cell, 't')) {
    case 's':
      return clean(shared[Number(raw)] ?? '');
    case 'inlineStr': {
      const is = child('is');
      return clean(is ? textIn(kids(is), new Set(['rPh', 'phoneticPr'])) : '');
    }
    case 'b':
      return raw === '1' ? 'TRUE' : raw === '0' ? 'FALSE' : raw;
    default:
      return clean(raw);
  }
}

/** Tabs and line breaks inside a cell would break the row layout. */
const clean = (value: string) => value.replace(/[\t\r\n]+/g, ' ').trim();

/** `C7` -> 2 (zero-based column). */
function columnIndex(reference: string | undefined): number | undefined {
  const letters = reference?.match(/^([A-Z]{1,3})\d+$/)?.[1];
  if (!letters) return undefined;
  let index = 0;
  for (const letter of letters) index = index * 26 + (letter.charCodeAt(0) - 64);
  return index - 1;
}

/** UTF-8 (or UTF-16 with a byte-order mark) text; binary content is refused. */
function bytesToText(data: Uint8Array): string {
  let text: string;
  try {
    if (startsWith(data, [0xff, 0xfe])) text = new TextDecoder('utf-16le', { fatal: true }).decode(data);
    else if (startsWith(data, [0xfe, 0xff])) text = new TextDecoder('utf-16be', { fatal: true }).decode(data);
    else text = new TextDecoder('utf-8', { fatal: true }).decode(data); // drops a UTF-8 byte-order mark
  } catch (error) {
    throw new UnsupportedFileError('the file is neither a supported document nor UTF-8 text', {
      cause: error,
    });
  }
  // Tab, line feed, vertical tab, form feed and carriage return are text; other C0 controls mean binary.
  let controls = 0;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code === 0) throw new UnsupportedFileError('the file looks binary, not like text');
    if ((code < 0x20 && (code < 0x09 || code > 0x0d)) || code === 0x7f) controls++;
  }
  if (controls > text.length / 100) throw new UnsupportedFileError('the file looks binary, not like text');
  return text.replace(/\r\n?/g, '\n');
}

function capText(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  let cut = text.slice(0, maxChars);
  if (/[\ud800-\udbff]$/.test(cut)) cut = cut.slice(0, -1);
  return `${cut}\n[truncated: the text of this file is longer than ${maxChars} characters]`;
}

/**
 * Decodes an RFC 2397 `data:` URL (`data:application/pdf;base64,…`, or percent-encoded without `;base64`).
 * The mime type defaults to `text/plain`. Throws {@link UnsupportedFileError} on anything malformed.
 */
export function decodeDataUrl(url: string): { mimeType: string; data: Uint8Array } {
  const trimmed = url.trim();
  const comma = trimmed.indexOf(',');
  if (!/^data:/i.test(trimmed) || comma < 0) throw new UnsupportedFileError('not a data: URL');
  const header = trimmed
    .slice(5, comma)
    .split(';')
    .map((part) => part.trim());
  const payload = trimmed.slice(comma + 1);
  const base64 = header.length > 1 && header.at(-1)?.toLowerCase() === 'base64';
  const type = header[0]?.toLowerCase() ?? '';
  if (type !== '' && !/^[\w!#$&^.+-]+\/[\w!#$&^.+-]+$/.test(type)) {
    throw new UnsupportedFileError('the data: URL has a malformed media type');
  }
  const mimeType = type || 'text/plain';
  if (base64) return { mimeType, data: decodeBase64(payload) };
  try {
    return { mimeType, data: new Uint8Array(Buffer.from(percentDecode(payload), 'latin1')) };
  } catch (error) {
    throw new UnsupportedFileError('the data: URL has malformed percent-encoding', { cause: error });
  }
}

/**
 * The bytes of a chat `file` part's `file_data`: a `data:` URL, or bare base64 as some clients send it.
 * Throws {@link UnsupportedFileError} when it is neither.
 */
export function decodeFileData(fileData: string): { mimeType?: string; data: Uint8Array } {
  if (/^\s*data:/i.test(fileData)) return decodeDataUrl(fileData);
  return { data: decodeBase64(fileData) };
}

function decodeBase64(payload: string): Uint8Array {
  const compact = payload.replace(/\s+/g, '');
  const standard = compact.replace(/-/g, '+').replace(/_/g, '/');
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(standard) || standard.replace(/=+$/, '').length % 4 === 1) {
    throw new UnsupportedFileError('the data is not valid base64');
  }
  return new Uint8Array(Buffer.from(standard, 'base64'));
}

/** Percent-decoding to bytes (as latin1 code units), refusing a `%` that is not followed by two hex digits. */
function percentDecode(payload: string): string {
  if (/%(?![0-9a-fA-F]{2})/.test(payload)) throw new Error('a % not followed by two hex digits');
  const utf8 = Buffer.from(payload, 'utf8').toString('latin1');
  return utf8.replace(/%([0-9a-fA-F]{2})/g, (_m, hex: string) =>
    String.fromCharCode(Number.parseInt(hex, 16)),
  );
}
