// Internal: zero3's names for the common file toolkit (common/file_io.h), used by checkpoints and model files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/file_io.h"
#include "zinf/status.h"

namespace zinf::zero3 {

using fileio::AtomicFile;
using fileio::read_small_file;
using fileio::sync_dir;
using fileio::write_file_atomic;

inline Result<std::uint64_t> file_size_of(const std::string& path) { return fileio::file_size(path); }

// Reads exactly `bytes` at `offset`. A checkpoint or model file that ends first is damaged:
// the toolkit's OutOfRange (naming the path, the offset and where the file ends) becomes Corruption.
inline Status read_exact(const std::string& path, std::uint64_t offset, void* out, std::size_t bytes) {
  Status st = fileio::pread_exact(path, out, bytes, offset);
  if (st.code() == ErrorCode::kOutOfRange) return Status::corruption(st.message());
  return st;
}

}  // namespace zinf::zero3
