/**
 * `node bench/heap-summary.mjs <file.heapprofile> <requests>`: a text summary of a sampling heap profile
 * written by `bench/inproc.ts` (`BENCH_ALLOCATED=1`: everything the measured requests allocated, what scavenges
 * collect included; `BENCH_PROMOTED=1`: what outlived one), per request: in all, by file, by function (self,
 * the function and column the sample was taken in) and inclusively. The client's allocations are in it too
 * (`node:_http_client`, `bench/inproc.ts`). TOP and TOPI set how many rows the last two lists have.
 */
import { readFileSync } from 'node:fs';

const [file, requests] = process.argv.slice(2);
const count = Number(requests);
if (!file || !(count > 0)) {
  console.error('usage: node bench/heap-summary.mjs <file.heapprofile> <requests>');
  process.exit(2);
}
const { head } = JSON.parse(readFileSync(file, 'utf8'));
const short = (url) => url.replace(/.*node_modules\//, 'nm/').replace(/.*\/work\/[^/]+\//, '');
const self = new Map();
const byFile = new Map();
const inclusive = new Map();
let total = 0;
const add = (map, key, size) => map.set(key, (map.get(key) ?? 0) + size);

/** Depth first, with the keys of the frames above (a recursive function counted once per stack). */
function walk(node, above) {
  const frame = node.callFrame;
  const key = `${frame.functionName || '(anon)'} ${short(frame.url)}:${frame.lineNumber}:${frame.columnNumber}`;
  const stack = above.includes(key) ? above : [...above, key];
  total += node.selfSize;
  add(self, key, node.selfSize);
  add(byFile, short(frame.url) || frame.functionName, node.selfSize);
  for (const k of stack) add(inclusive, k, node.selfSize);
  for (const child of node.children) walk(child, stack);
}
walk(head, []);

const top = (map, n) =>
  [...map]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([key, size]) => `${(size / count).toFixed(0).padStart(8)} B ${key}`)
    .join('\n');
console.log(`${file}: ${(total / count).toFixed(0)} bytes a request (${count} requests)`);
console.log('--- by file');
console.log(top(byFile, 30));
console.log('--- self');
console.log(top(self, Number(process.env.TOP ?? 40)));
console.log('--- inclusive');
console.log(top(inclusive, Number(process.env.TOPI ?? 40)));
