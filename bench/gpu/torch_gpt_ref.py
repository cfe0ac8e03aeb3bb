#!/usr/bin/env python3
"""The PyTorch reference for figures (a) and (b) of docs/gpu.md: the same GPT shape as a zinf preset
(pre-LayerNorm, GELU, tied embedding, learned positions), trained with bf16 autocast, PyTorch's
fused scaled_dot_product_attention (causal) and fused AdamW, everything on one GPU. Prints one
line per shape: s/step (median of the timed steps after warm-up), tokens/s and model TFLOPS with
zinf's formula (6*N + 12*L*C*T flops per token), so `zinf train --device cuda` on the same machine
is compared with it in the same call.

    python3 bench/gpu/torch_gpt_ref.py --shape gpt2 --batch 8 --seq 1024
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # name: (layers, hidden, heads, max_seq), as src/model/config.cpp
    "small": (4, 256, 4, 256),
    "gpt2": (12, 768, 12, 1024),
    "1.3b": (24, 2048, 16, 2048),
}


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.out = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, c, h, max_seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(max_seq, c)
        self.blocks = nn.ModuleList(Block(c, h) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="gpt2", choices=sorted(SHAPES))
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0, help="default: the shape's max_seq")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (slower start)")
    a = ap.parse_args()
    layers, c, h, max_seq = SHAPES[a.shape]
    T = a.seq or max_seq
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = Gpt(layers, c, h, max_seq, a.vocab).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if a.compile else model
    idx = torch.randint(0, a.vocab, (a.batch, T), device=dev)
    tgt = torch.randint(0, a.vocab, (a.batch, T), device=dev)
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    tokens = a.batch * T
    flops = (6 * n_params + 12 * layers * c * T) * tokens
    print(f"torch_ref shape={a.shape} params={n_params} B={a.batch} T={T} s/step={s:.4f} "
          f"tokens/s={tokens / s:.0f} TFLOPS={flops / s / 1e12:.1f} peak_mem_GiB="
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} torch={torch.__version__} "
          f"gpu={torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
