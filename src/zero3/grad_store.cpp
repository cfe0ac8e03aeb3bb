// GradStore: the rank's gradient partitions in host memory or in the optimizer's swap store.
#include "zero3/grad_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "zinf/aio/pinned.h"
#include "zinf/model/float_buffer.h"
#include "zinf/thread_pool.h"

namespace zinf::zero3 {

namespace {

// acc[i] = op(acc[i], in[i]) over large spans split on the default thread pool (element-wise:
// the same floats whatever the split). The driving thread adds every downloaded gradient of a
// device-resident pass, and while it adds it does not launch the next kernels: hence the split.
template <typename Op>
void for_each_element(float* acc, std::span<const float> in, Op op) {
  constexpr std::size_t kChunk = std::size_t{1} << 18;
  const float* src = in.data();
  if (in.size() < 4 * kChunk || default_thread_pool().threads() == 1) {
    for (std::size_t i = 0; i < in.size(); ++i) acc[i] = op(acc[i], src[i]);
    return;
  }
  const std::size_t n = in.size();
  default_thread_pool().run((n + kChunk - 1) / kChunk, [&](std::size_t c) {
    const std::size_t end = std::min(n, (c + 1) * kChunk);
    for (std::size_t i = c * kChunk; i < end; ++i) acc[i] = op(acc[i], src[i]);
  });
}

// acc[i] = 0 + in[i]: add_into over a zeroed acc in one pass (0 + -0 is +0, as there).
void sum_from_zero(float* acc, std::span<const float> in) {
  for_each_element(acc, in, [](float, float x) { return 0.0f + x; });
}

}  // namespace

void add_into(float* acc, std::span<const float> in) {
  for_each_element(acc, in, [](float a, float x) { return a + x; });
}

namespace {

Status check_partition(const swap::PartitionLayout& layout, std::size_t p, std::size_t n) {
  if (p >= layout.params.size() || n != layout.params[p].numel) {
    return Status::invalid_argument(fmt::format("gradient store: partition {} with {} elements ({} partitions)", p, n,
                                                layout.params.size()));
  }
  return Status::ok();
}

class MemoryGradStore final : public GradStore {
 public:
  explicit MemoryGradStore(const swap::PartitionLayout& layout) : layout_(layout) {}

  Status allocate() {
    for (const swap::SubGroup& sg : layout_.subgroups) {
      acc_.push_back(model::FloatBuffer::allocate(sg.numel));
      if (acc_.back().data() == nullptr && sg.numel > 0) {
        return Status::resource_exhausted(fmt::format("cannot allocate {} fp32 gradient elements", sg.numel));
      }
      // The padding between partitions is never accumulated into: zero once, it stays zero.
      std::memset(acc_.back().data(), 0, acc_.back().size() * sizeof(float));
    }
    return begin_step();
  }

  // No memset of the whole store: a partition's first accumulation of the step writes 0 + g
  // (the bits of adding g to zeros) in one pass, and end_accumulation() zeroes the partitions no
  // micro-batch reached. A step reads and writes each sum once instead of memset + add.
  Status begin_step() override {
    std::fill(touched_.begin(), touched_.end(), false);
    return Status::ok();
  }

  Status accumulate(std::size_t p, std::span<const float> in) override {
    ZINF_RETURN_IF_ERROR(check_partition(layout_, p, in.size()));
    float* acc = acc_[layout_.subgroup_of[p]].data() + layout_.offset_in_subgroup[p];
    if (touched_[p]) {
      add_into(acc, in);
    } else {
      sum_from_zero(acc, in);
      touched_[p] = true;
    }
    return Status::ok();
  }

  Status end_accumulation() override {
    for (std::size_t p = 0; p < layout_.params.size(); ++p) {
      if (touched_[p]) continue;
      std::memset(acc_[layout_.subgroup_of[p]].data() + layout_.offset_in_subgroup[p], 0,
                  layout_.params[p].numel * sizeof(float));
      touched_[p] = true;
    }
    return Status::ok();
  }

