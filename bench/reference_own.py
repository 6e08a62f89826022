# reference_own.py — PyTorch's side of bench.cpp's workloads of our own, on the CPU: C1 (a
# small CNN's training step) and R1 (a 2-layer LSTM language model's), in the form of
# shared/bench/reference_torch.py: --workload c1|r1 --threads N, one line "RESULT {json}"
# with median_ms over blocks of steps. Needs /usr/bin/python3 with torch
# (apt-get install -y python3-torch libopenblas0-pthread).
import argparse, ctypes, json, statistics, time

# glibc gives each large freed block back to the system and the next step's allocation takes
# fresh pages, one fault each: PyTorch's step took 60-90 ms so here, 18-24 ms without it. Its
# best is the rival, so freed memory stays in the process, as a tuned PyTorch would run.
libc = ctypes.CDLL("libc.so.6")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--workload", required=True, choices=["c1", "r1"])
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(1337)

if args.workload == "c1":
    POOL, BATCH, CLASSES = 1024, 64, 10
    X, Y = torch.randn(POOL, 3, 32, 32), torch.randint(0, CLASSES, (POOL,))
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(64 * 8 * 8, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_of_batch():
        ix = torch.randint(0, POOL, (BATCH,))
        return F.cross_entropy(model(X[ix]), Y[ix])
else:
    POOL, BATCH, STEPS, VOCAB = 512, 32, 32, 64
    tokens = torch.randint(0, VOCAB, (POOL, STEPS + 1))
    embed, lstm = nn.Embedding(VOCAB, 64), nn.LSTM(64, 128, 2, batch_first=True)
    head = nn.Linear(128, VOCAB)
    opt = torch.optim.Adam([*embed.parameters(), *lstm.parameters(), *head.parameters()],
                           lr=1e-3)

    def loss_of_batch():
        seq = tokens[torch.randint(0, POOL, (BATCH,))]
        logits = head(lstm(embed(seq[:, :STEPS]))[0])
        return F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))


def step():
    loss = loss_of_batch()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


WARMUP, STEPS_TIMED, BLOCKS = 3, 3, 5   # as bench.cpp's c1() and r1()
for _ in range(WARMUP):
    step()
per_step = []
for _ in range(BLOCKS):
    t0 = time.perf_counter()
    for _ in range(STEPS_TIMED):
        loss = step()
    per_step.append((time.perf_counter() - t0) * 1e3 / STEPS_TIMED)
print("RESULT " + json.dumps({"workload": args.workload, "threads": args.threads,
                              "median_ms": statistics.median(per_step),
                              "min_ms": min(per_step), "final_loss": loss.item()}))
