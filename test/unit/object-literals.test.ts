/**
 * The modules every chat completion and JSON-RPC call runs through write no object literal that starts with a
 * spread and goes on (`{ ...a, k: v }`, `{ ...a, ...b }`): they use `extend(a, { k: v })` (server/objects.ts)
 * or `Object.assign`. Once such a literal's code is warm, V8 11 (Node 20) makes a new hidden class, in the old
 * generation, for every member after the spread of every object it builds: measured at about 400 ns a member,
 * 14 per request on the chat upstream adapter's path (`node --log-maps`, bench/HISTORY.md, thirteenth round).
 * Code that runs once, at start (the services' wiring, a repository's wrapper), may spread as it likes.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { describe, expect, test } from 'vitest';
import { extend } from '../../server/objects.ts';
import { repoRoot } from '../support/contract.ts';
import { typescriptModules, whereIs } from '../support/sources.ts';

/** The modules on the request paths (folders: every module in them). */
const REQUEST_PATH = [
  'server/app.ts',
  'server/http',
  'server/domains/billing/charges.ts',
  'server/domains/chat/handlers.ts',
  'server/domains/chat/service.ts',
  'server/domains/chat/pricing.ts',
  'server/domains/chat/prompt.ts',
  'server/domains/chat/options.ts',
  'server/domains/limits',
  'server/domains/rpc',
  'server/providers/chat',
  'server/providers/rpc',
  'server/providers/upstream-post.ts',
  'server/storage',
  'client/sse.ts',
];

/** `file:line` of every object literal whose first member is a spread and that has more members. */
function leadingSpreads(path: string, text: string): string[] {
  const file = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true);
  const found: string[] = [];
  const visit = (node: ts.Node) => {
    const first = ts.isObjectLiteralExpression(node) ? node.properties[0] : undefined;
    if (first && ts.isSpreadAssignment(first) && (node as ts.ObjectLiteralExpression).properties.length > 1)
      found.push(whereIs(file, node));
    ts.forEachChild(node, visit);
  };
  visit(file);
  return found;
}

describe('object literals on the request paths', () => {
  test('none starts with a spread and goes on', () => {
    const files = typescriptModules(REQUEST_PATH);
    expect(files.length).toBeGreaterThan(30);
    expect(files.flatMap((path) => leadingSpreads(path, readFileSync(path, 'utf8')))).toEqual([]);
  });

  test('the check finds a leading spread followed by members or spreads, and nothing else', () => {
    const text = [
      'const a = { ...x, k: 1 };',
      'const b = { ...x, ...y };',
      'const c = { k: 1, ...x };',
      'const d = { ...x };',
      'const e = f({\n  ...(p ? { q: 1 } : {}),\n  r: 2,\n});',
    ].join('\n');
    expect(leadingSpreads(join(repoRoot, 'example.ts'), text)).toEqual([
      'example.ts:1',
      'example.ts:2',
      'example.ts:5',
    ]);
  });

  test('extend makes what the spread makes', () => {
    const a = { id: 'x', n: 1, shared: 'a' };
    const made = extend(a, { shared: 'b', more: true });
    expect(made).toEqual({ ...a, shared: 'b', more: true });
    expect(Object.keys(made)).toEqual(['id', 'n', 'shared', 'more']);
    expect(made).not.toBe(a);
    expect(a.shared).toBe('a');
  });

  test("extend's objects share their hidden classes once its caller is warm", () => {
    // In a child with V8's natives syntax, server/objects.ts loaded through tsx: two objects of a warm caller.
    const script = `
      import(${JSON.stringify(join(repoRoot, 'server', 'objects.ts'))}).then(({ extend }) => {
        const base = { id: 'x', object: 'o', created: 1, model: 'm' };
        const make = (b) => extend(b, { choices: [], usage: 1 });
        for (let i = 0; i < 100000; i++) make(base);
        console.log(JSON.stringify({ same: %HaveSameMap(make(base), make(base)) }));
      });
    `;
    const out = execFileSync(process.execPath, ['--import', 'tsx', '--allow-natives-syntax', '-e', script], {
      cwd: repoRoot,
      encoding: 'utf8',
    });
    expect(JSON.parse(out)).toEqual({ same: true });
  });
});