  Result<optim::GradStats> stats() override {
    ZINF_RETURN_IF_ERROR(end_accumulation());
    optim::GradStats all;
    for (const model::FloatBuffer& g : acc_) {
      ZINF_ASSIGN_OR_RETURN(optim::GradStats s, optim::grad_stats(view(g)));
      all += s;
    }
    return all;
  }

  std::vector<optim::GradView> step_views() const override {
    std::vector<optim::GradView> out;
    for (const model::FloatBuffer& g : acc_) out.push_back(view(g));
    return out;
  }

  std::uint64_t host_bytes() const override {
    std::uint64_t b = 0;
    for (const model::FloatBuffer& g : acc_) b += g.size() * sizeof(float);
    return b;
  }

 private:
  static optim::GradView view(const model::FloatBuffer& g) {
    return optim::GradView{g.data(), optim::DType::kF32, g.size(), 1.0};
  }

  const swap::PartitionLayout& layout_;
  std::vector<model::FloatBuffer> acc_;  // per sub-group, padded layout
  std::vector<bool> touched_ = std::vector<bool>(layout_.params.size(), false);  // accumulated this step
};

// The norm blocks [first, last) of a sub-group of n elements that lie inside [start, start +
// padded): blocks of grad_stats' length, the last one ending at n.
std::pair<std::uint64_t, std::uint64_t> norm_blocks_inside(std::uint64_t n, std::uint64_t start,
                                                           std::uint64_t padded) {
  constexpr std::uint64_t kBlock = optim::kGradStatsBlock;
  const std::uint64_t end = std::min(n, start + padded);
  const std::uint64_t first = (start + kBlock - 1) / kBlock;
  const std::uint64_t last = end == n ? (n + kBlock - 1) / kBlock : end / kBlock;
  return {first, std::max(first, last)};
}

class SwappedGradStore final : public GradStore {
 public:
  SwappedGradStore(const swap::PartitionLayout& layout, swap::OptimizerSwapper& swapper)
      : layout_(layout), swapper_(swapper), touched_(layout.params.size(), false) {}
  // The buffer may still be the source of a write in flight.
  ~SwappedGradStore() override { (void)swapper_.wait_gradient_write(); }

  Status allocate() {
    // A multiple of the norm's blocks, so stats() reads whole blocks at a time.
    chunk_ = swapped_gradient_buffer_bytes(layout_) / sizeof(float);
    ZINF_ASSIGN_OR_RETURN(buffer_, aio::PinnedBuffer::allocate(chunk_ * sizeof(float), swap::kSwapAlignment));
    for (const swap::SubGroup& sg : layout_.subgroups) {
      const std::uint64_t blocks = (sg.numel + kNormBlock - 1) / kNormBlock;
      block_sums_.emplace_back(blocks, 0.0);
      block_current_.emplace_back(blocks, 0);
    }
    return begin_step();
  }

  Status begin_step() override {
    std::fill(touched_.begin(), touched_.end(), false);
    for (std::vector<char>& c : block_current_) std::fill(c.begin(), c.end(), 0);
    return Status::ok();
  }

  // A micro-batch before the last would have its block sums replaced by the last one's.
  void set_last_micro_batch(bool last) override { last_micro_batch_ = last; }

