/**
 * Generator functions are declared at module level in the server and the client, never inside another
 * function. Each closure of a generator function gets its own initial map the first time it makes a
 * generator; V8 allocates maps in the old generation, and the map points back at the closure and so at the
 * scope it was made in. Made per request, that map outlives the request and keeps the request's young
 * objects alive through every scavenge until a mark-compact: on the chat upstream adapter's path three
 * such generators promoted 13.6 KB per request (3.4 KB once they moved to module level) and doubled the
 * scavenges' pauses (bench/HISTORY.md, thirteenth round).
 *
 * Generator methods of objects (a provider's `async *stream()`) are left to review: the objects that carry
 * them are made once, when the server starts.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { describe, expect, test } from 'vitest';
import { repoRoot } from '../support/contract.ts';
import { typescriptModules, whereIs } from '../support/sources.ts';

/** `file:line name` of every generator declaration or expression nested inside a function. */
function nestedGenerators(path: string, text: string): string[] {
  const file = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true);
  const found: string[] = [];
  const visit = (node: ts.Node, insideFunction: boolean) => {
    if (
      insideFunction &&
      (ts.isFunctionDeclaration(node) || ts.isFunctionExpression(node)) &&
      node.asteriskToken
    ) {
      found.push(`${whereIs(file, node)} ${node.name?.text ?? '(anonymous)'}`);
    }
    const inside = insideFunction || ts.isFunctionLike(node);
    ts.forEachChild(node, (child) => visit(child, inside));
  };
  visit(file, false);
  return found;
}

describe('generator functions', () => {
  test('the server and the client declare none inside another function', () => {
    const files = typescriptModules(['server', 'client']);
    expect(files.length).toBeGreaterThan(50);
    const nested = files.flatMap((path) => nestedGenerators(path, readFileSync(path, 'utf8')));
    expect(nested).toEqual([]);
  });

  test('the check finds declarations, expressions and async ones at any depth, not module-level ones', () => {
    const text = [
      'export function* top() { yield 1; }',
      'export async function* topAsync() { yield 1; }',
      'export function outer() {',
      '  function* inner() { yield 1; }',
      '  const lines = (function* () { yield 2; })();',
      '  return () => { async function* deep() { yield 3; } return [inner, lines, deep]; };',
      '}',
      'export const provider = { async *stream() { yield 1; } };',
    ].join('\n');
    expect(nestedGenerators(join(repoRoot, 'example.ts'), text)).toEqual([
      'example.ts:4 inner',
      'example.ts:5 (anonymous)',
      'example.ts:6 deep',
    ]);
  });
});
