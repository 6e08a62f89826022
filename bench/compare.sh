#!/usr/bin/env bash
# compare.sh BENCH REFERENCE — make bench COMPARE=1: our bench and PyTorch's reference script
# (reference_torch.py, 1 and 2 threads) interleaved, ROUNDS times (default 2); per round and
# workload, our median, PyTorch's best median and the ratio ours / PyTorch (W4 as a time too;
# W2e, our W2 step run eagerly, beside PyTorch's W2; C1, a CNN of our own, beside
# bench/reference_own.py; R1, an LSTM of our own, too).
# It needs /usr/bin/python3 with torch (apt-get install -y python3-torch). TG_BENCH picks
# workloads.
set -euo pipefail
bench=$1 reference=$2
rounds=${ROUNDS:-2}
workloads=${TG_BENCH:-w1,w2,w3,w4,w5,c1,r1}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "compare: PyTorch is not installed for /usr/bin/python3 (apt-get install -y python3-torch)"
    exit 1
fi
cache=$(mktemp -d /tmp/tg-bench-XXXXXX)
trap 'rm -rf "$cache"' EXIT
printf "%-6s %-5s %14s %14s %9s  %s\n" round id "ours (ms)" "torch (ms)" ratio "load"
for round in $(seq "$rounds"); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    ours=$(TG_CACHE_DIR=$cache TG_BENCH=$workloads "$bench")
    for w in ${workloads//,/ }; do
        id=$(echo "$w" | tr a-z A-Z)
        # "W2 bengio  412.4 us/step median ...", "W4 matmul  1.3 GFLOP/s ..." -> milliseconds
        mine=$(echo "$ours" | awk -v id="$id" '$1 == id {
            v = $3; if ($4 ~ /^us/) v /= 1000; if ($4 ~ /^GFLOP/) v = 2 * 1024^3 / (v * 1e6)
            print v }')
        best=""
        for threads in 1 2; do
            script=$reference   # C1 and R1 are workloads of our own, with their own script
            [[ $w == c1 || $w == r1 ]] && script=$(dirname "$0")/reference_own.py
            ms=$(OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$script" --workload "$w" \
                     --threads "$threads" | sed -n 's/^RESULT //p' |
                 /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['median_ms'])")
            best=$(awk -v a="$best" -v b="$ms" 'BEGIN { print (a == "" || b < a) ? b : a }')
        done
        printf "%-6s %-5s %14.4f %14.4f %9.3f  %s\n" "$round" "$id" "$mine" "$best" \
            "$(awk -v a="$mine" -v b="$best" 'BEGIN { print a / b }')" "$load"
        # our W2 step run eagerly, beside PyTorch's W2 (an eager step too)
        eager=$(echo "$ours" | awk '$1 == "W2e" { print $3 / 1000 }')
        if [[ $id == W2 && -n $eager ]]; then
            printf "%-6s %-5s %14.4f %14.4f %9.3f  %s\n" "$round" W2e "$eager" "$best" \
                "$(awk -v a="$eager" -v b="$best" 'BEGIN { print a / b }')" "$load"
        fi
    done
done
