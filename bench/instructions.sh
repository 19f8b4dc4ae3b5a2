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
# BENCH_CACHE_SIM=1: callgrind also simulates the caches (`--cache-sim=yes`: the first-level instruction and data
# caches as valgrind reads them off this CPU, and as its last level this CPU's second-level cache, read from
# sysfs: the VM reports a third level of 480 MB, which nothing of one process misses) and the line gains the
# misses per request. The VM has no hardware counters (`perf stat -e instructions true`: not supported), and a
# request's statements cost about four times as much in the server as in a loop because the rest of the request
# evicts them (bench/HISTORY.md, thirty-fifth round): misses tell a working set that shrank, which instructions
# do not.
cache_sim=()
if [ "${BENCH_CACHE_SIM:-}" = 1 ]; then
  cache_sim=(--cache-sim=yes)
  for level in /sys/devices/system/cpu/cpu0/cache/index*; do
    if [ "$(cat "$level/level" 2>/dev/null)" = 2 ] && [ "$(cat "$level/type")" = Unified ]; then
      size=$(cat "$level/size")
      case $size in *K) size=$((${size%K} * 1024)) ;; *M) size=$((${size%M} * 1048576)) ;; esac
      cache_sim+=("--LL=$size,$(cat "$level/ways_of_associativity"),$(cat "$level/coherency_line_size")")
    fi
  done
fi
BENCH_WARMUP=${BENCH_WARMUP:-3000} BENCH_MARKS=1 BENCH_PROFILE=0 valgrind --tool=callgrind "${cache_sim[@]}" --instr-atstart=no --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
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
if [ ${#cache_sim[@]} -gt 0 ]; then
  # The dump's `events:` line names the columns of its `summary:` line (Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw).
  awk -v count="$count" -v target="$target" '
    /^events:/ { for (i = 2; i <= NF; i++) name[i] = $i }
    /^summary:/ { for (i = 2; i <= NF; i++) value[name[i]] = $i }
    END {
      printf "%s: per request, first-level misses %d of instructions and %d of data (%d reads, %d writes), second-level (simulated last-level) misses %d\n",
        target, value["I1mr"] / count, (value["D1mr"] + value["D1mw"]) / count, value["D1mr"] / count,
        value["D1mw"] / count, (value["ILmr"] + value["DLmr"] + value["DLmw"]) / count
    }' "$dump"
fi
