/**
 * server/yaml-values.ts: a YAML document's values as `toJS()` gives them, with every string that fits held one
 * byte a character. V8 keeps each piece the YAML parser cuts from a text with a character above U+00FF in two
 * bytes a character, and the map keys among them become the process's interned names; JSON made with such a
 * name was two bytes a character, however plain its text. How V8 holds a string is read from its serialisation:
 * `v8.serialize` tags a one-byte string `"` (0x22) and a two-byte string `c` (0x63).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { serialize } from 'node:v8';
import { describe, expect, test } from 'vitest';
import { parse, parseDocument, stringify } from 'yaml';
import { buildCatalog, DEFAULT_CATALOG_PATH, loadCatalog } from '../../server/catalog/load.ts';
import { loadContract } from '../../server/http/spec.ts';
import { oneByte, yamlValues } from '../../server/yaml-values.ts';
import { repoRoot } from '../support/contract.ts';

/** Whether V8 holds the string one byte a character. */
function isOneByte(text: string): boolean {
  return serialize(text)[2] === 0x22;
}

/** Every string of a value, keys included, with where it is. */
function* stringsOf(value: unknown, at = '$'): Generator<[string, string]> {
  if (typeof value === 'string') yield [at, value];
  else if (Array.isArray(value) || value instanceof Set)
    for (const [i, item] of [...value].entries()) yield* stringsOf(item, `${at}[${i}]`);
  else if (value instanceof Map)
    for (const [key, item] of value) {
      yield* stringsOf(key, `${at} (key)`);
      yield* stringsOf(item, `${at}.get(${String(key)})`);
    }
  else if (value && typeof value === 'object')
    for (const [key, item] of Object.entries(value)) {
      yield [`${at} (key)`, key];
      yield* stringsOf(item, `${at}.${key}`);
    }
}

/** The strings that fit one byte a character and are held in two. */
function wide(value: unknown): string[] {
  return [...stringsOf(value)]
    .filter(([, text]) => !/[\u0100-\uffff]/.test(text) && !isOneByte(text))
    .map(([at]) => at);
}

// The names are the test's own, each test's with a prefix of its own: once a name is interned, two bytes a
// character or one, every later string of the same text that names a property is that one.
const textWith = (p: string) => `
# A dash — in a comment is enough to make the whole text two bytes a character.
${p}title: Plain text
${p}note: "An arrow → stays as it is"
${p}latin: café, naïve
${p}block: |
  two lines
  of plain text
${p}list: [${p}one, "${p}two", 3, true, null]
${p}nested:
  ${p}inner: { ${p}deep: value }
${p}base: &base { ${p}a: 1, ${p}b: two }
${p}merged:
  <<: *base
  ${p}b: three
2: a number's key
10: another
~: a null key
__proto__: an own property
${p}alias: *base
`;

describe('yamlValues', () => {
  test('gives what toJS gives: the values, the keys and their order, merges, aliases, __proto__', () => {
    const text = textWith('ya_');
    const options = { merge: true } as const;
    const expected = parseDocument(text, options).toJS();
    const actual = yamlValues(parseDocument(text, options)) as Record<string, unknown>;
    expect(actual).toEqual(expected);
    expect(Object.keys(actual)).toEqual(Object.keys(expected));
    expect(JSON.stringify(actual)).toBe(JSON.stringify(expected));
    expect(Object.getPrototypeOf(actual)).toBe(Object.prototype);
    expect(Object.hasOwn(actual, '__proto__')).toBe(true);
    expect(actual['']).toBe('a null key');
    expect(actual.ya_merged).toEqual({ ya_a: 1, ya_b: 'three' });
  });

  test('holds every string that fits one byte a character in one byte, keys included', () => {
    // The check can fail: toJS's strings of such a text are two bytes a character (another prefix: toJS
    // interns its keys).
    expect(wide(parseDocument(textWith('yb_')).toJS()).length).toBeGreaterThan(10);
    const values = yamlValues(parseDocument(textWith('yc_'))) as Record<string, unknown>;
    expect(wide(values)).toEqual([]);
    // A string with a character above U+00FF is kept as it is.
    expect(values.yc_note).toBe('An arrow → stays as it is');
    expect(values.yc_latin).toBe('café, naïve');
    expect(isOneByte(values.yc_latin as string)).toBe(true);
  });

  test('oneByte: the same text', () => {
    for (const text of ['', 'plain', 'café ÿ', 'a → b', '😀', 'x'.repeat(10_000)])
      expect(oneByte(text)).toBe(text);
    expect(isOneByte(oneByte('plain — text'.slice(8)))).toBe(true);
  });
});

describe('what the server reads from YAML', () => {
  test("the contract's strings and keys fit one byte a character and are held so", () => {
    const { document } = loadContract();
    expect([...stringsOf(document)].length).toBeGreaterThan(10_000);
    expect(wide(document)).toEqual([]);
  });

  test("the catalogue's strings too, an operator's file with a wide character included", () => {
    expect(wide(loadCatalog())).toEqual([]);
    // An operator's file: a model like the default one, under a name of its own, in a text with a dash.
    const base = readFileSync(DEFAULT_CATALOG_PATH, 'utf8');
    const model = (parse(base) as { models: Record<string, { model_spec: object }> }).models['llama-3.3-70b'];
    // Texts of its own: a string equal to one interned already would be that one.
    const spec = {
      ...model?.model_spec,
      name: 'YD Model',
      description: 'A model of the test',
      modelSource: 'yd',
    };
    const override = `# An operator's catalogue — a dash in a comment.\n${stringify({ models: { 'yd-model': { ...model, model_spec: spec } } })}`;
    const catalog = buildCatalog([
      { path: DEFAULT_CATALOG_PATH, text: base },
      { path: 'override.yaml', text: override },
    ]);
    expect(catalog.models.has('yd-model')).toBe(true);
    expect(wide(catalog)).toEqual([]);
  });

  test("an answer's JSON, written by code compiled after the contract was read, is one byte a character", () => {
    // A fresh process, as the server's: the contract read first, then code that names the answer's fields (as a
    // handler is compiled on its first call). With the contract's keys interned two bytes a character, the
    // JSON was two bytes a character.
    const script = `
      import { serialize } from 'node:v8';
      import { loadContract } from './server/http/spec.ts';
      loadContract();
      const json = new Function(
        "return JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', choices: [{ index: 0, " +
          "finish_reason: 'stop', message: { role: 'assistant', content: 'Hello', reasoning_content: null } }], " +
          "usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 }, service_parameters: {} })",
      )();
      process.stdout.write(String(serialize(json)[2]));
    `;
    const tag = execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: repoRoot,
      encoding: 'utf8',
    });
    expect(tag).toBe(String(0x22));
  });
});
