#!/usr/bin/env python3
"""Writes a Hugging Face Llama folder (config.json + model.safetensors, bf16) with fresh weights,
for `zinf train --model-dir` in benchmarks such as bench/capacity.sh: Python's standard library
only (no numpy or torch), so it runs wherever the benchmark does.

Shapes (the vocabulary is the built-in corpus's 256 bytes unless --vocab):
  llama-1b     Llama 3.2 1B: hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192, tied head
  tinyllama    TinyLlama 1.1B: hidden 2048, 22 layers, 32 heads, 4 KV heads, MLP 5632
  llama-7b     Llama 2 7B: hidden 4096, 32 layers, 32 heads, 32 KV heads, MLP 11008
  llama-mini   hidden 256, 4 layers, 4 heads, 2 KV heads, MLP 688 (for tests of the script)
--layers overrides the layer count (a shape between the presets).

Weights: RMSNorm weights 1.0; every matrix N(0, 0.02) as HF's initializer_range, drawn once as a
block of 2^20 values that each tensor repeats from its own offset (a throughput and capacity
benchmark needs the shapes and a trainable start, not independent draws; drawing billions of
normals in pure Python would take an hour).

Usage: make_llama_folder.py DIR SHAPE [--seq 256] [--vocab 256] [--layers N] [--seed 1]
Prints the parameter count.
"""
import argparse
import json
import os
import random
import struct
import sys

SHAPES = {
    "llama-1b": dict(hidden=2048, layers=16, heads=32, kv=8, mlp=8192, tied=True),
    "tinyllama": dict(hidden=2048, layers=22, heads=32, kv=4, mlp=5632, tied=False),
    "llama-7b": dict(hidden=4096, layers=32, heads=32, kv=32, mlp=11008, tied=False),
    "llama-mini": dict(hidden=256, layers=4, heads=4, kv=2, mlp=688, tied=False),
}
BLOCK = 1 << 20  # values drawn once


def bf16_bytes(values):
    """Round-to-nearest-even bf16 of each float, little-endian."""
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out += struct.pack("<H", bits & 0xFFFF)
    return bytes(out)


def tensors(shape, vocab):
    h, kvd = shape["hidden"], shape["hidden"] // shape["heads"] * shape["kv"]
    yield "model.embed_tokens.weight", [vocab, h], "normal"
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", [h], "ones"
        yield p + "self_attn.q_proj.weight", [h, h], "normal"
        yield p + "self_attn.k_proj.weight", [kvd, h], "normal"
        yield p + "self_attn.v_proj.weight", [kvd, h], "normal"
        yield p + "self_attn.o_proj.weight", [h, h], "normal"
        yield p + "post_attention_layernorm.weight", [h], "ones"
        yield p + "mlp.gate_proj.weight", [shape["mlp"], h], "normal"
        yield p + "mlp.up_proj.weight", [shape["mlp"], h], "normal"
        yield p + "mlp.down_proj.weight", [h, shape["mlp"]], "normal"
    yield "model.norm.weight", [h], "ones"
    if not shape["tied"]:
        yield "lm_head.weight", [vocab, h], "normal"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--seq", type=int, default=256, help="max_position_embeddings")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, help="num_hidden_layers (overrides the shape's)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    shape = dict(SHAPES[a.shape])
    if a.layers is not None:
        if a.layers < 1:
            sys.exit(f"make_llama_folder.py: --layers {a.layers} must be at least 1")
        shape["layers"] = a.layers
    os.makedirs(a.dir, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
        "hidden_size": shape["hidden"], "intermediate_size": shape["mlp"],
        "num_hidden_layers": shape["layers"], "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv"], "head_dim": shape["hidden"] // shape["heads"],
        "max_position_embeddings": a.seq, "vocab_size": a.vocab, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": shape["tied"], "attention_bias": False,
        "mlp_bias": False, "hidden_act": "silu", "initializer_range": 0.02,
    }
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    rng = random.Random(a.seed)
    block = bf16_bytes(rng.gauss(0.0, 0.02) for _ in range(BLOCK))
    ones = struct.pack("<H", 0x3F80)  # bf16 1.0
    header, offset, plan = {}, 0, []
    for name, dims, kind in tensors(shape, a.vocab):
        n = 1
        for d in dims:
            n *= d
        header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + 2 * n]}
        plan.append((n, kind))
        offset += 2 * n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    params = 0
    with open(os.path.join(a.dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for i, (n, kind) in enumerate(plan):
            params += n
            if kind == "ones":
                f.write(ones * n)
                continue
            start = (i * 7919 % BLOCK) * 2  # each tensor its own offset into the block
            left = 2 * n
            piece = block[start:] + block[:start]
            while left > 0:
                f.write(piece[:left])
                left -= min(left, len(piece))
    print(f"{a.dir}: {a.shape}, {shape['layers']} layers, {params} parameters")


if __name__ == "__main__":
    main()
