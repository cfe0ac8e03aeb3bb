#!/usr/bin/env python3
"""What bounds zinf.save_file: the disk's rate for a new file against its rate over written blocks.

Interleaved rounds, each: zinf.save_file of a state dict to a removed path; Handle.sync_pwrite of
the same number of bytes from a pinned buffer to a removed path (a new file); the same write again
over the file it just made (written blocks). Prints the medians and the per-round ratios
save_file / new-file write (the staging copy's cost) and new / written (the disk's).
A benchmark, not a test: run with PYTHONPATH=build/python and torch installed.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import zinf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--gb", type=float, default=1.0, help="bytes written per call, in GB (1e9)")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()

    count = 254
    per = int(args.gb * 1e9) // 4 // count
    tensors = {f"t{i:03d}": torch.randn(per) for i in range(count)}
    nbytes = per * 4 * count
    work = tempfile.TemporaryDirectory(dir=args.dir, prefix="zinf-new-file-")
    saved, raw = os.path.join(work.name, "saved.safetensors"), os.path.join(work.name, "raw.bin")
    buf = zinf.aio.pinned(nbytes)
    torch.frombuffer(buf, dtype=torch.uint8).fill_(7)
    # save_file's own knobs (zinf._tensor_file._KNOBS), so that only the staging differs.
    from zinf._tensor_file import _KNOBS
    handle = zinf.aio.Handle(block_size=_KNOBS["block_size"], queue_depth=_KNOBS["queue_depth"],
                             intra_op_parallelism=_KNOBS["intra_op_parallelism"])
    zinf.save_file(tensors, saved)
    handle.sync_pwrite(buf, raw, 0)
    rates = {"save_file, new file": [], "sync_pwrite, new file": [], "sync_pwrite, written blocks": []}

    def timed(what, f):
        t0 = time.perf_counter()
        f()
        rates[what].append(nbytes / (time.perf_counter() - t0) / 1e9)

    for _ in range(args.rounds):
        os.remove(saved)
        timed("save_file, new file", lambda: zinf.save_file(tensors, saved))
        os.remove(raw)
        timed("sync_pwrite, new file", lambda: handle.sync_pwrite(buf, raw, 0))
        timed("sync_pwrite, written blocks", lambda: handle.sync_pwrite(buf, raw, 0))
    print(f"{nbytes / 1e9:.2f} GB per call, {args.rounds} rounds, folder {work.name}")
    for what, r in rates.items():
        print(f"{what:28} {statistics.median(r):5.2f} GB/s (range {min(r):.2f}-{max(r):.2f})")
    for a, b in (("save_file, new file", "sync_pwrite, new file"),
                 ("sync_pwrite, new file", "sync_pwrite, written blocks")):
        per_round = [x / y for x, y in zip(rates[a], rates[b])]
        print(f"{a} / {b}: {statistics.median(per_round):.2f}x (range {min(per_round):.2f}-{max(per_round):.2f})")
    handle.close()
    work.cleanup()


if __name__ == "__main__":
    main()
