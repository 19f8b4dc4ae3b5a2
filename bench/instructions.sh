#!/usr/bin/env bash
# `bench/instructions.sh chat|rpc|models|upstream [count]` (or any other target of bench/inproc.ts, e.g.
# `chat-wallet`, `chat-wallet-solana`: their sign-ins are signed before the counted requests, which must then
# run within the five minutes a sign-in stays valid): the CPU instructions one request costs, counted by
# valgrind (callgrind) over `count` sequential requests of bench/inproc.ts, start-up and warm-up not counted.
# Unlike time, an instruction count does not move with the machine's load: two commits can be compared on a
# busy machine. Slow (a few minutes: the measured requests run about 50 times slower); needs valgrind.
# BENCH_NODE_FLAGS: flags for node (--no-concurrent-recompilation: optimisation then runs on the main thread
# and is counted); BENCH_WARMUP: warm-up requests of inproc.ts (3000 here: after 300, TurboFan was still
# compiling in the measured window, 46% of a chat's count with --no-concurrent-recompilation; twenty-third
# round); BENCH_KEEP: see below. It also prints the count with V8's compilation left out (the inclusive cost of
# its runtime's compile entries, from callgrind_annotate): the figure to compare. Some runs fall into a storm
# of inline-cache misses (Runtime_LoadIC_Miss, V8's stub cache): compare pairs of runs, not single ones.
set -euo pipefail
target=${1:-chat}
count=${2:-300}
# BENCH_KEEP=dir keeps the callgrind files there (for callgrind_annotate); a temporary folder otherwise.
if [ -n "${BENCH_KEEP:-}" ]; then out=$BENCH_KEEP; mkdir -p "$out"; else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
log="$out/inproc.log"
BENCH_WARMUP=${BENCH_WARMUP:-3000} BENCH_MARKS=1 BENCH_PROFILE=0 valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
  node ${BENCH_NODE_FLAGS:-} --import tsx bench/inproc.ts "$target" "$count" >"$log" 2>&1 &
runner=$!
# shellcheck source=bench/inproc-marks.sh
source "$(dirname "$0")/inproc-marks.sh"
wait_for_mark "$log" "$runner" start
pid=$(marked_pid "$log")
callgrind_control -i on "$pid" >/dev/null 2>&1
kill -USR2 "$pid"
wait_for_mark "$log" "$runner" end
callgrind_control -d "$pid" >/dev/null 2>&1
kill -USR2 "$pid"
wait "$runner"
# The main thread's dump asked for at the end of the measured requests (cg.<pid>.1-01): not the one at exit,
# nor the threads of the garbage collector, the compiler or SQLite's checkpointer.
dump="$out/cg.$pid.1-01"
total=$(grep -h '^summary:' "$dump" | awk '{print $2}')
# What V8's compilers cost on the main thread: their runtime entries' inclusive counts, summed.
compile=$(callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
  grep -E 'Runtime_(CompileOptimized|CompileLazy|CompileBaseline|InstallBaselineCode)\b' |
  awk '{ gsub(",", "", $1); sum += $1 } END { print sum + 0 }')
echo "$target: $count requests, $((total / count)) instructions per request, $(((total - compile) / count)) without V8's compilation ($(grep -m1 "^$target" "$log" | sed 's/;.*//'))"
