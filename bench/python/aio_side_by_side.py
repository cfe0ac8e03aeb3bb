#!/usr/bin/env python3
"""zinf.aio.Handle against DeepNVMe's aio_handle and zinf's C++ aio_bench: same knobs, same file.

A benchmark, not a test: DeepSpeed and torch come from PyPI in the benchmark's own environment
(bench/python/run.sh makes it). Each round measures every contender once, reads then writes
(aio_bench's own order), each measurement a ramp then a timed window of back-to-back whole-file
requests, as aio_bench does. The order of the contenders goes through every permutation over the
rounds, so none always runs right after another's burst of writes or at the same point of a
round. Medians over the rounds, the median of the per-round ratios and their range are printed.
"""

import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile

import torch
import zinf
from bench_timing import timed_gbps


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def aio_bench_point(exe, folder, size, knobs, ramp_s, runtime_s):
    with tempfile.TemporaryDirectory(dir=folder) as out:
        cmd = [exe, "--dir", out, "--size", str(size), "--repeats", "1", "--ramp", str(ramp_s),
               "--runtime", str(runtime_s), "--block-sizes", str(knobs["block_size"]),
               "--queue-depths", str(knobs["queue_depth"]), "--parallelism", str(knobs["intra_op_parallelism"]),
               "--single-submit", "true" if knobs["single_submit"] else "false",
               "--overlap-events", "true" if knobs["overlap_events"] else "false",
               "--out-dir", os.path.join(out, "results"), "--json", os.path.join(out, "s.json")]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = json.load(open(os.path.join(out, "s.json")))["best"]
        return best["read_gbps"], best["write_gbps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="folder for the test files (default: a temporary one)")
    ap.add_argument("--size", default="256M", help="bytes per request and file")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block-size", default="1M")
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--single-submit", action="store_true")
    ap.add_argument("--no-overlap-events", action="store_true")
    ap.add_argument("--ramp", type=float, default=0.1)
    ap.add_argument("--runtime", type=float, default=0.5)
    ap.add_argument("--one-handle", action="store_true",
                    help="zinf reads and writes with one handle (default: aio_bench's three handles, same placement)")
    ap.add_argument("--aio-bench", default=None, help="path of zinf's aio_bench (C++) to run at the same point")
    ap.add_argument("--json", default=None, help="also write every measurement and ratio here")
    args = ap.parse_args()

    size = parse_size(args.size)
    knobs = {"block_size": parse_size(args.block_size), "queue_depth": args.queue_depth,
             "single_submit": args.single_submit, "overlap_events": not args.no_overlap_events,
             "intra_op_parallelism": args.parallelism}
    from deepspeed.ops.op_builder import AsyncIOBuilder

    ds_module = AsyncIOBuilder().load()
    order = ("block_size", "queue_depth", "single_submit", "overlap_events", "intra_op_parallelism")
    # aio_bench makes three handles per point, in this order: one that lays out the read file, one
    # that reads, one that writes. Pinned workers take the cores in turn over all handles of a
    # process, so its reads and writes run on different cores, and on some machines the core a
    # worker sits on moves its rate measurably (docs/python.md). By default the zinf side makes
    # its handles in the same order, so that both run at the same point, placement included;
    # --one-handle reads and writes with one handle instead, as most programs do.
    zinf_knobs = [knobs[k] for k in order]
    layout = None if args.one_handle else zinf.aio.Handle(block_size=1 << 20, queue_depth=16)
    zinf_read = zinf.aio.Handle(*zinf_knobs)
    zinf_write = zinf_read if args.one_handle else zinf.aio.Handle(*zinf_knobs)
    handles = {"zinf": zinf_read, "deepnvme": ds_module.aio_handle(*zinf_knobs)}
    work = tempfile.TemporaryDirectory(dir=args.dir, prefix="zinf-py-aio-")
    folder = work.name
    example = torch.empty(0, dtype=torch.uint8)
    buffers, reads, writes = {}, {}, {}
    src = os.path.join(folder, "read.bin")
    pattern = torch.randint(0, 256, (size,), dtype=torch.uint8)
    for name, h in handles.items():
        buf = h.new_cpu_locked_tensor(size, example)
        buf.copy_(pattern)  # touched: no first-touch faults in the timed part
        buffers[name] = buf
    if zinf_write is not zinf_read:
        zinf_write.register_buffer(buffers["zinf"])
    (layout or zinf_read).sync_pwrite(buffers["zinf"], src, 0, truncate=True, fdatasync=True)
    for name, h in handles.items():
        dst = os.path.join(folder, f"write-{name}.bin")
        buf = buffers[name]
        hw = zinf_write if name == "zinf" else h
        reads[name] = (lambda h=h, buf=buf: h.sync_pread(buf, src, 0))
        writes[name] = (lambda h=hw, buf=buf, dst=dst: h.sync_pwrite(buf, dst, 0))
        # Laid out as aio_bench lays out its write file: allocated in one piece (posix_fallocate),
        # then written once, so the timed writes go over written blocks for both. A first write
        # of a new file by a handle's parallel workers leaves it in out-of-order 8 MiB extents
        # (filefrag: 13-17 for 256 MiB, against 3), which wrote 0.80x as fast on the Zen 3's
        # disk (docs/python.md): a property of the file, not of the handle that writes it.
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        writes[name]()
        buf.zero_()
        reads[name]()
        assert torch.equal(buf, pattern), f"{name}: the bytes read differ from the file"

    contenders = list(handles) + (["aio_bench"] if args.aio_bench else [])
    results = {n: {"read": [], "write": []} for n in contenders}
    orders = list(itertools.permutations(contenders))
    for rnd in range(args.rounds):
        for name in orders[rnd % len(orders)]:
            if name == "aio_bench":
                r, w = aio_bench_point(args.aio_bench, folder, size, knobs, args.ramp, args.runtime)
            else:
                r = timed_gbps(reads[name], size, args.ramp, args.runtime)
                w = timed_gbps(writes[name], size, args.ramp, args.runtime)
            results[name]["read"].append(r)
            results[name]["write"].append(w)

    print(f"zinf.aio.Handle vs DeepNVMe aio_handle (DeepSpeed {__import__('deepspeed').__version__}, "
          f"torch {torch.__version__}); zinf backend {handles['zinf'].backend}")
    print(f"file {size >> 20} MiB in {folder}; knobs {json.dumps(knobs)}; {args.rounds} rounds (order permuted), "
          f"ramp {args.ramp} s + {args.runtime} s per measurement; pinned buffers from each handle's "
          f"new_cpu_locked_tensor; zinf handles: {'one' if args.one_handle else 'made as aio_bench makes them'}")
    print(f"{'':10} {'read GB/s':>10} {'write GB/s':>11}   (median over rounds)")
    for name, r in results.items():
        print(f"{name:10} {statistics.median(r['read']):10.2f} {statistics.median(r['write']):11.2f}")
    summary = {"knobs": knobs, "size": size, "rounds": args.rounds, "results": results}
    for other in [n for n in results if n != "zinf"]:
        for op in ("read", "write"):
            per_round = [a / b for a, b in zip(results["zinf"][op], results[other][op])]
            ratio = statistics.median(per_round)
            summary[f"zinf/{other} {op}"] = ratio
            print(f"zinf / {other} {op}: {ratio:.2f}x (median of per-round ratios; range "
                  f"{min(per_round):.2f}-{max(per_round):.2f})")
    for what, h in (("read", zinf_read), ("write", zinf_write)):
        print(f"zinf {what} handle stats: {h.stats()}")
        if zinf_write is zinf_read:
            break
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    for h in (layout, zinf_read, zinf_write):
        if h is not None:
            h.close()
    work.cleanup()


if __name__ == "__main__":
    main()
