#!/usr/bin/env bash
# ab.sh A B — two builds of the bench (A: before a change, B: after), run one after the other
# ROUNDS times (default 3: A, B, A, B, ...), each run with a fresh compile cache, so that both
# see the same moments of a noisy machine. Prints every run's figures, then per workload the
# median over the rounds of each and B / A. TG_BENCH and TG_DEVICE pass through to both (on a
# GPU: TG_DEVICE=CUDA TG_BENCH=w3,w4,w5,w7). A bench of an older revision:
#   git worktree add /tmp/base REV && make -C /tmp/base build/bench
set -euo pipefail
a=$1 b=$2
rounds=${ROUNDS:-3}
out=$(mktemp -d /tmp/tg-ab-XXXXXX)
trap 'rm -rf "$out"' EXIT
for round in $(seq "$rounds"); do
    for side in A B; do
        bin=$a
        [[ $side == B ]] && bin=$b
        cache=$(mktemp -d /tmp/tg-ab-cache-XXXXXX)
        echo "-- round $round, $side ($bin), load $(cut -d' ' -f1-3 /proc/loadavg)"
        TG_CACHE_DIR=$cache "$bin" | tee "$out/$side.$round"
        rm -rf "$cache"
    done
done
python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
# "W3 mlp  0.40 ms/step median ...", "W4 matmul  17012.3 GFLOP/s median ... n 4096", "C1 cnn ..."
line = re.compile(r"^([WC]\d\w*)\s+(\S+)\s+([\d.]+)\s+(\S+)")
figures = {}   # (workload, unit) -> side -> values
for side in "AB":
    for r in range(1, rounds + 1):
        for text in open("%s/%s.%d" % (out, side, r)):
            m = line.match(text)
            if not m: continue
            n = re.search(r"\bn (\d+)\s*$", text)
            key = (m.group(1) + " " + m.group(2) + (" n " + n.group(1) if n else ""), m.group(4))
            figures.setdefault(key, {}).setdefault(side, []).append(float(m.group(3)))
print("\n%-22s %-10s %12s %12s %8s" % ("workload", "unit", "A median", "B median", "B / A"))
for (name, unit), sides in figures.items():
    if "A" not in sides or "B" not in sides: continue
    ma, mb = statistics.median(sides["A"]), statistics.median(sides["B"])
    print("%-22s %-10s %12.4g %12.4g %8.3f" % (name, unit, ma, mb, mb / ma if ma else float("nan")))
PY
