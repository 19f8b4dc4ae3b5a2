/**
 * A parsed YAML document as plain JavaScript values whose strings V8 stores one byte a character wherever they
 * can be: what `doc.toJS()` gives, except for how the strings are held.
 *
 * Why: V8 keeps a string of a file whose text has one character above U+00FF (the contract's descriptions have
 * `—`, `…` and `×`) in two bytes a character, and so every piece the YAML parser cuts from it. The map keys
 * among them become the process's interned names (`choices`, `finish_reason`, `usage`, ...), so every literal
 * of our own code with the same name, and every JSON text made from an object with such a key, was two bytes a
 * character: each chat answer and each streamed frame was built, measured (`Buffer.byteLength`) and written
 * to its socket on V8's and Node's slower two-byte paths (the thirty-second round: 37k to 39k instructions a
 * chat, 68k and more a streamed chat through the upstream adapter). A key is interned when it first names a
 * property, so the maps are read as `Map`s (`mapAsMap`, whose keys are not interned) and each string is copied
 * one byte a character before it names one. Strings with a character above U+00FF stay as they are. The copies
 * cost start-up about 7 to 16 ms for the contract and under 1 ms for the catalogue.
 *
 * `test/unit/yaml-values.test.ts` checks the values against `toJS()` and how V8 stores them.
 */
import type { Document, ToJSOptions } from 'yaml';
import { setOwn } from './objects.ts';

/** `doc.toJS(options)`, with the strings one byte a character wherever they fit. */
export function yamlValues(doc: Document, options: Omit<ToJSOptions, 'mapAsMap'> = {}): unknown {
  return compact(doc.toJS({ ...options, mapAsMap: true }));
}

/** Characters that one byte cannot hold (V8's one-byte strings are Latin-1). */
const WIDE = /[\u0100-\uffff]/;

/** The same text, in a string V8 stores one byte a character when every character fits. */
export function oneByte(text: string): string {
  return WIDE.test(text) ? text : Buffer.from(text, 'latin1').toString('latin1');
}

function compact(value: unknown): unknown {
  if (typeof value === 'string') return oneByte(value);
  if (Array.isArray(value)) return value.map(compact);
  if (!(value instanceof Map)) return value;
  const object: Record<string, unknown> = {};
  for (const [key, item] of value) {
    const name = keyName(key);
    // As `toJS` does: `__proto__` is an own property, not the object's prototype.
    setOwn(object, name, compact(item));
  }
  return object;
}

/**
 * The property name `toJS` gives a map's key (yaml's `stringifyKey`): a scalar's text, '' for null. A collection
 * as a key (which neither the contract nor a valid catalogue has) becomes its JSON here, its YAML flow text there.
 */
function keyName(key: unknown): string {
  if (typeof key === 'string') return oneByte(key);
  if (key === null || key === undefined) return '';
  if (typeof key === 'object') return oneByte(JSON.stringify(compact(key)));
  return oneByte(String(key));
}
