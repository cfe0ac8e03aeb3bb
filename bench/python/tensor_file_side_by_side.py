#!/usr/bin/env python3
"""zinf.save_file / zinf.load_file against safetensors and torch.save for a ~1 GB state dict.

A benchmark, not a test (safetensors and torch from PyPI, bench/python/run.sh). Interleaved
rounds, the order of the tools alternating; medians and median per-round ratios. Before every
load the file's pages are dropped from the page cache (fsync, posix_fadvise DONTNEED), so each
loader reads from the disk; loading into existing tensors is timed too. Saves are timed twice: as the call returns (safetensors and
torch.save then leave the data in the page cache, zinf has written it with O_DIRECT) and until
the data is durable (the call plus os.fsync of the file).

What a load returns differs: zinf.load_file and safetensors' backend="pread" return tensors in
private memory, while safetensors' default backend="mmap" reads the file into the page cache and
returns tensors mapped from it copy-on-write, so the first write to each page later allocates
and copies it. Loads are therefore also timed until every page of every tensor has been written
once ("load + write"), and safetensors with backend="pread" is measured too. Filling fresh
memory is timed in every round as well: on virtual machines whose host takes freed memory back,
it bounds any loader that returns new private memory.
"""

import argparse
import hashlib
import os
import statistics
import tempfile
import time

import safetensors
import safetensors.torch as st
import torch
import zinf


