#!/usr/bin/env python3
"""Makes the reference that tests/test_training.cpp (training_gpt_matches_pytorch) checks.

A tiny GPT in PyTorch with the module names of tg::nn (tok, pos, blocks.N.ln1,
blocks.N.attn.qkv, blocks.N.attn.proj, blocks.N.ln2, blocks.N.mlp.0, blocks.N.mlp.2, lnf,
head) is initialised with seed 0 and trained for STEPS steps of AdamW with a warm-up and cosine
learning rate and gradient clipping, on fixed batches. It writes, beside this script:
  gpt_tiny_weights.safetensors  the initial weights (its state_dict)
  gpt_tiny_run.safetensors      "batches" int64 [STEPS, B, CTX + 1], "losses" float64 [STEPS],
                                "norms" float64 [STEPS] (gradient norms before clipping)
With a path argument it instead loads that file (a state_dict saved by tinygrad.hpp) into the
model with strict names and shapes, and prints the loss of the first batch.
Run with PyTorch installed (Debian: apt-get install python3-torch): python3 make_gpt_tiny.py
"""
import json, math, os, struct, sys
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, D, HEADS, LAYERS, B, STEPS = 11, 8, 16, 2, 2, 4, 8
LR, MIN_LR, WARMUP, WD, CLIP = 1e-2, 1e-3, 3, 0.01, 0.5
HERE = os.path.dirname(os.path.abspath(__file__))


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = [p.view(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for p in self.qkv(x).split(c, dim=2)]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // HEADS))
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = att.masked_fill(future, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), CausalSelfAttention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.lnf, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


def lr_at(t):   # t = 1, 2, ...: tg::optim::warmup_cosine(LR, WARMUP, STEPS, MIN_LR)
    if t <= WARMUP:
        return LR * t / WARMUP
    done = min(max((t - WARMUP) / (STEPS - WARMUP), 0.0), 1.0)
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * done)) / 2


CODES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
TYPES = {v: k for k, v in CODES.items()}


def save(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": CODES[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, body, out = json.loads(raw[8:8 + n]), raw[8 + n:], {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        dtype = TYPES[e["dtype"]]
        out[name] = torch.frombuffer(bytearray(body[lo:hi]), dtype=dtype).reshape(e["shape"])
    return out


def main():
    torch.manual_seed(0)
    model = GPT()
    if len(sys.argv) > 1:
        model.load_state_dict(load(sys.argv[1]), strict=True)
        run = load(os.path.join(HERE, "gpt_tiny_run.safetensors"))
        seq = run["batches"][0]
        loss = F.cross_entropy(model(seq[:, :-1]).reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        print(f"loaded {sys.argv[1]}: first loss {loss.item():.7f}")
        return
    save(os.path.join(HERE, "gpt_tiny_weights.safetensors"), model.state_dict())
    gen = torch.Generator().manual_seed(1)
    batches = torch.randint(0, VOCAB, (STEPS, B, CTX + 1), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    losses, norms = [], []
    for t in range(1, STEPS + 1):
        seq = batches[t - 1]
        loss = F.cross_entropy(model(seq[:, :-1]).reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        for group in opt.param_groups:
            group["lr"] = lr_at(t)
        opt.step()
        losses.append(loss.item())
    save(os.path.join(HERE, "gpt_tiny_run.safetensors"),
         {"batches": batches, "losses": torch.tensor(losses, dtype=torch.float64),
          "norms": torch.tensor(norms, dtype=torch.float64)})
    print("losses", " ".join(f"{l:.7f}" for l in losses))


if __name__ == "__main__":
    main()
