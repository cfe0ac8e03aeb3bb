// BatchLoader: deterministic, rank-sharded (inputs, targets) rows from a TokenDataset.
#include <fmt/format.h>

#include "model/rng.h"
#include "zinf/model/data.h"

namespace zinf::model {

Result<BatchLoader> BatchLoader::create(TokenDataset data, const BatchLoaderOptions& o) {
  if (o.B < 1) return Status::invalid_argument(fmt::format("batch size B ({}) must be >= 1", o.B));
  if (o.T < 1) {
    return Status::invalid_argument(fmt::format("sequence length T ({}) must be >= 1", o.T));
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Status::invalid_argument(
        fmt::format("rank ({}) must be in [0, world_size ({}))", o.rank, o.world_size));
  }
  if (data.size() < static_cast<size_t>(o.T) + 1) {
    return Status::invalid_argument(
        fmt::format("dataset ({}) has {} tokens; sequence length T = {} needs at least {}",
                    data.source(), data.size(), o.T, static_cast<size_t>(o.T) + 1));
  }
  const uint64_t rows = (data.size() - 1) / static_cast<uint64_t>(o.T);
  if (o.shuffle && rows > UINT32_MAX) {
    return Status::invalid_argument(
        fmt::format("dataset ({}) has {} rows of T = {}; shuffling supports at most 2^32 rows",
                    data.source(), rows, o.T));
  }
  return BatchLoader(std::move(data), o);
}

BatchLoader::BatchLoader(TokenDataset data, const BatchLoaderOptions& options)
    : data_(std::move(data)), opt_(options) {
  rows_ = (data_.size() - 1) / static_cast<uint64_t>(opt_.T);
}

Status BatchLoader::restore(BatchPosition position) {
  if (position.row >= rows_) {
    return Status::invalid_argument(
        fmt::format("batch position row {} is past the {} rows of an epoch (dataset {}, T = {})",
                    position.row, rows_, data_.source(), opt_.T));
  }
  pos_ = position;
  return Status::ok();
}

uint64_t BatchLoader::row_start(uint64_t epoch, uint64_t row) {
  if (!opt_.shuffle) return row * opt_.T;
  if (order_epoch_ != epoch) {
    // Fisher-Yates driven by hashes of (seed, epoch, i): the same order on every rank and machine.
    order_.resize(rows_);
    for (uint64_t i = 0; i < rows_; i++) order_[i] = static_cast<uint32_t>(i);
    for (uint64_t i = rows_ - 1; i > 0; i--) {
      const uint64_t j = detail::below(detail::hash3(opt_.seed, epoch, i), i + 1);
      std::swap(order_[i], order_[j]);
    }
    order_epoch_ = epoch;
  }
  return static_cast<uint64_t>(order_[row]) * opt_.T;
}

Status BatchLoader::next(std::span<int32_t> inputs, std::span<int32_t> targets) {
  const size_t B = opt_.B;
  const size_t T = opt_.T;
  if (inputs.size() != B * T || targets.size() != B * T) {
    return Status::invalid_argument(fmt::format(
        "BatchLoader::next: inputs ({}) and targets ({}) must each hold B*T = {} tokens",
        inputs.size(), targets.size(), B * T));
  }
  std::span<const uint32_t> tokens = data_.tokens();
  for (size_t j = 0; j < B; j++) {
    // Global row rank*B + j of this batch, counted from the current position.
    const uint64_t g = pos_.row + static_cast<uint64_t>(opt_.rank) * B + j;
    const uint64_t start = row_start(pos_.epoch + g / rows_, g % rows_);
    for (size_t t = 0; t < T; t++) {
      inputs[j * T + t] = tokens[start + t];
      targets[j * T + t] = tokens[start + t + 1];
    }
  }
  const uint64_t advanced = pos_.row + B * static_cast<uint64_t>(opt_.world_size);
  pos_.epoch += advanced / rows_;
  pos_.row = advanced % rows_;
  return Status::ok();
}

}  // namespace zinf::model
