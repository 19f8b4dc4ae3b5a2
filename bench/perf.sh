#!/usr/bin/env bash
# `bench/perf.sh chat|rpc|models|upstream [count]` (or any other target of bench/inproc.ts): where one request's
# CPU goes, by the JavaScript function nearest each sample, with what V8 itself does for it counted in (its
# builtins and runtime: JSON.parse's C++ parser, a property added by a transition search, an inline-cache
# miss), which V8's own sampling profiler files elsewhere or not at all. Linux `perf` samples the main thread
# of bench/inproc.ts (10 kHz, with call chains) over the measured requests only (BENCH_MARKS=1, as
# instructions.sh), and `node --perf-basic-prof` names the JIT's code. Prints bench/perf-summary.mjs's tables;
# PERF_FUNCTION=<regex> adds the call paths under the functions it matches (e.g. PERF_FUNCTION='^stream
# .*openai-compatible'). BENCH_KEEP=dir keeps perf.data and the script's text there. Needs perf; about a minute.
set -euo pipefail
target=${1:-chat}
count=${2:-3000}
if [ -n "${BENCH_KEEP:-}" ]; then out=$BENCH_KEEP; mkdir -p "$out"; else out=$(mktemp -d); fi
log="$out/inproc.log"
runner=''
recorder=''
pid=''
# Whatever happens: perf and the measured process stopped, the JIT's symbol map that --perf-basic-prof writes
# (/tmp/perf-<pid>.map) removed, and the temporary folder with it.
cleanup() {
  if [ -n "$recorder" ]; then kill -INT "$recorder" 2>/dev/null || true; fi
  if [ -n "$runner" ]; then kill "$runner" 2>/dev/null || true; fi
  if [ -n "$pid" ]; then rm -f "/tmp/perf-$pid.map"; fi
  if [ -z "${BENCH_KEEP:-}" ]; then rm -rf "$out"; fi
}
trap cleanup EXIT
# --perf-basic-prof turns V8's log on too: without a file of its own (in the temporary folder) it writes an
# isolate-*.log per thread into the working folder.
BENCH_MARKS=1 BENCH_PROFILE=0 node --perf-basic-prof --no-logfile-per-isolate --logfile="$out/v8.log" --import tsx bench/inproc.ts "$target" "$count" >"$log" 2>&1 &
runner=$!
# shellcheck source=bench/inproc-marks.sh
source "$(dirname "$0")/inproc-marks.sh"
wait_for_mark "$log" "$runner" start
pid=$(marked_pid "$log")
perf record -q -e cpu-clock -F 10000 -g -p "$pid" -o "$out/perf.data" >/dev/null 2>&1 &
recorder=$!
sleep 1
kill -USR2 "$pid"
wait_for_mark "$log" "$runner" end
kill -INT "$recorder"
wait "$recorder" || true
recorder=''
kill -USR2 "$pid"
wait "$runner"
runner=''
grep -m1 "^$target" "$log" | sed 's/;.*//'
bash "$(dirname "$0")/perf-report.sh" "$pid" "$out/perf.data" "$out/perf.txt" "$count"
