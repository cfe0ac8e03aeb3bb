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
      zero_fill(acc_.back().data(), acc_.back().size() * sizeof(float));
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

std::uint64_t largest_partition(const swap::PartitionLayout& layout) {
  std::uint64_t largest = swap::PartitionLayout::kAlign;
  for (const swap::ParamPartition& p : layout.params) largest = std::max(largest, p.numel);
  return largest;
}

// The first buffer's elements: stats() reads through it too.
std::uint64_t first_buffer_elements(const swap::PartitionLayout& layout) {
  constexpr std::uint64_t kStatsChunk = std::uint64_t{1} << 20;  // stats()' least read, in elements
  return swap::align_up(std::max(largest_partition(layout), kStatsChunk), optim::kGradStatsBlock);
}

// The second's: a padded partition.
std::uint64_t second_buffer_elements(const swap::PartitionLayout& layout) {
  return swap::align_up(largest_partition(layout), swap::PartitionLayout::kAlign);
}

constexpr std::uint64_t kNotHeld = UINT64_MAX;

// The partitions whose sums the swapped store keeps in host memory through the micro-batches:
// per partition its offset in the held array (padded, kAlign apart), or kNotHeld; *total gets the
// array's elements. The store writes one partition at a time, so the accumulation that follows a
// large partition's waits for its write; a layer norm's gradient comes right after the large
// block before it, with only the norm's short backward to cover that write. Partitions of at most
// a sixteenth of the largest (padded) are held, smallest first, while they total at most half of
// it: a layer norm's sums stay in memory and reach the store once a step.
std::vector<std::uint64_t> held_offsets(const swap::PartitionLayout& layout, std::uint64_t* total) {
  constexpr std::uint64_t kSmall = 16;
  const std::uint64_t largest = second_buffer_elements(layout);
  std::vector<std::size_t> order(layout.params.size());
  for (std::size_t p = 0; p < order.size(); ++p) order[p] = p;
  auto padded = [&](std::size_t p) { return swap::align_up(layout.params[p].numel, swap::PartitionLayout::kAlign); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return padded(a) < padded(b); });
  std::vector<std::uint64_t> offsets(layout.params.size(), kNotHeld);
  *total = 0;
  for (std::size_t p : order) {
    const std::uint64_t n = padded(p);
    if (n == 0) continue;
    if (n * kSmall > largest || 2 * (*total + n) > largest) break;
    offsets[p] = *total;
    *total += n;
  }
  return offsets;
}

class SwappedGradStore final : public GradStore {
 public:
  SwappedGradStore(const swap::PartitionLayout& layout, swap::OptimizerSwapper& swapper)
      : layout_(layout),
        swapper_(swapper),
        touched_(layout.params.size(), false),
        next_(layout.params.size(), kNone),
        micro_of_(layout.params.size(), 0),
        held_of_(held_offsets(layout, &held_elements_)) {}
  // The buffers may still be the source of a write or the target of a read in flight.
  ~SwappedGradStore() override {
    (void)swapper_.wait_gradient_read();
    (void)swapper_.wait_gradient_write();
  }

  Status allocate() {
    // The first a multiple of the norm's blocks, so stats() reads whole blocks at a time.
    chunk_ = first_buffer_elements(layout_);
    const std::uint64_t elements[kBuffers] = {chunk_, second_buffer_elements(layout_)};
    for (int i = 0; i < kBuffers; ++i) {
      ZINF_ASSIGN_OR_RETURN(buffers_[i], aio::PinnedBuffer::allocate(elements[i] * sizeof(float), swap::kSwapAlignment));
    }
    held_ = model::FloatBuffer::allocate(held_elements_);
    if (held_.data() == nullptr && held_elements_ > 0) {
      return Status::resource_exhausted(fmt::format("cannot allocate {} fp32 gradient elements", held_elements_));
    }
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
    ended_ = false;
    last_ = kNone;
    // A read ahead left by a step that failed before stats(): nothing reads it.
    ahead_ = kNone;
    (void)swapper_.wait_gradient_read();
    return Status::ok();
  }

  // A micro-batch before the last would have its block sums replaced by the last one's.
  void set_last_micro_batch(bool last) override {
    last_micro_batch_ = last;
    ++micro_;
  }