  Status accumulate(std::size_t p, std::span<const float> in) override {
    ZINF_RETURN_IF_ERROR(check_partition(layout_, p, in.size()));
    const std::size_t sg = layout_.subgroup_of[p];
    const std::uint64_t start = layout_.offset_in_subgroup[p];
    float* acc = buf();
    // The last partition's write reads the buffer until it lands; it ran under the model's work
    // since (the next module's backward). A failed write leaves that partition's sum unknown.
    ZINF_RETURN_IF_ERROR(swapper_.wait_gradient_write());
    // The padding up to kAlign is written too, and must stay zero.
    const std::uint64_t padded = swap::align_up(in.size(), swap::PartitionLayout::kAlign);
    if (touched_[p]) {
      ZINF_RETURN_IF_ERROR(swapper_.read_gradient_range(sg, start, in.size(), acc));
      bytes_ += padded * sizeof(float);
      add_into(acc, in);
    } else {
      sum_from_zero(acc, in);
      std::memset(acc + in.size(), 0, (padded - in.size()) * sizeof(float));
    }
    if (last_micro_batch_) ZINF_RETURN_IF_ERROR(note_block_sums(sg, start, padded, acc));
    // Not waited for here: the next accumulate, stats() or the step waits (the swapper's
    // gradient reads and the step wait for it too).
    ZINF_RETURN_IF_ERROR(swapper_.start_gradient_range_write(sg, start, in.size(), acc));
    bytes_ += padded * sizeof(float);
    touched_[p] = true;
    return Status::ok();
  }

  Result<optim::GradStats> stats() override {
    ZINF_RETURN_IF_ERROR(swapper_.wait_gradient_write());  // before buf() is reused
    // Partitions no micro-batch reached still hold the last step's sums: zero them.
    for (std::size_t p = 0; p < layout_.params.size(); ++p) {
      if (touched_[p] || layout_.params[p].numel == 0) continue;
      std::memset(buf(), 0, swap::align_up(layout_.params[p].numel, swap::PartitionLayout::kAlign) * sizeof(float));
      ZINF_RETURN_IF_ERROR(swapper_.write_gradient_range(layout_.subgroup_of[p], layout_.offset_in_subgroup[p],
                                                         layout_.params[p].numel, buf()));
      bytes_ += swap::align_up(layout_.params[p].numel, swap::PartitionLayout::kAlign) * sizeof(float);
      touched_[p] = true;
    }
    // grad_stats sums fixed blocks and adds the block sums in order: with every block's sum at
    // hand, adding them in that order gives the in-memory store's norm. The blocks no
    // accumulation summed (across two partitions, or in partitions no micro-batch reached) are
    // read back, in runs.
    optim::GradStats all;
    for (std::size_t sg = 0; sg < layout_.subgroups.size(); ++sg) {
      const std::uint64_t n = layout_.subgroups[sg].numel;
      const std::vector<char>& current = block_current_[sg];
      for (std::uint64_t j = 0; j < current.size();) {
        if (current[j]) {
          ++j;
          continue;
        }
        std::uint64_t end = j;
        while (end < current.size() && !current[end] && (end - j + 1) * kNormBlock <= chunk_) ++end;
        const std::uint64_t first = j * kNormBlock, count = std::min(n, end * kNormBlock) - first;
        ZINF_RETURN_IF_ERROR(swapper_.read_gradient_range(sg, first, count, buf()));
        bytes_ += count * sizeof(float);
        ZINF_RETURN_IF_ERROR(optim::grad_block_sums(optim::GradView{buf(), optim::DType::kF32, count, 1.0},
                                                    std::span<double>(block_sums_[sg]).subspan(j, end - j)));
        j = end;
      }
      optim::GradStats one;
      one.elements = n;
      for (double b : block_sums_[sg]) one.sq_norm += b;
      all += one;
    }
    return all;
  }

  std::vector<optim::GradView> step_views() const override { return {}; }
  std::uint64_t host_bytes() const override {
    std::uint64_t b = chunk_ * sizeof(float);
    for (const std::vector<double>& s : block_sums_) b += s.size() * (sizeof(double) + 1);
    return b;
  }
  std::uint64_t bytes_moved() const override { return bytes_; }

 private:
  static constexpr std::uint64_t kNormBlock = optim::kGradStatsBlock;

  float* buf() const { return static_cast<float*>(buffer_.data()); }

