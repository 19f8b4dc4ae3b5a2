#!/usr/bin/env bash
# `bench/perf-report.sh <pid> <perf.data> <perf.txt> <requests>`: what bench/perf.sh and `PROFILE_PERF=1 npm run
# bench:profile` do with a recording of a Node process run with --perf-basic-prof: its JIT symbol map rewritten
# so that each address keeps its newest name (perf-map.mjs: V8 reuses collected code's memory), the main
# thread's samples (its tid is the pid: not V8's compiler and collector threads, nor SQLite's checkpointer) as
# text into <perf.txt>, and perf-summary.mjs's tables per request.
set -euo pipefail
pid=$1
data=$2
text=$3
requests=$4
here=$(dirname "$0")
node "$here/perf-map.mjs" "/tmp/perf-$pid.map"
perf script -i "$data" --tid "$pid" -F ip,sym 2>/dev/null >"$text"
node "$here/perf-summary.mjs" "$text" "$requests"
