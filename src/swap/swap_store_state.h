// Internal: what swap_store.cpp (extents, I/O, manifest) and page_sums.cpp (page checksums)
// share: the data files, the store's state, and the mapping of tensor bytes to file ranges.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "swap/free_list.h"
#include "swap/page_sums.h"
#include "zinf/status.h"
#include "zinf/swap/swap_store.h"

namespace zinf::swap {
namespace detail {

struct DataFile {
  std::string path;
  std::string name;
  fileio::UniqueFd fd;
  std::uint64_t end = 0;  // bytes allocated (the logical end of the file)
  FreeList free;
};

// `length` bytes of file f: the best free gap, else the file grows (its free tail reused).
Result<std::uint64_t> take_space(DataFile& f, std::uint64_t length);

// One transfer between a buffer range and a file range.
struct Piece {
  std::uint32_t file;
  std::uint64_t file_offset;
  std::uint64_t buffer_offset;
  std::uint64_t length;
};

// Splits bytes [offset, offset + length) of a tensor into per-file transfers (see the layout
// in swap_store.h), merging neighbours that are contiguous in the file and the buffer.
std::vector<Piece> map_range(const TensorRecord& r, std::uint64_t offset, std::uint64_t length,
                             std::uint64_t files, std::uint64_t unit);

}  // namespace detail

struct SwapStore::State {
  mutable std::mutex mutex;
  std::mutex commit_mutex;  // one commit at a time
  std::vector<fileio::FileLock> locks;  // one per folder, held for the store's life
  std::vector<detail::DataFile> files;
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, std::string> metadata;
  // With checksums, per tensor. Map entries are stable, and wait() touches them only under `mutex`.
  std::map<std::string, detail::PageSums> sums;
  std::uint64_t generation = 0;
  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> bytes_written{0};

  void free_extents(const TensorRecord& r) {
    for (const Extent& e : r.extents) files[e.file].free.add(e.offset, e.length);
    if (r.sums.length != 0) files[r.sums.file].free.add(r.sums.offset, r.sums.length);
  }
};

}  // namespace zinf::swap
