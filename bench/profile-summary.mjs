/**
 * `node bench/profile-summary.mjs <dir>`: a text summary of the `.cpuprofile` in dir (from `npm run
 * bench:profile`): where the samples fall by package or file, by function (self), and inclusively.
 */
import { readdirSync, readFileSync } from 'node:fs';

const dir = process.argv[2];
const file = readdirSync(dir)
  .filter((f) => f.endsWith('.cpuprofile'))
  .map((f) => `${dir}/${f}`)[0];
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
