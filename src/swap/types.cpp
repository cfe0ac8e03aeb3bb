// Names of the swap layer's enums and dtype parsing.
#include "zinf/swap/types.h"

#include <fmt/format.h>

namespace zinf::swap {

Result<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (name == dtype_name(t)) return t;
  }
  return Status::invalid_argument(fmt::format("unknown dtype '{}' (expected fp32, bf16 or fp16)", name));
}

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kGpu: return "gpu";
    case Tier::kCpu: return "cpu";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

std::string_view store_kind_name(StoreKind kind) {
  switch (kind) {
    case StoreKind::kParameters: return "parameters";
    case StoreKind::kOptimizer: return "optimizer";
    case StoreKind::kGradients: return "gradients";
  }
  return "?";
}

}  // namespace zinf::swap
