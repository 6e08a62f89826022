#!/usr/bin/env bash
# run.sh BINARY [FILTER...] — how make test runs the test binary: in TG_TEST_PROCESSES processes
# at once (default: the machine's cores, at most 4), which share the cases (each runs the next
# one no other has taken: tests/main.cpp), then their output one process after another and one
# line that sums them, "N passed, N failed, N skipped". Exit status 1 on a failure.
# TG_TEST_CUDA_ON_CPU=LIBRARY (make test sets it; not with a FILTER): then the test files of
# TG_TEST_CUDA_FILES again with TG_DEVICE=CUDA, on that CPU stand-in for the CUDA driver and
# NVRTC (tests/cuda_on_cpu.cpp), counted in the same line.
set -uo pipefail
binary=$1
shift
processes=${TG_TEST_PROCESSES:-$(nproc 2>/dev/null || echo 1)}
((processes > 4)) && processes=4
((processes < 1)) && processes=1
work=$(mktemp -d /tmp/tg-run-XXXXXX)
trap 'rm -rf "$work"' EXIT

# run_stage NAME [FILTER...]: the binary in $processes processes, their output, their summaries
run_stage() {
    local name=$1
    shift
    mkdir "$work/claims.$name"
    for p in $(seq "$processes"); do
        TG_TEST_CLAIMS=$work/claims.$name "$binary" "$@" >"$work/out.$name.$p" 2>&1 &
    done
    wait
    for p in $(seq "$processes"); do
        # every line but the process's own summary, which the sum below replaces
        local out=$work/out.$name.$p summary
        summary=$(tail -n 1 "$out")
        if [[ ! $summary =~ ^[0-9]+\ passed,\ [0-9]+\ failed,\ [0-9]+\ skipped$ ]]; then
            cat "$out"
            echo "run.sh: test process $p ($name) ended without its summary line"
            echo "0 passed, 1 failed, 0 skipped" >>"$work/summaries"
            continue
        fi
        head -n -1 "$out"
        echo "$summary" >>"$work/summaries"
    done
}

run_stage all "$@"
if [[ -n ${TG_TEST_CUDA_ON_CPU:-} && $# -eq 0 ]]; then
    echo "-- again on CUDA, run by the CPU stand-in (tests/cuda_on_cpu.cpp), ${SECONDS} s after"\
         "the start: ${TG_TEST_CUDA_FILES:-}"
    (
        export TG_DEVICE=CUDA TG_CUDA_LIBRARY=$TG_TEST_CUDA_ON_CPU
        export TG_NVRTC_LIBRARY=$TG_TEST_CUDA_ON_CPU
        # shellcheck disable=SC2086  # a list of file names
        run_stage cuda ${TG_TEST_CUDA_FILES:-}
    )
fi
awk '{ p += $1; f += $3; s += $5 } END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' \
    "$work/summaries"
status=0
if grep -qv ' 0 failed' "$work/summaries"; then status=1; fi
exit $status