  // The block sums of the blocks of sub-group sg that lie inside [start, start + padded), whose
  // sums so far are in acc (acc[0] is element start): those blocks are then current, and the
  // norm need not read them back.
  Status note_block_sums(std::size_t sg, std::uint64_t start, std::uint64_t padded, const float* acc) {
    const std::uint64_t n = layout_.subgroups[sg].numel;
    const auto [first, last] = norm_blocks_inside(n, start, padded);
    if (last <= first) return Status::ok();
    const std::uint64_t count = std::min(n, last * kNormBlock) - first * kNormBlock;
    ZINF_RETURN_IF_ERROR(optim::grad_block_sums(
        optim::GradView{acc + (first * kNormBlock - start), optim::DType::kF32, count, 1.0},
        std::span<double>(block_sums_[sg]).subspan(first, last - first)));
    std::fill(block_current_[sg].begin() + first, block_current_[sg].begin() + last, 1);
    return Status::ok();
  }

  const swap::PartitionLayout& layout_;
  swap::OptimizerSwapper& swapper_;
  std::vector<bool> touched_;  // per partition: accumulated this step
  std::uint64_t chunk_ = 0;    // elements of buffer_
  std::uint64_t bytes_ = 0;    // read and written
  aio::PinnedBuffer buffer_;
  // Per sub-group and kNormBlock block: its sum of squares, and whether that is of this step's
  // gradients as they stand (note_block_sums).
  std::vector<std::vector<double>> block_sums_;
  std::vector<std::vector<char>> block_current_;
  bool last_micro_batch_ = true;
};

}  // namespace

Status GradStore::accumulate_on_device(std::size_t partition, const float*) {
  return Status::internal(
      fmt::format("gradient store: partition {} given in device memory, but this store is in host memory", partition));
}

Result<std::unique_ptr<GradStore>> make_memory_grad_store(const swap::PartitionLayout& layout) {
  auto store = std::make_unique<MemoryGradStore>(layout);
  ZINF_RETURN_IF_ERROR(store->allocate());
  return std::unique_ptr<GradStore>(std::move(store));
}

std::uint64_t swapped_gradient_buffer_bytes(const swap::PartitionLayout& layout) {
  constexpr std::uint64_t kStatsChunk = std::uint64_t{1} << 20;  // stats()' least read, in elements
  std::uint64_t largest = swap::PartitionLayout::kAlign;
  for (const swap::ParamPartition& p : layout.params) largest = std::max(largest, p.numel);
  return sizeof(float) * swap::align_up(std::max(largest, kStatsChunk), optim::kGradStatsBlock);
}

std::uint64_t swapped_norm_read_elements(const swap::PartitionLayout& layout) {
  std::uint64_t total = 0;
  for (std::size_t sg = 0; sg < layout.subgroups.size(); ++sg) {
    const std::uint64_t n = layout.subgroups[sg].numel;
    std::vector<char> inside((n + optim::kGradStatsBlock - 1) / optim::kGradStatsBlock, 0);
    for (std::size_t p = 0; p < layout.params.size(); ++p) {
      if (layout.subgroup_of[p] != sg) continue;
      const auto [first, last] = norm_blocks_inside(
          n, layout.offset_in_subgroup[p], swap::align_up(layout.params[p].numel, swap::PartitionLayout::kAlign));
      std::fill(inside.begin() + first, inside.begin() + last, 1);
    }
    for (std::uint64_t j = 0; j < inside.size(); ++j) {
      if (!inside[j]) total += std::min(n, (j + 1) * optim::kGradStatsBlock) - j * optim::kGradStatsBlock;
    }
  }
  return total;
}

Result<std::unique_ptr<GradStore>> make_swapped_grad_store(const swap::PartitionLayout& layout,
                                                           swap::OptimizerSwapper& swapper) {
  auto store = std::make_unique<SwappedGradStore>(layout, swapper);
  ZINF_RETURN_IF_ERROR(store->allocate());
  return std::unique_ptr<GradStore>(std::move(store));
}

}  // namespace zinf::zero3
