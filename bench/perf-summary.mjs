/**
 * `node bench/perf-summary.mjs <perf.txt> [requests]`: a `perf script -F ip,sym` text of one thread (call
 * chains, leaf first; bench/perf.sh makes it) summed by the JavaScript function nearest each sample's leaf:
 * the function's own code and whatever native code it called without another JavaScript frame between (V8's
 * builtins and runtime, Node's C++), so that JSON.parse's parser or a transition search counts to the function
 * that asked for it. With `requests`, each row also in µs per request (10 kHz: a sample is 100 µs of CPU).
 * PERF_FUNCTION=<regex>: the native call paths (three frames, leaf first) under the functions it matches
 * (`^\(no` for the samples without a JavaScript frame: the collector, libuv, the kernel).
 * PERF_TOP: rows per table (40).
 */
import { readFileSync } from 'node:fs';

const [file, requestsArg] = process.argv.slice(2);
if (!file) {
  process.stderr.write('usage: node bench/perf-summary.mjs <perf.txt> [requests]\n');
  process.exit(2);
}
const requests = Number(requestsArg) || 0;
const top = Number(process.env.PERF_TOP) || 40;
const pattern = process.env.PERF_FUNCTION ? new RegExp(process.env.PERF_FUNCTION) : undefined;
const SAMPLE_US = 100;

/** A frame's name: the address dropped; a JIT function's tier mark (`*` optimised, `^` baseline) and repo path too. */
function frameName(line) {
  return line
    .trim()
    .replace(/^[0-9a-f]+ /, '')
    .replace(/^JS:[*^~+]?/, 'JS:')
    .replace(/file:\/\/\/\S*?\/(server|client|bench|generated|node_modules)\//, '$1/')
    .replace(/v8::internal::/g, '');
}

const nearest = new Map();
const paths = new Map();
let samples = 0;
for (const block of readFileSync(file, 'utf8').split(/\n\s*\n/)) {
  const frames = block.split('\n').filter((line) => line.trim() !== '');
  if (frames.length === 0) continue;
  samples++;
  const at = frames.findIndex((line) => /\bJS:/.test(line));
  const name = at < 0 ? '(no JavaScript frame)' : frameName(frames[at]).slice(3);
  nearest.set(name, (nearest.get(name) ?? 0) + 1);
  if (pattern?.test(name)) {
    const path =
      at === 0
        ? '(its own code)'
        : frames
            .slice(0, at < 0 ? 3 : Math.min(at, 3))
            .map(frameName)
            .join(' <- ');
    paths.set(path, (paths.get(path) ?? 0) + 1);
  }
}

const row = (count) => {
  const share = `${((count / samples) * 100).toFixed(2).padStart(6)}%`;
  return requests > 0 ? `${share} ${((count * SAMPLE_US) / requests).toFixed(1).padStart(7)} µs` : share;
};
const print = (title, counts) => {
  console.log(`--- ${title}`);
  for (const [name, count] of [...counts].sort((a, b) => b[1] - a[1]).slice(0, top))
    console.log(`${row(count)} ${name}`);
};
console.log(`${samples} samples${requests > 0 ? `, ${requests} requests` : ''}`);
print('by the nearest JavaScript function (its own code and the native code it called)', nearest);
if (pattern) print(`under ${pattern}: the native call path (leaf first)`, paths);
