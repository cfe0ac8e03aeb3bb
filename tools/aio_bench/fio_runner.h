// Runs fio at the same engine, block size, queue depth, parallelism and file as a zinf point.
#pragma once

#include <string>

#include "sweep.h"
#include "zinf/status.h"

namespace zinf::aio_bench {

// fio's version string ("fio-3.33") when fio is on PATH, or an empty string.
std::string fio_version();

// The fio ioengine that matches a zinf backend: io_uring, libaio, or psync for threads.
const char* fio_engine_for(aio::Backend backend);

// One steady-state fio run (--ramp_time/--runtime as `timing`, O_DIRECT, numjobs = parallelism,
// each job on its own slice of the file) on bench's read file or a fresh write file.
// Returns fio's aggregate bandwidth in GB/s.
Result<double> run_fio(const Point& point, Op op, const Bench& bench, const Timing& timing);

}  // namespace zinf::aio_bench
