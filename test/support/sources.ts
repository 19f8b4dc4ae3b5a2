/**
 * The TypeScript modules of the repository that source checks read (test/unit/generator-scope.test.ts,
 * object-literals.test.ts), and where in them a syntax tree node is.
 */
import { readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import type ts from 'typescript';
import { repoRoot } from './contract.ts';

/** Absolute paths of the `.ts` modules (no `.d.ts`) of each entry: a file, or every module under a folder. */
export function typescriptModules(entries: string[]): string[] {
  return entries.flatMap((entry) => {
    const path = join(repoRoot, entry);
    if (entry.endsWith('.ts')) return [path];
    return readdirSync(path, { withFileTypes: true, recursive: true })
      .filter((e) => e.isFile() && e.name.endsWith('.ts') && !e.name.endsWith('.d.ts'))
      .map((e) => join(e.parentPath, e.name));
  });
}

/** `path:line` of a node, the path relative to the repository. */
export function whereIs(file: ts.SourceFile, node: ts.Node): string {
  return `${relative(repoRoot, file.fileName)}:${file.getLineAndCharacterOfPosition(node.getStart()).line + 1}`;
}
