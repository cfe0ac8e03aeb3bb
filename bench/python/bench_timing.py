"""Timing shared by the Python benchmarks in this folder (imported from the scripts' own folder)."""

import time


def timed_gbps(op, nbytes, ramp_s, runtime_s):
    """Bytes per second of back-to-back calls of op() (each moving nbytes) over runtime_s after ramp_s."""
    start = time.perf_counter()
    while time.perf_counter() - start < ramp_s:
        op()
    moved, start = 0, time.perf_counter()
    while moved == 0 or time.perf_counter() - start < runtime_s:
        op()
        moved += nbytes
    return moved / (time.perf_counter() - start) / 1e9
