#!/usr/bin/env python3
"""Reads and writes of two zinf.aio.Handle objects whose single workers sit on different cores.

Pinned workers take the cores in turn over all handles of a process, so the first handle's
worker sits on core 0 and the second's on core 1. This measures, in one process and interleaved
(the order alternating every round), whether that placement alone changes the rate: same knobs,
same file (opened once with O_DIRECT, as aio_bench does), own pinned registered buffers.
Medians and per-round ratios (second handle / first) are printed. Needs only the zinf package.
"""

import argparse
import os
import statistics
import tempfile

import zinf
from bench_timing import timed_gbps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--queue-depth", type=int, default=8)
    args = ap.parse_args()
    size = args.size_mib << 20
    handles = [zinf.aio.Handle(1 << 20, args.queue_depth, False, True, 1) for _ in range(2)]
    buffers = []
    for h in handles:
        buffers.append(zinf.aio.pinned(size))
        h.register_buffer(buffers[-1])
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="zinf-py-placement-") as folder:
        src = os.path.join(folder, "read.bin")
        handles[0].sync_pwrite(buffers[0], src, 0, truncate=True, fdatasync=True)
        read_fd = os.open(src, os.O_RDONLY | os.O_DIRECT)
        write_fds = []
        for i in range(2):
            fd = os.open(os.path.join(folder, f"write{i}.bin"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
            os.posix_fallocate(fd, 0, size)
            write_fds.append(fd)
        res = {(i, op): [] for i in range(2) for op in ("read", "write")}
        for rnd in range(args.rounds):
            for i in ((0, 1) if rnd % 2 == 0 else (1, 0)):
                h, buf = handles[i], buffers[i]
                res[(i, "read")].append(timed_gbps(lambda: h.sync_pread(buf, read_fd, 0), size, 0.1, 0.5))
                res[(i, "write")].append(timed_gbps(lambda: h.sync_pwrite(buf, write_fds[i], 0), size, 0.1, 0.5))
        for fd in [read_fd] + write_fds:
            os.close(fd)
    print(f"two handles, 1 worker each (pinned to cores 0 and 1 in turn), 1 MiB blocks, qd {args.queue_depth}, "
          f"{args.size_mib} MiB whole-file requests, {args.rounds} rounds; backend {handles[0].backend}")
    for op in ("read", "write"):
        per_round = [b / a for a, b in zip(res[(0, op)], res[(1, op)])]
        print(f"{op}: first {statistics.median(res[(0, op)]):.2f} GB/s, second {statistics.median(res[(1, op)]):.2f} "
              f"GB/s; second / first {statistics.median(per_round):.3f}x (range {min(per_round):.2f}-"
              f"{max(per_round):.2f}; second faster in {sum(r > 1 for r in per_round)} of {len(per_round)} rounds)")
    for h in handles:
        h.close()


if __name__ == "__main__":
    main()
