#!/usr/bin/env bash
# `bench/instructions.sh chat|rpc|models|upstream [count]`: the CPU instructions one request costs, counted by
# valgrind (callgrind) over `count` sequential requests of bench/inproc.ts, start-up and warm-up not counted.
# Unlike time, an instruction count does not move with the machine's load: two commits can be compared on a
# busy machine. Slow (a few minutes: the measured requests run about 50 times slower); needs valgrind.
# BENCH_NODE_FLAGS: flags for node (--no-concurrent-recompilation: most runs agree within 0.3%, optimisation
# counted); BENCH_WARMUP: warm-up requests of inproc.ts (300); BENCH_KEEP: see below.
set -euo pipefail
target=${1:-chat}
count=${2:-300}
# BENCH_KEEP=dir keeps the callgrind files there (for callgrind_annotate); a temporary folder otherwise.
if [ -n "${BENCH_KEEP:-}" ]; then out=$BENCH_KEEP; mkdir -p "$out"; else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
log="$out/inproc.log"
BENCH_MARKS=1 BENCH_PROFILE=0 valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
  node ${BENCH_NODE_FLAGS:-} --import tsx bench/inproc.ts "$target" "$count" >"$log" 2>&1 &
runner=$!
wait_for() { until grep -q "BENCH_MARK $1" "$log"; do
  if ! kill -0 "$runner" 2>/dev/null; then cat "$log" >&2; exit 1; fi
  sleep 1
done; }
wait_for start
pid=$(grep "BENCH_MARK start" "$log" | awk '{print $3}')
callgrind_control -i on "$pid" >/dev/null 2>&1
kill -USR2 "$pid"
wait_for end
callgrind_control -d "$pid" >/dev/null 2>&1
kill -USR2 "$pid"
wait "$runner"
# The main thread's dump asked for at the end of the measured requests (cg.<pid>.1-01): not the one at exit,
# nor the threads of the garbage collector, the compiler or SQLite's checkpointer.
total=$(grep -h '^summary:' "$out/cg.$pid.1-01" | awk '{print $2}')
echo "$target: $count requests, $((total / count)) instructions per request ($(grep -m1 "^$target" "$log" | sed 's/;.*//'))"
