// aio_bench --gpu / --gds in a build without the GPU layer: one clear line, exit 2.
#include <cstdio>

#include "gpu_mode.h"

namespace zinf::aio_bench {

int run_gpu_modes(const GpuModeOptions& options) {
  std::fprintf(stderr, "aio_bench %s: this aio_bench was built without the GPU layer (src/gpu; meson -Dcuda=enabled)\n",
               options.gds && !options.bounce ? "--gds" : "--gpu");
  return 2;
}

}  // namespace zinf::aio_bench
