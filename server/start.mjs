/**
 * `npm start`: runs `server/main.ts` in this very process (its pid is the server's) without a TypeScript
 * loader living in it. `tsx` on Node 20 transforms every module through loader hooks that run on a thread of
 * their own for the life of the process, and keeps the inline source map of every module: about 50 to 80 MB
 * of resident memory that serve nothing once the server has started. Instead, the server's own modules are
 * compiled once at start with esbuild on a worker thread (server/compile.mjs; about half a second; the
 * packages stay as they are in node_modules, and modules loaded on first use with `import()` stay separate
 * chunks, loaded only then) into `node_modules/.cache/service-api/server-<content hash>/`, and that is
 * imported. Behaviour is the same: `import.meta.url` of every module is its source file's URL, so paths next
 * to a module resolve as before.
 *
 * Stack traces: outside production the build has linked source maps and Node applies them, so traces name
 * the `.ts` files and lines; with `NODE_ENV=production` there are no source maps (traces name the compiled
 * chunk). Without esbuild or a writable node_modules, it falls back to the `tsx` loader. Tests and tools may
 * still run `node --import tsx server/main.ts` directly: same server.
 */
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { compile } from './compile.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
/** The server's entry, from the repository's root: compiled, or loaded through `tsx` when that fails. */
const entry = 'server/main.ts';
const production = process.env.NODE_ENV === 'production';

// As in main.ts (which sets it too, for other ways of starting), but before any module is loaded: loading them
// is the process's first peak of memory.
setFlagsFromString('--heap-growing-percent=30');

const compiled = await compile({
  entry,
  name: 'server',
  sourceMaps: !production,
  log: (message) => process.stderr.write(`server/start.mjs: ${message}\n`),
}).catch((error) => {
  process.stderr.write(`server/start.mjs: compiling failed, using the tsx loader instead: ${error}\n`);
  return undefined;
});
if (compiled) {
  if (!production) process.setSourceMapsEnabled(true);
  await import(compiled);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(pathToFileURL(join(root, entry)).href);
}
