// Start-up settings of the libraries zinf computes with that only the environment can make.
#pragma once

namespace zinf::cli {

// Called first thing in main(). Where the user has not chosen them, sets
//  - OMP_WAIT_POLICY=passive when an OpenMP runtime (oneDNN's libgomp) is in the process: its
//    threads otherwise spin after every bf16 product and take the cores from zinf's own pool;
//  - OPENBLAS_CORETYPE=SkylakeX or Haswell when OpenBLAS took this CPU for an older, generic core
//    (OpenBLAS 0.3.21 does not know Xeons after Sapphire Rapids and falls back to Prescott's SSE3
//    kernels) while the CPU has AVX-512 or AVX2 with FMA;
//  - OPENBLAS_THREAD_TIMEOUT=4 when OpenBLAS is in the process: its threads otherwise yield-spin
//    for ~0.1 s after every threaded product.
// The libraries read these variables once, when they load, before main(); so when anything
// changes, the process runs itself again (execv of /proc/self/exe: same pid, same arguments) and
// the new process logs one notice naming what was set. Returns when nothing needed setting, in
// the re-run process, or when execv failed (the defaults then stay).
void tune_runtime_environment(char** argv);

}  // namespace zinf::cli
