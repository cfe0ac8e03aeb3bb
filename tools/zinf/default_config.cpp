// The built-in ds_config for `zinf train` without --config.
#include "default_config.h"

#include <fmt/format.h>

namespace zinf::cli {

std::string default_ds_config(const std::string& nvme_path) {
  return fmt::format(R"({{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "bf16": {{ "enabled": true }},
  "optimizer": {{
    "type": "AdamW",
    "params": {{ "lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01 }}
  }},
  "scheduler": {{
    "type": "WarmupLR",
    "params": {{ "warmup_min_lr": 0, "warmup_max_lr": 2e-3, "warmup_num_steps": 10, "warmup_type": "linear" }}
  }},
  "zero_optimization": {{
    "stage": 3,
    "sub_group_size": 1000000,
    "stage3_prefetch_bucket_size": 200000,
    "stage3_param_persistence_threshold": 10000,
    "stage3_max_live_parameters": 2000000,
    "offload_param": {{ "device": "nvme", "nvme_path": "{0}", "buffer_count": 5, "buffer_size": 1000000, "max_in_cpu": 0 }},
    "offload_optimizer": {{ "device": "nvme", "nvme_path": "{0}", "pipeline_read": true, "pipeline_write": true }}
  }},
  "aio": {{ "block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": false, "overlap_events": true }}
}}
)",
                     nvme_path);
}

}  // namespace zinf::cli
