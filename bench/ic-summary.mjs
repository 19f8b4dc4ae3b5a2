/**
 * `node bench/ic-summary.mjs <v8.log> [skip] [rows]`: where V8's inline caches miss, by function, property and
 * new state, from a log written with `node --log-ic --logfile=<v8.log> --no-logfile-per-isolate`, for example
 * `BENCH_PROFILE=0 node --log-ic --logfile=/tmp/ic.log --no-logfile-per-isolate --import tsx
 * bench/inproc.ts rpc 1000`. Every IC event of the log is a call into the runtime (`LoadIC_Miss`,
 * `StoreIC_Miss`, …); a property read or written at a site that sees many object shapes (state `N`,
 * megamorphic) misses again and again. `skip` is the share of the events to leave out from the start (the
 * start-up and warm-up; default 0.5), `rows` how many rows to print (default 60). The program counter of each
 * event is resolved to the code object that held it at that point of the log (`code-creation`, `code-move`).
 */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';

const [file, skipArg = '0.5', rowsArg = '60'] = process.argv.slice(2);
if (!file) {
  process.stderr.write('usage: node bench/ic-summary.mjs <v8.log> [skip] [rows]\n');
  process.exit(2);
}

/** Code objects by start address: a sorted list of starts and what each one is. */
const starts = [];
const code = new Map();
const indexOf = (address) => {
  let lo = 0;
  let hi = starts.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (starts[mid] < address) lo = mid + 1;
    else hi = mid;
  }
  return lo;
};
const add = (start, size, name) => {
  if (!code.has(start)) starts.splice(indexOf(start), 0, start);
  code.set(start, { size, name });
};
const remove = (start) => {
  if (!code.delete(start)) return;
  starts.splice(indexOf(start), 1);
};
const nameAt = (pc) => {
  const i = indexOf(pc + 1) - 1;
  if (i < 0) return '?';
  const entry = code.get(starts[i]);
  return pc < starts[i] + entry.size ? entry.name : '?';
};

const events = [];
const lines = createInterface({ input: createReadStream(file, { encoding: 'latin1' }) });
for await (const line of lines) {
  if (line.startsWith('code-creation,')) {
    const f = line.split(',');
    add(Number(f[4]), Number(f[5]), f.slice(6).join(','));
  } else if (line.startsWith('code-move,')) {
    const f = line.split(',');
    const entry = code.get(Number(f[1]));
    if (entry) {
      remove(Number(f[1]));
      add(Number(f[2]), entry.size, entry.name);
    }
  } else if (/^(Keyed)?(Load|Store)(Global)?IC,/.test(line)) {
    // type, pc, time, line, column, old state, new state, map, key, modifier, slow reason
    const f = line.split(',');
    events.push(`${f[0]} ${nameAt(Number(f[1])).slice(0, 110)} key=${f[8]} ->${f[6]} ${f[10] ?? ''}`);
  }
}
const kept = events.slice(Math.floor(events.length * Number(skipArg)));
const counts = new Map();
for (const key of kept) counts.set(key, (counts.get(key) ?? 0) + 1);
process.stdout.write(`${kept.length} IC events after the first ${Number(skipArg) * 100}%\n`);
for (const [key, n] of [...counts].sort((a, b) => b[1] - a[1]).slice(0, Number(rowsArg))) {
  process.stdout.write(`${String(n).padStart(7)} ${key}\n`);
}
