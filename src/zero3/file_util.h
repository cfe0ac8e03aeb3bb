// Internal: small blocking file helpers for checkpoints and model files (atomic replace, exact reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zinf/status.h"

namespace zinf::zero3 {

// Writes a new file next to `path` (path + ".tmp.<pid>"); commit() fsyncs it, renames it over
// `path` and fsyncs the folder, so readers see either the old or the whole new file. If the
// object is destroyed without commit(), the temporary file is removed and `path` is untouched.
class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();

  Status append(const void* data, std::size_t bytes);
  Status commit();

 private:
  AtomicFile() = default;
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

Result<std::uint64_t> file_size_of(const std::string& path);
// Reads exactly `bytes` at `offset`; a short file is a Corruption error naming the sizes.
Status read_exact(const std::string& path, std::uint64_t offset, void* out, std::size_t bytes);
// Writes a whole small file atomically (AtomicFile).
Status write_file_atomic(const std::string& path, const std::string& text);
Result<std::string> read_small_file(const std::string& path);
// fsync of a folder, so a rename inside it is durable.
Status sync_dir(const std::string& dir);

}  // namespace zinf::zero3
