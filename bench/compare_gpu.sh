#!/usr/bin/env bash
# compare_gpu.sh BENCH REFERENCE — make bench TG_DEVICE=CUDA on a machine with a GPU: our bench
# (W3, W4 at 1024 and 4096, and at 4096 on tensor cores (TF32), W5, W7) and then
# reference_torch_gpu.py (PyTorch eager and torch.compile, CUDA events) in the same call, and
# a table of both with ratios. It needs python3 with torch and a CUDA GPU.
set -euo pipefail
bench=$1 reference=$2
cache=$(mktemp -d /tmp/tg-bench-XXXXXX) ours=$(mktemp) theirs=$(mktemp)
trap 'rm -rf "$cache" "$ours" "$theirs"' EXIT
TG_CACHE_DIR=$cache TG_DEVICE=CUDA TG_BENCH=${TG_BENCH:-w3,w4,w5,w7} "$bench" | tee "$ours"
python3 "$reference" 2>/dev/null | tee "$theirs"
python3 - "$ours" "$theirs" <<'PY'
import json, re, sys
ours, theirs = open(sys.argv[1]).read(), open(sys.argv[2]).read()
torch = {}
for line in theirs.splitlines():
    if line.startswith("RESULT "):
        r = json.loads(line[7:]); torch[r["workload"]] = r
def step(name):   # our ms per step
    m = re.search(r"^%s\s+([\d.]+) ms/step" % re.escape(name), ours, re.M)
    return float(m.group(1)) if m else None
print("\n%-8s %12s %14s %14s %10s" % ("id", "ours", "torch eager", "torch.compile", "ours/eager"))
for ours_name, key in [("W3 mlp", "W3 mlp-large B256"), ("W5 gpt", "W5 gpt d128 L2 B16"),
                       ("W7 gpt", "W7 gpt d512 L6 T256 B32")]:
    e, c, o = torch.get(key + " eager"), torch.get(key + " compile"), step(ours_name)
    if o is None or e is None: continue
    print("%-8s %9.2f ms %11.2f ms %11.2f ms %10.2f" % (ours_name.split()[0], o, e["median_ms"],
          c["median_ms"] if c else float("nan"), o / e["median_ms"]))
for m in re.finditer(r"^W4 (matmul|tf32)\s+([\d.]+) GFLOP/s.*\bn (\d+)$", ours, re.M):
    kind = "tf32" if m.group(1) == "tf32" else "fp32"
    n, tf = m.group(3), float(m.group(2)) / 1e3
    ref = torch.get("matmul%s_%s" % (n, kind))
    if ref:
        print("%-8s %6.1f TFLOP/s %6.1f TFLOP/s (cuBLAS %s) %8.2f" % ("W4 " + n, tf,
              ref["tflops"], kind, tf / ref["tflops"]))
PY
