// aio_bench --gpu / --gds: NVMe file <-> GPU memory, as DeepSpeed's ds_io measures it.
#pragma once

#include <string>

#include "sweep.h"
#include "zinf/status.h"

namespace zinf::aio_bench {

struct GpuModeOptions {
  bool bounce = false;  // --gpu: aio into pinned host memory, then H2D (D2H, then aio write)
  bool gds = false;     // --gds: cuFile straight between the file and device memory
  std::string dir;
  std::size_t file_bytes = 0;
  Point point;          // the aio knobs of the bounce path (the first value of each list)
  Timing timing;
  int repeats = 3;
  std::string json_path;  // also write the results here (empty: no file)
};

// Measures each asked mode, read and write, `repeats` times interleaved (bounce and GDS alternate
// which goes first), prints a table and, when both ran, GDS / bounce. Returns the process's exit
// status; errors go to stderr as one line naming why:
//   2  no CUDA device, or a build without the GPU layer ("aio_bench --gpu: ...")
//   3  --gds asked for but GPUDirect Storage is unavailable (the reason is printed); the bounce
//      path was measured in its place, saying so, so a script cannot mistake it for GDS
//   1  any other failure
int run_gpu_modes(const GpuModeOptions& options);

}  // namespace zinf::aio_bench
