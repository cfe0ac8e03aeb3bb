// Test helper: an nvme parameter tier over two swap folders with a small stripe unit (so that a
// partition's bytes lie in several pieces of both files), its partitions written with known bytes,
// and a capture of the library's notices. Used by the device reader's tests (tests/zero3 on the
// host device, tests/gpu with the fake libcufile and on a GPU).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "zero3/tiers.h"
#include "zinf/aio/handle.h"
#include "zinf/log.h"
#include "zinf/swap/param_swapper.h"
#include "zinf/swap/partition_layout.h"

namespace zinf::zero3::testing {

// Sizes chosen so that partitions end inside a 4 KiB page, span several stripe units, and one
// holds a single element.
inline const std::vector<swap::ParamPartition> kReaderPartitions = {
    {"h.0.attn", 3000}, {"h.0.ln", 1}, {"h.1.mlp", 45000}, {"h.1.ln", 2048}, {"wte", 7}};

struct NvmeParamFixture {
  ::zinf::testing::TempDir dir{"param_reader_"};
  swap::PartitionLayout layout;
  std::unique_ptr<aio::Handle> handle;
  std::unique_ptr<ParamTier> tier;
  std::vector<std::vector<std::byte>> contents;  // per partition, as written

  // bf16 partitions; the first `max_in_cpu` elements' partitions stay in the CPU tier.
  Status make(std::uint64_t max_in_cpu = 0) {
    layout = swap::PartitionLayout::build(kReaderPartitions, 8192);
    ZINF_ASSIGN_OR_RETURN(handle, aio::Handle::create(aio::AioConfig{}));
    swap::ParamSwapConfig c;
    c.store.nvme_paths = {dir.sub("nvme0"), dir.sub("nvme1")};
    c.store.stripe_unit = 8192;
    c.store.durable = false;
    c.buffer_count = 3;
    c.buffer_size = 16384;  // elements: the largest partition streams in several chunks
    c.max_in_cpu = max_in_cpu;
    c.dtype = swap::DType::kBF16;
    ZINF_ASSIGN_OR_RETURN(tier, make_nvme_param_tier(layout, c, *handle));
    swap::ParamSwapper& swapper = *tier->nvme_swapper();
    for (std::size_t p = 0; p < layout.params.size(); ++p) {
      std::vector<std::byte> bytes(layout.params[p].numel * 2);
      // No period: a piece copied to the wrong place, or a staging buffer overwritten early, shows.
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + p * 0xBF58476D1CE4E5B9ull;
        bytes[i] = static_cast<std::byte>((x ^ (x >> 29)) >> 24);
      }
      ZINF_RETURN_IF_ERROR(swapper.write(layout.params[p].key, bytes.data()).wait());
      contents.push_back(std::move(bytes));
    }
    return swapper.flush();
  }
};

// Captures every message at kNotice and above while alive.
class NoticeCapture {
 public:
  NoticeCapture() {
    set_log_sink([this](LogLevel level, std::string_view message) {
      if (level < LogLevel::kNotice) return;
      std::lock_guard lock(mutex_);
      messages_.emplace_back(message);
    });
  }
  ~NoticeCapture() { set_log_sink(nullptr); }
  NoticeCapture(const NoticeCapture&) = delete;
  NoticeCapture& operator=(const NoticeCapture&) = delete;

  // The messages that contain `text`.
  std::vector<std::string> matching(std::string_view text) const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const std::string& m : messages_) {
      if (m.find(text) != std::string::npos) out.push_back(m);
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace zinf::zero3::testing
