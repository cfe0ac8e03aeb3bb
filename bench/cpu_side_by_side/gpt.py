"""zinf's GPT `small` shape in plain PyTorch, and zinf's default corpus, for the side-by-side peers.

The architecture is zinf's GptModel (docs/model.md): token + position embedding, pre-LayerNorm
blocks (eps 1e-5) with causal multi-head attention and a 4C GELU-tanh MLP, ln_f, and an LM head
tied to the token embedding; mean cross-entropy. Dropout 0. Attention is PyTorch's own
scaled_dot_product_attention (its blocked CPU flash kernel): the peer runs the best PyTorch has.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        qkv = self.c_attn(self.ln_1(x))  # (B, T, 3C)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, NH, T, HS)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    # wte and wpe are the top module's own parameters, so the tied head (logits = x @ wte^T) reads
    # them inside the same forward: ZeRO-3 gathers a module's parameters around its forward.
    def __init__(self, n_layer=6, C=384, n_head=6, seq=256, vocab=256):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(vocab, C))
        self.wpe = nn.Parameter(torch.empty(seq, C))
        self.h = nn.ModuleList(Block(C, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("weight"):
                    nn.init.ones_(p)
                else:
                    nn.init.zeros_(p)
            else:
                proj = name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight")
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layer) if proj else std)

    def forward(self, idx, targets):  # idx, targets: (B, T) int64
        T = idx.shape[1]
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte)  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def num_params(model):
    return sum(p.numel() for p in model.parameters())


def load_corpus(root="/usr/share/common-licenses"):
    """zinf's default corpus: the bytes of the regular files (not links) under root, in path order."""
    paths = []
    for d, _, files in os.walk(root):
        paths += [os.path.join(d, f) for f in files]
    data = b"".join(open(p, "rb").read() for p in sorted(paths)
                    if os.path.isfile(p) and not os.path.islink(p))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


class Batches:
    """Consecutive (B, T) windows through the corpus, wrapping at its end (as zinf's loader)."""

    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T, self.pos = tokens, B, T, 0

    def next(self):
        n = self.B * self.T
        if self.pos + n + 1 > self.tokens.numel():
            self.pos = 0
        chunk = self.tokens[self.pos:self.pos + n + 1]
        self.pos += n
        return chunk[:-1].view(self.B, self.T), chunk[1:].view(self.B, self.T)
