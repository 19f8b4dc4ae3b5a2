# Sourced by bench/instructions.sh and bench/perf.sh: bench/inproc.ts run with BENCH_MARKS=1 writes
# `BENCH_MARK start <pid>` before its measured requests and `BENCH_MARK end <pid>` after them, and waits for a
# SIGUSR2 after each; these wait for a mark in its log.

# wait_for_mark <log> <runner pid> <start|end>: until the mark is in the log; the log shown and exit 1 if the
# process ended first.
wait_for_mark() {
  until grep -qs "BENCH_MARK $3" "$1"; do
    if ! kill -0 "$2" 2>/dev/null; then cat "$1" >&2; exit 1; fi
    sleep 0.2
  done
}

# marked_pid <log>: the pid the start mark names.
marked_pid() { grep "BENCH_MARK start" "$1" | awk '{print $3}'; }
