#!/usr/bin/env bash
# run.sh BINARY [FILTER...] — how make test runs the test binary: in TG_TEST_PROCESSES processes
# at once (default: the machine's cores, at most 4), which share the cases (each runs the next
# one no other has taken: tests/main.cpp), then their output one process after another and one
# line that sums them, "N passed, N failed, N skipped". Exit status 1 on a failure.
set -uo pipefail
binary=$1
shift
processes=${TG_TEST_PROCESSES:-$(nproc 2>/dev/null || echo 1)}
((processes > 4)) && processes=4
((processes < 1)) && processes=1
work=$(mktemp -d /tmp/tg-run-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/claims"
for p in $(seq "$processes"); do
    TG_TEST_CLAIMS=$work/claims "$binary" "$@" >"$work/out.$p" 2>&1 &
done
wait
status=0
for p in $(seq "$processes"); do
    # every line but the process's own summary, which the sum below replaces
    summary=$(tail -n 1 "$work/out.$p")
    if [[ ! $summary =~ ^[0-9]+\ passed,\ [0-9]+\ failed,\ [0-9]+\ skipped$ ]]; then
        cat "$work/out.$p"
        echo "run.sh: test process $p ended without its summary line"
        echo "0 passed, 1 failed, 0 skipped" >>"$work/summaries"
        continue
    fi
    head -n -1 "$work/out.$p"
    echo "$summary" >>"$work/summaries"
done
awk '{ p += $1; f += $3; s += $5 } END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' \
    "$work/summaries"
if grep -qv ' 0 failed' "$work/summaries"; then status=1; fi
exit $status
