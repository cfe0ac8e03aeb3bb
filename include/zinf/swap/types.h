// Vocabulary shared by the swap layer: tiers, store kinds, element types and I/O alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zinf/optim/dtype.h"
#include "zinf/status.h"

namespace zinf::swap {

// Element types are the optimizer's (fp32, bf16, fp16): the swap layer moves the same tensors.
using DType = optim::DType;
using optim::dtype_name;
using optim::dtype_size;

// Parses "fp32" / "bf16" / "fp16" (as dtype_name writes them).
Result<DType> parse_dtype(std::string_view name);

// Where a tensor's bytes live. Only kCpu and kNvme are implemented; kGpu is the seam for a
// GPU tier (device memory filled through a ChunkSink, see tensor_swapper.h).
enum class Tier { kGpu, kCpu, kNvme };
std::string_view tier_name(Tier tier);  // "gpu", "cpu", "nvme"

// What a swap store holds; each kind has its own folder and files.
enum class StoreKind { kParameters, kOptimizer, kGradients };
std::string_view store_kind_name(StoreKind kind);  // "parameters", "optimizer", "gradients"

// Every file extent, every I/O offset and every staging buffer of the swap layer is aligned to
// this many bytes, so that O_DIRECT requests go straight to the device.
inline constexpr std::size_t kSwapAlignment = 4096;

constexpr std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
constexpr std::uint64_t align_down(std::uint64_t value, std::uint64_t alignment) {
  return value / alignment * alignment;
}

}  // namespace zinf::swap
