/**
 * `npm start`: runs `server/main.ts` in this very process (its pid is the server's) without a TypeScript
 * loader living in it. `tsx` on Node 20 transforms every module through loader hooks that run on a thread of
 * their own for the life of the process, and keeps the inline source map of every module: about 50 to 80 MB
 * of resident memory that serve nothing once the server has started. Instead, the server's own modules are
 * compiled once at start with esbuild (about half a second; the packages stay as they are in node_modules,
 * and modules loaded on first use with `import()` stay separate chunks, loaded only then) into
 * `node_modules/.cache/service-api/server-<content hash>/`, and that is imported. Behaviour is the same:
 * `import.meta.url` of every module is its source file's URL, so paths next to a module resolve as before.
 *
 * Stack traces: outside production the build has linked source maps and Node applies them, so traces name
 * the `.ts` files and lines; with `NODE_ENV=production` there are no source maps (traces name the compiled
 * chunk). Without esbuild or a writable node_modules, it falls back to the `tsx` loader. Tests and tools may
 * still run `node --import tsx server/main.ts` directly: same server.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, join, relative, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';

const root = fileURLToPath(new URL('..', import.meta.url));
const entry = join(root, 'server', 'main.ts');
const cacheDir = join(root, 'node_modules', '.cache', 'service-api');
const production = process.env.NODE_ENV === 'production';

/** Gives every module of ours its own file URL as `import.meta.url` (a bundle would give them its own). */
const sourceUrls = {
  name: 'source-import-meta-url',
  setup(build) {
    build.onLoad({ filter: /\.(ts|mts|js|mjs)$/ }, async (args) => {
      if (args.path.split(sep).includes('node_modules')) return undefined;
      const text = await readFile(args.path, 'utf8');
      return {
        contents: text.replaceAll('import.meta.url', JSON.stringify(pathToFileURL(args.path).href)),
        loader: /\.m?ts$/.test(args.path) ? 'ts' : 'js',
      };
    });
  },
};

/** Compiles the server and returns the URL of its entry module, or undefined when it cannot. */
async function compile() {
  let esbuild;
  try {
    esbuild = await import('esbuild');
  } catch {
    return undefined;
  }
  // Built as if into `server/` of the cache, then written to `server-<hash>` (same depth: the source maps'
  // relative paths hold), so that concurrent starts never see a half-written build.
  const started = Date.now();
  const outdir = join(cacheDir, 'server');
  const result = await esbuild.build({
    entryPoints: [entry],
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    packages: 'external',
    // No `keepNames`: it wraps every function, closures made per request included, in `__name(fn, "fn")`, an
    // `Object.defineProperty` that turns each closure into a dictionary-mode object (on the chat upstream path
    // about 27 per request). Without it, chats per second rose 13% (3,806 -> 4,304, 4 rounds each, separate
    // processes interleaved; bench/HISTORY.md, thirteenth round). Names stay V8's own; only a function renamed
    // for a clash between modules is named `parse2` in a stack trace instead of `parse`.
    keepNames: false,
    outdir,
    chunkNames: 'chunks/[name]-[hash]',
    sourcemap: production ? false : 'linked',
    sourcesContent: false,
    legalComments: 'none',
    write: false,
    logLevel: 'silent',
    plugins: [sourceUrls],
  });
  const took = Date.now() - started;
  const hash = createHash('sha256');
  for (const file of result.outputFiles) hash.update(relative(outdir, file.path)).update(file.contents);
  const name = `server-${hash.digest('hex').slice(0, 16)}`;
  const target = join(cacheDir, name);
  if (!existsSync(join(target, 'main.js'))) {
    const scratch = `${target}.${process.pid}.tmp`;
    for (const file of result.outputFiles) {
      const path = join(scratch, relative(outdir, file.path));
      mkdirSync(dirname(path), { recursive: true });
      writeFileSync(path, file.contents);
    }
    try {
      renameSync(scratch, target);
    } catch {
      // Another process wrote the same build first.
      rmSync(scratch, { recursive: true, force: true });
    }
  }
  prune(name);
  process.stderr.write(`server/start.mjs: compiled in ${took} ms: ${relative(root, target)}\n`);
  return pathToFileURL(join(target, 'main.js')).href;
}

/** Drops builds older than a day (the current one is kept). */
function prune(current) {
  const dayAgo = Date.now() - 86_400_000;
  for (const dir of readdirSync(cacheDir)) {
    if (dir === current || !dir.startsWith('server-')) continue;
    try {
      if (statSync(join(cacheDir, dir)).mtimeMs < dayAgo) rmSync(join(cacheDir, dir), { recursive: true });
    } catch {}
  }
}

// As in main.ts (which sets it too, for other ways of starting), but before any module is loaded: loading them
// is the process's first peak of memory.
setFlagsFromString('--heap-growing-percent=30');

const compiled = await compile().catch((error) => {
  process.stderr.write(`server/start.mjs: compiling failed, using the tsx loader instead: ${error}\n`);
  return undefined;
});
if (compiled) {
  if (!production) process.setSourceMapsEnabled(true);
  await import(compiled);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(pathToFileURL(entry).href);
}
