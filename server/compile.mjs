/**
 * Compiles one of our modules with everything of ours it imports into `node_modules/.cache/service-api/`, as
 * `npm start` runs the server (server/start.mjs) and as the in-process benchmarks load it (bench/inproc.ts): our
 * modules bundled (the packages stay as they are in node_modules, and modules loaded on first use with
 * `import()` stay separate chunks), each module's `import.meta.url` its source file's URL, and no `keepNames`
 * (below). The build goes to a folder named by its content's hash, written whole or not at all, so concurrent
 * starts never see a half-written build; builds of the same name older than a day are dropped.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, dirname, join, relative, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { isMainThread, parentPort, threadId, Worker, workerData } from 'node:worker_threads';

const root = fileURLToPath(new URL('..', import.meta.url));
const cacheDir = join(root, 'node_modules', '.cache', 'service-api');

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

/**
 * Compiles `entry` (a path from the repository's root) into a build named `name` on a worker thread; the URL of
 * its compiled entry module, or undefined when esbuild cannot be loaded. `sourceMaps`: linked source maps
 * beside the chunks. `log`: told how long it took and where it went.
 *
 * On a worker, not in the caller's thread: esbuild's JavaScript API, run where the server then runs, left the
 * object literal in Node's own `process.nextTick` megamorphic (its computed keys defined through V8's runtime on
 * every call from then on: 0.8% of a loaded chat's CPU, about 3.7 µs a chat under `perf`, none when the build
 * ran elsewhere; bench/HISTORY.md, thirty-sixth round). A worker has a JavaScript heap of its own.
 */
export function compile({ entry, name, sourceMaps, log }) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL(import.meta.url), {
      workerData: { compile: { entry, name, sourceMaps } },
    });
    let answer;
    let failure;
    worker.once('message', (message) => {
      answer = message;
    });
    worker.once('error', (error) => {
      failure = error;
    });
    // Settled once the worker is gone (its heap with it), before the caller loads the build.
    worker.once('exit', () => {
      if (failure !== undefined) reject(failure);
      else if (answer === undefined) reject(new Error('the compiling worker stopped without an answer'));
      else if (answer.error !== undefined) reject(new Error(answer.error));
      else {
        if (answer.message) log?.(answer.message);
        resolve(answer.url);
      }
    });
  });
}

// On the worker `compile` starts (its `workerData.compile`), the build.
if (!isMainThread && workerData?.compile) {
  let message;
  build({ ...workerData.compile, log: (text) => (message = text) }).then(
    (url) => parentPort.postMessage({ url, message }),
    (error) => parentPort.postMessage({ error: String(error?.stack ?? error) }),
  );
}

/** What `compile` does on its worker. */
async function build({ entry, name, sourceMaps, log }) {
  let esbuild;
  try {
    esbuild = await import('esbuild');
  } catch {
    return undefined;
  }
  const entryName = basename(entry).replace(/\.[mc]?[jt]s$/, '');
  // Built as if into `<name>/` of the cache, then written to `<name>-<hash>` (same depth: the source maps'
  // relative paths hold), so that concurrent starts never see a half-written build.
  const started = Date.now();
  const outdir = join(cacheDir, name);
  const result = await esbuild.build({
    entryPoints: [join(root, entry)],
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
    sourcemap: sourceMaps ? 'linked' : false,
    sourcesContent: false,
    legalComments: 'none',
    write: false,
    logLevel: 'silent',
    plugins: [sourceUrls],
  });
  const took = Date.now() - started;
  const hash = createHash('sha256');
  for (const file of result.outputFiles) hash.update(relative(outdir, file.path)).update(file.contents);
  const folder = `${name}-${hash.digest('hex').slice(0, 16)}`;
  const target = join(cacheDir, folder);
  if (!existsSync(join(target, `${entryName}.js`))) {
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
  prune(name, folder);
  log?.(`compiled in ${took} ms on worker thread ${threadId}: ${relative(root, target)}`);
  return pathToFileURL(join(target, `${entryName}.js`)).href;
}

/** Drops the builds of `name` older than a day (`current` is kept). */
function prune(name, current) {
  const dayAgo = Date.now() - 86_400_000;
  for (const dir of readdirSync(cacheDir)) {
    if (dir === current || !dir.startsWith(`${name}-`)) continue;
    try {
      if (statSync(join(cacheDir, dir)).mtimeMs < dayAgo) rmSync(join(cacheDir, dir), { recursive: true });
    } catch {}
  }
}
