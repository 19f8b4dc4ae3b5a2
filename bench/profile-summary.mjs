/**
 * `node bench/profile-summary.mjs <dir or file>`: a text summary of a `.cpuprofile` (from `npm run
 * bench:profile` or `bench/inproc.ts`): where the samples fall by package or file, by function (self), and
 * inclusively. Given a directory, it reads the newest profile there, and of one run's profiles (the main thread
 * and each worker write one) the largest: the main thread's. Earlier runs' profiles stay in the directory.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';

const given = process.argv[2];
const file = statSync(given).isDirectory() ? newestProfile(given) : given;
console.log(`profile ${file}`);

function newestProfile(dir) {
  const profiles = readdirSync(dir)
    .filter((f) => f.endsWith('.cpuprofile'))
    .map((f) => ({ path: `${dir}/${f}`, ...statSync(`${dir}/${f}`) }));
  if (profiles.length === 0) throw new Error(`no .cpuprofile in ${dir}`);
  // One run's files are written within a second or so of each other: newest run first, then the largest.
  const newest = Math.max(...profiles.map((p) => p.mtimeMs));
  return profiles.filter((p) => p.mtimeMs > newest - 5_000).sort((a, b) => b.size - a.size)[0].path;
}
const prof = JSON.parse(readFileSync(file, 'utf8'));
const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const _self = new Map();
const _dt = prof.timeDeltas;
const samples = prof.samples;
const counts = new Map();
for (const s of samples) counts.set(s, (counts.get(s) ?? 0) + 1);
const total = samples.length;
const parent = new Map();
for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const key = (n) =>
  `${n.callFrame.functionName || '(anon)'} ${n.callFrame.url.replace(/.*node_modules\//, 'nm/').replace(/.*\/work\/[^/]+\//, '')}:${n.callFrame.lineNumber}`;
const incl = new Map();
const selfm = new Map();
const pkg = new Map();
for (const [id, c] of counts) {
  const n = byId.get(id);
  selfm.set(key(n), (selfm.get(key(n)) ?? 0) + c);
  const seen = new Set();
  let cur = id;
  while (cur !== undefined) {
    const k = key(byId.get(cur));
    if (!seen.has(k)) {
      seen.add(k);
      incl.set(k, (incl.get(k) ?? 0) + c);
    }
    cur = parent.get(cur);
  }
  const u = n.callFrame.url;
  const m = u.match(/node_modules\/((@[^/]+\/)?[^/]+)/);
  const p = m
    ? m[1]
    : /\/work\/[^/]+\//.test(u)
      ? u.replace(/.*\/work\/[^/]+\//, '')
      : u || n.callFrame.functionName;
  pkg.set(p, (pkg.get(p) ?? 0) + c);
}
const top = (m, n) =>
  [...m.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([k, v]) => `${((100 * v) / total).toFixed(1).padStart(5)}% ${k}`)
    .join('\n');
console.log('total samples', total, '\n--- self by package/file');
console.log(top(pkg, 30));
console.log('--- self');
console.log(top(selfm, Number(process.env.TOP ?? 30)));
console.log('--- inclusive');
console.log(top(incl, 60));
