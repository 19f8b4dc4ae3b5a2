/**
 * `node bench/perf-map.mjs <perf-PID.map>`: rewrites the JIT symbol map that `node --perf-basic-prof` writes so
 * that each address has one name, the newest. V8 appends a line (`start size name`, hex) for every code object
 * it makes, and reuses the memory of collected code for new code: in an `inproc.ts` chat run about a quarter
 * of the lines overlap an earlier one (6,640 of 24,836, nearly all at the same start). `perf script` then names
 * such an address after one of them, often start-up code long gone: the thirtieth round's profile under load
 * showed the YAML parser's `scalar` (which runs at start-up only) called from `writeReply`. perf.sh and
 * `PROFILE_PERF` sample after the warm-up, so the code alive while they sample is the newest at its address.
 * Each line is kept unless a later line overlaps it; the kept lines stay in their order.
 */
import { readFileSync, writeFileSync } from 'node:fs';

/** The lines of a perf map, each kept only if no later line overlaps its range. */
export function newestEntries(text) {
  const lines = text.split('\n').filter((line) => line.trim() !== '');
  const entries = lines.map((line) => {
    const [start, size] = line.split(' ');
    const from = BigInt(`0x${start}`);
    return { line, from, to: from + BigInt(`0x${size}`) };
  });
  // Walked from the newest: `taken` holds the kept ranges, sorted by start and disjoint.
  const taken = [];
  /** Where a range fits among the kept ones (its index), or -1 when it overlaps one. */
  const freeAt = (from, to) => {
    let lo = 0;
    let hi = taken.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (taken[mid].to <= from) lo = mid + 1;
      else hi = mid;
    }
    // The first kept range that ends after `from`: it overlaps if it starts before `to`.
    return lo < taken.length && taken[lo].from < to ? -1 : lo;
  };
  const kept = [];
  for (let i = entries.length - 1; i >= 0; i--) {
    const entry = entries[i];
    if (entry.to > entry.from) {
      const at = freeAt(entry.from, entry.to);
      if (at < 0) continue;
      taken.splice(at, 0, entry);
    }
    kept.push(entry.line);
  }
  return kept.reverse();
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [file] = process.argv.slice(2);
  if (!file) {
    process.stderr.write('usage: node bench/perf-map.mjs <perf-PID.map>\n');
    process.exit(2);
  }
  const text = readFileSync(file, 'utf8');
  const kept = newestEntries(text);
  writeFileSync(file, `${kept.join('\n')}\n`);
}