  Status accumulate(std::size_t p, std::span<const float> in) override {
    ZINF_RETURN_IF_ERROR(check_partition(layout_, p, in.size()));
    const std::size_t sg = layout_.subgroup_of[p];
    const std::uint64_t start = layout_.offset_in_subgroup[p];
    // The padding up to kAlign is written too, and must stay zero.
    const std::uint64_t padded = swap::align_up(in.size(), swap::PartitionLayout::kAlign);
    const bool held = held_of_[p] != kNotHeld;
    float* acc = nullptr;
    if (held) {
      // In memory until end_accumulation(): no transfer, and the read ahead goes on.
      acc = held_.data() + held_of_[p];
    } else {
      // The sum so far: read ahead into the free buffer when p was predicted, else read now. The
      // other buffer is the source of the last partition's write, still in flight; it ran under
      // the model's work since (the next module's backward). A failed transfer leaves that
      // partition's sum unknown.
      const bool predicted = ahead_ == p;
      ahead_ = kNone;
      ZINF_RETURN_IF_ERROR(swapper_.wait_gradient_read());  // a wrong prediction's read is dropped
      acc = buf(free_);
      if (touched_[p]) {
        if (!predicted) ZINF_RETURN_IF_ERROR(swapper_.read_gradient_range(sg, start, in.size(), acc));
        bytes_ += padded * sizeof(float);
      }
    }
    if (touched_[p]) {
      add_into(acc, in);
    } else {
      sum_from_zero(acc, in);
      std::memset(acc + in.size(), 0, (padded - in.size()) * sizeof(float));
    }
    if (last_micro_batch_) ZINF_RETURN_IF_ERROR(note_block_sums(sg, start, padded, acc));
    if (held) {
      touched_[p] = true;
      return Status::ok();
    }
    // Not waited for here: the next accumulate, stats() or the step waits (the swapper's
    // gradient reads and the step wait for it too). It waits for the last partition's write.
    ZINF_RETURN_IF_ERROR(swapper_.start_gradient_range_write(sg, start, in.size(), acc));
    bytes_ += padded * sizeof(float);
    touched_[p] = true;
    micro_of_[p] = micro_;
    free_ ^= 1;  // the buffer the last write came from: its write is done
    // The next partition in the order of the accumulations so far (backward's, the same every
    // micro-batch), whose sum the next micro-batch's accumulation reads: read it into the free
    // buffer while the caller goes on. Not after the step's last accumulations (nothing reads
    // them again this step).
    if (last_ != kNone) next_[last_] = p;
    last_ = p;
    const std::size_t q = next_[p];
    if (q != kNone && q != p && touched_[q] && (micro_of_[q] != micro_ || !last_micro_batch_)) {
      ZINF_RETURN_IF_ERROR(swapper_.start_gradient_range_read(layout_.subgroup_of[q], layout_.offset_in_subgroup[q],
                                                              layout_.params[q].numel, buf(free_)));
      ahead_ = q;
    }
    return Status::ok();
  }

  // The store then holds the step's sums: the last write landed, the held sums written, and
  // the partitions no micro-batch reached (which still hold the last step's sums) zeroed.
  Status end_accumulation() override {
    if (ended_) return Status::ok();
    ahead_ = kNone;
    ZINF_RETURN_IF_ERROR(swapper_.wait_gradient_read());
    ZINF_RETURN_IF_ERROR(swapper_.wait_gradient_write());  // before buf() is reused
    for (std::size_t p = 0; p < layout_.params.size(); ++p) {
      const bool held = held_of_[p] != kNotHeld;
      if ((touched_[p] && !held) || layout_.params[p].numel == 0) continue;
      const std::uint64_t padded = swap::align_up(layout_.params[p].numel, swap::PartitionLayout::kAlign);
      if (!touched_[p]) {
        std::memset(buf(0), 0, padded * sizeof(float));
      } else {
        std::memcpy(buf(0), held_.data() + held_of_[p], padded * sizeof(float));
      }
      ZINF_RETURN_IF_ERROR(swapper_.write_gradient_range(layout_.subgroup_of[p], layout_.offset_in_subgroup[p],
                                                         layout_.params[p].numel, buf(0)));
      bytes_ += padded * sizeof(float);
      touched_[p] = true;
    }
    ended_ = true;
    return Status::ok();
  }

  Result<optim::GradStats> stats() override {
    ZINF_RETURN_IF_ERROR(end_accumulation());
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
        ZINF_RETURN_IF_ERROR(swapper_.read_gradient_range(sg, first, count, buf(0)));
        bytes_ += count * sizeof(float);
        ZINF_RETURN_IF_ERROR(optim::grad_block_sums(optim::GradView{buf(0), optim::DType::kF32, count, 1.0},
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
    std::uint64_t b = swapped_gradient_buffer_bytes(layout_) + held_elements_ * sizeof(float);
    for (const std::vector<double>& s : block_sums_) b += s.size() * (sizeof(double) + 1);
    return b;
  }
  std::uint64_t bytes_moved() const override { return bytes_; }

 private:
  static constexpr std::uint64_t kNormBlock = optim::kGradStatsBlock;

  float* buf(int i) const { return static_cast<float*>(buffers_[i].data()); }

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
  std::uint64_t chunk_ = 0;    // elements of the first buffer (stats()' reads)
  std::uint64_t bytes_ = 0;    // read and written
  // Two buffers: the last partition's write comes from one while the next sum is read (ahead)
  // into the other, `free_`.
  static constexpr int kBuffers = 2;
  aio::PinnedBuffer buffers_[kBuffers];
  int free_ = 0;
  static constexpr std::size_t kNone = SIZE_MAX;
  std::vector<std::size_t> next_;   // per partition: the one accumulated after it last time
  std::vector<std::uint64_t> micro_of_;  // per partition: the micro-batch it was last accumulated in
  std::uint64_t micro_ = 0;         // set_last_micro_batch calls so far
  std::size_t last_ = kNone;        // the partition accumulated last this step
  std::size_t ahead_ = kNone;       // the partition whose sum is being read ahead
  // Per sub-group and kNormBlock block: its sum of squares, and whether that is of this step's
  // gradients as they stand (note_block_sums).
  std::vector<std::vector<double>> block_sums_;
  std::vector<std::vector<char>> block_current_;
  bool last_micro_batch_ = true;
  // The small partitions' sums (held_offsets): per partition its offset in held_, or kNotHeld.
  std::uint64_t held_elements_ = 0;
  std::vector<std::uint64_t> held_of_;
  model::FloatBuffer held_;
  bool ended_ = false;  // end_accumulation() ran this step
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
  return sizeof(float) * (first_buffer_elements(layout) + second_buffer_elements(layout));
}

std::uint64_t swapped_gradient_held_bytes(const swap::PartitionLayout& layout) {
  std::uint64_t total = 0;
  (void)held_offsets(layout, &total);
  return sizeof(float) * total;
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