def state_dict(total_bytes):
    """A GPT-like state dict: per layer two (h, 4h) and two (h, h) fp32 matrices, biases and norms."""
    g = torch.Generator().manual_seed(0)
    h = 1024
    per_layer = (2 * 4 * h * h + 2 * h * h + 8 * h) * 4
    tensors = {"wte": torch.randn(8192, h, generator=g)}
    for i in range(max(1, (total_bytes - 8192 * h * 4) // per_layer)):
        p = f"h.{i}."
        tensors[p + "mlp.fc.weight"] = torch.randn(4 * h, h, generator=g)
        tensors[p + "mlp.proj.weight"] = torch.randn(h, 4 * h, generator=g)
        tensors[p + "attn.qk.weight"] = torch.randn(h, h, generator=g)
        tensors[p + "attn.proj.weight"] = torch.randn(h, h, generator=g)
        for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn.bias", "mlp.bias"):
            tensors[p + name] = torch.randn(h, generator=g)
        tensors[p + "mlp.fc.bias"] = torch.randn(2 * h, generator=g)
    return tensors


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def sync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_every_page(tensors):
    """Writes one byte (its own value) in every 4 KiB page of every tensor."""
    for t in tensors.values():
        flat = t.view(-1).view(torch.uint8)
        flat[::4096] += 0


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--gb", type=float, default=1.0, help="state dict size in GB (1e9 bytes)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    tensors = state_dict(int(args.gb * 1e9))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    work = tempfile.TemporaryDirectory(dir=args.dir, prefix="zinf-py-tf-")
    path = {k: os.path.join(work.name, f"{k}.bin") for k in ("zinf", "safetensors", "torch")}
    savers = {
        "zinf": lambda: zinf.save_file(tensors, path["zinf"]),
        "safetensors": lambda: st.save_file(tensors, path["safetensors"]),
        "torch.save": lambda: torch.save(tensors, path["torch"]),
    }
    save_paths = {"zinf": path["zinf"], "safetensors": path["safetensors"], "torch.save": path["torch"]}
    loaders = {
        "zinf": lambda p: zinf.load_file(p, framework="pt"),
        "safetensors": lambda p: st.load_file(p),
        "st pread": lambda p: st.load_file(p, backend="pread"),
    }
    # Restoring into tensors that exist (a model's state dict): zinf fills them in place,
    # safetensors loads then copies (what load_state_dict does with its result).
    warm = {k: torch.empty_like(v) for k, v in tensors.items()}

    def st_into(p):
        for k, v in st.load_file(p).items():
            warm[k].copy_(v)

    into = {"zinf": lambda p: zinf.load_file(p, out=warm), "safetensors": st_into}

    # Correctness first: same bytes, and each reads the other's file to equal tensors.
    for f in savers.values():
        f()
    same_bytes = digest(path["zinf"]) == digest(path["safetensors"])
    for reader, writer in (("zinf", "safetensors"), ("safetensors", "zinf")):
        back = loaders[reader](path[writer])
        assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors), \
            f"{reader} reading {writer}'s file: tensors differ"
        del back

    save_call = {k: [] for k in savers}
    save_durable = {k: [] for k in savers}
    load = {k: [] for k in loaders}
    load_write = {k: [] for k in loaders}
    load_into = {k: [] for k in into}
    fresh_fill = []
    for rnd in range(args.rounds):
        names = list(savers) if rnd % 2 == 0 else list(reversed(savers))
        for name in names:
            os.remove(save_paths[name])
            t0 = time.perf_counter()
            savers[name]()
            t1 = time.perf_counter()
            sync_file(save_paths[name])
            t2 = time.perf_counter()
            save_call[name].append(nbytes / (t1 - t0) / 1e9)
            save_durable[name].append(nbytes / (t2 - t0) / 1e9)
        names = list(loaders)[rnd % len(loaders):] + list(loaders)[:rnd % len(loaders)]
        names = names if rnd % 2 == 0 else list(reversed(names))
        for name in names:
            drop_cache(path["safetensors"])
            t0 = time.perf_counter()
            out = loaders[name](path["safetensors"])
            load[name].append(nbytes / (time.perf_counter() - t0) / 1e9)
            del out
        for name in names:
            drop_cache(path["safetensors"])
            t0 = time.perf_counter()
            out = loaders[name](path["safetensors"])
            write_every_page(out)
            load_write[name].append(nbytes / (time.perf_counter() - t0) / 1e9)
            del out
        t0 = time.perf_counter()
        fresh = torch.empty(nbytes, dtype=torch.uint8)
        write_every_page({"fresh": fresh})
        fresh_fill.append(nbytes / (time.perf_counter() - t0) / 1e9)
        del fresh
        for name in [n for n in names if n in into]:
            drop_cache(path["safetensors"])
            t0 = time.perf_counter()
            into[name](path["safetensors"])
            load_into[name].append(nbytes / (time.perf_counter() - t0) / 1e9)

    print(f"state dict: {len(tensors)} fp32 tensors, {nbytes / 1e9:.2f} GB; torch {torch.__version__}, "
          f"safetensors {safetensors.__version__}; {args.rounds} rounds, interleaved; folder {work.name}")
    print(f"zinf's file and safetensors' file byte-identical: {same_bytes}; each loads the other's to equal tensors")
    print(f"{'':12} {'save GB/s (call)':>17} {'save GB/s (durable)':>20} {'load GB/s (cold)':>17} {'load + write GB/s':>18}")
    for name in list(savers) + [n for n in loaders if n not in savers]:
        sc = f"{statistics.median(save_call[name]):17.2f}" if name in savers else f"{'-':>17}"
        sd = f"{statistics.median(save_durable[name]):20.2f}" if name in savers else f"{'-':>20}"
        ld = f"{statistics.median(load[name]):17.2f}" if name in load else f"{'-':>17}"
        lw = f"{statistics.median(load_write[name]):18.2f}" if name in load_write else f"{'-':>18}"
        print(f"{name:12} {sc} {sd} {ld} {lw}")
    print(f"filling fresh memory (torch.empty, a write per page), same rounds: {statistics.median(fresh_fill):.2f} GB/s "
          f"(range {min(fresh_fill):.2f}-{max(fresh_fill):.2f})")

    def ratio(table, a, b):
        return statistics.median(x / y for x, y in zip(table[a], table[b]))

    for other in ("safetensors", "torch.save"):
        print(f"zinf.save_file / {other}: {ratio(save_call, 'zinf', other):.2f}x as called, "
              f"{ratio(save_durable, 'zinf', other):.2f}x durable")
    def spread(table, a, b):
        r = [x / y for x, y in zip(table[a], table[b])]
        return f"range {min(r):.2f}-{max(r):.2f}"

    for other, what in (("safetensors", "safetensors.load_file"), ("st pread", 'safetensors.load_file(backend="pread")')):
        print(f"zinf.load_file / {what}: {ratio(load, 'zinf', other):.2f}x as called ({spread(load, 'zinf', other)}), "
              f"{ratio(load_write, 'zinf', other):.2f}x load + write ({spread(load_write, 'zinf', other)}) (cold file)")
    print(f"into existing tensors (cold file): zinf.load_file(out=) {statistics.median(load_into['zinf']):.2f} GB/s, "
          f"safetensors.load_file + copy_ {statistics.median(load_into['safetensors']):.2f} GB/s: "
          f"{ratio(load_into, 'zinf', 'safetensors'):.2f}x")
    work.cleanup()


if __name__ == "__main__":
    main()
