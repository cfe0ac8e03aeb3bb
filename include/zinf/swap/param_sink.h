// ParamSink: where an optimizer step puts the updated parameter copies the model computes with.
//
// The optimizer (a memory optimizer tier or the OptimizerSwapper) updates fp32 master weights
// sub-group by sub-group, in the PartitionLayout's padded layout. The parameter tier keeps a
// copy of them in the compute dtype; its sink says which dtype and where, so the optimizer
// has one path whatever holds the parameters:
//   - host_subgroup(sg) != nullptr: sub-group sg's copy is host memory the optimizer writes
//     itself (16-bit: the kernel writes it as it steps; fp32: copied after the kernel, and
//     nothing at all when that memory *is* the master weights, the same address);
//   - nullptr: the optimizer hands ranges over with write(), from its own buffers, and keeps
//     them unchanged until the returned tickets are ready.
// A new home for the parameters (device memory, say) is one new ParamSink: the optimizer code
// does not change. A sink whose transfers complete elsewhere (a copy stream) hands out tickets
// of a SwapCompletion (tensor_swapper.h) and completes them when the data has landed.
//
// Threading: one step at a time calls a sink; the tickets may complete on other threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zinf/status.h"
#include "zinf/swap/optimizer_swapper.h"
#include "zinf/swap/tensor_swapper.h"
#include "zinf/swap/types.h"

namespace zinf::swap {

class ParamSwapper;

class ParamSink {
 public:
  virtual ~ParamSink() = default;
  // The copies' dtype: kBF16 or kF16 (the optimizer kernel writes them), or kF32 (the updated
  // master weights themselves).
  virtual DType dtype() const = 0;
  // Sub-group sg's copy in host memory (subgroups[sg].numel elements of dtype(), padded
  // layout), or nullptr when the sink takes it through write(). The same for every sg.
  virtual void* host_subgroup(std::size_t sg) = 0;
  // Takes elements [first, first + count) of sub-group sg's copy from src (count elements of
  // dtype(), padded layout) and appends what completes the transfer to `pending`. first and
  // first + count are multiples of PartitionLayout::kAlign (so src is readable up to each
  // partition's aligned end); src must stay valid and unchanged until every ticket is ready.
  virtual Status write(std::size_t sg, std::uint64_t first, std::uint64_t count, const void* src,
                       std::vector<SwapTicket>& pending) = 0;
  // Sub-group sg's copy in the memory of the device an optimizer tier steps on (a device-resident
  // parameter tier), which that tier's kernels write; nullptr for every other sink.
  virtual void* device_subgroup(std::size_t /*sg*/) { return nullptr; }

 protected:
  ParamSink() = default;
  ParamSink(const ParamSink&) = default;
  ParamSink& operator=(const ParamSink&) = default;
};

// Copies in host memory the caller owns: one pointer per sub-group (padded layout, dtype).
class HostParamSink final : public ParamSink {
 public:
  HostParamSink(std::vector<void*> subgroups, DType dtype) : subgroups_(std::move(subgroups)), dtype_(dtype) {}
  DType dtype() const override { return dtype_; }
  void* host_subgroup(std::size_t sg) override { return sg < subgroups_.size() ? subgroups_[sg] : nullptr; }
  Status write(std::size_t sg, std::uint64_t first, std::uint64_t count, const void* src,
               std::vector<SwapTicket>& pending) override;

 private:
  std::vector<void*> subgroups_;
  DType dtype_;
};

// Copies in a ParamSwapper, one tensor per partition (named by layout.params[p].key, of the
// swapper's dtype). Both must outlive the sink.
class SwapperParamSink final : public ParamSink {
 public:
  // Fails naming the partition when one is not in the swapper with its size.
  static Result<SwapperParamSink> create(const PartitionLayout& layout, ParamSwapper& swapper);
  DType dtype() const override;
  void* host_subgroup(std::size_t) override { return nullptr; }
  Status write(std::size_t sg, std::uint64_t first, std::uint64_t count, const void* src,
               std::vector<SwapTicket>& pending) override;

 private:
  SwapperParamSink(const PartitionLayout& layout, ParamSwapper& swapper) : layout_(&layout), swapper_(&swapper) {}
  const PartitionLayout* layout_;
  ParamSwapper* swapper_;
};

}  // namespace zinf::swap
