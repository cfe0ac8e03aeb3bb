"""The machine's matmul roof, measured: GFLOP/s of large square matrix products.

  python roof.py [--n 2048] [--reps 8] [--openblas /path/libopenblas.so]
Prints one JSON line: {"torch_fp32", "torch_bf16", "openblas_sgemm"} in GFLOP/s, each the median
of --reps timed products after one untimed (openblas_sgemm: the library zinf links, through
ctypes, and the kernel set it picked; null when it cannot be loaded).

Each torch precision is first probed at n 512: where that runs below SLOW_GFLOPS (torch's bf16 on a
CPU without bf16 units, AVX2 only: under 1 GFLOP/s on a Zen 3, so a 2048^3 product takes ~25 s),
the probe's figure is the one printed, with "<name>_n": 512, instead of minutes of large products.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import time

import torch


SLOW_GFLOPS = 5.0
PROBE_N = 512


def timed(fn, flops, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times) / 1e9


def openblas_sgemm(path, n, reps):
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    a, b, c = (torch.randn(n, n) for _ in range(3))
    lib.openblas_get_corename.restype = ctypes.c_char_p
    core = lib.openblas_get_corename().decode()
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    f = ctypes.c_float
    # cblas_sgemm(RowMajor=101, NoTrans=111, NoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
    call = lambda: lib.cblas_sgemm(101, 111, 111, n, n, n, f(1.0), ptr(a), n, ptr(b), n, f(0.0), ptr(c), n)  # noqa: E731
    return timed(call, 2.0 * n ** 3, reps), core


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--openblas", default="libopenblas.so.0")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    # OpenBLAS first: torch's OpenMP threads keep spinning after its products and would take the
    # cores from OpenBLAS's own threads.
    sgemm = openblas_sgemm(a.openblas, a.n, a.reps) or (None, None)
    out = {"openblas_sgemm": sgemm[0], "openblas_core": sgemm[1]}
    for name, dtype in (("torch_fp32", torch.float32), ("torch_bf16", torch.bfloat16)):
        n = min(PROBE_N, a.n)
        x, y = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        probe = timed(lambda: torch.mm(x, y), 2.0 * n ** 3, 3)
        if probe < SLOW_GFLOPS or n == a.n:
            out[name] = probe
            out[name + "_n"] = n
            continue
        x, y = torch.randn(a.n, a.n, dtype=dtype), torch.randn(a.n, a.n, dtype=dtype)
        out[name] = timed(lambda: torch.mm(x, y), 2.0 * a.n ** 3, a.reps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
