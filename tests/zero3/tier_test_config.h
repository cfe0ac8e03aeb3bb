// A ds_config for the tier tests: the given offload devices, swap folders under `dir`, several
// sub-groups of 5000 elements, small staging buffers and a small aio block.
#pragma once

#include <cstdint>

#include "temp_dir.h"
#include "zinf/config/ds_config.h"

namespace zinf::zero3::testing {

inline config::DsConfig tier_ds_config(config::OffloadDevice param, config::OffloadDevice optimizer,
                                       const zinf::testing::TempDir& dir, std::int64_t param_buffer_size) {
  config::DsConfig ds;
  ds.zero.sub_group_size = 5000;  // several sub-groups, each partition at a kAlign boundary
  ds.zero.offload_param.device = param;
  ds.zero.offload_param.nvme_path = dir.sub("params");
  ds.zero.offload_param.buffer_count = 3;
  ds.zero.offload_param.buffer_size = param_buffer_size;
  ds.zero.offload_param.max_in_cpu = 0;
  ds.zero.offload_optimizer.device = optimizer;
  ds.zero.offload_optimizer.nvme_path = dir.sub("optimizer");
  ds.zero.offload_optimizer.buffer_count = 4;
  ds.zero.offload_optimizer.pipeline_read = ds.zero.offload_optimizer.pipeline_write = true;
  ds.aio.block_size = 65536;
  ds.aio.queue_depth = 4;
  return ds;
}

}  // namespace zinf::zero3::testing
