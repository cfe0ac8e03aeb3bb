// safetensors files: write and read named tensors, fp32 in memory, F32, BF16 or F16 on disk (the
// format Hugging Face tools load).
//
// Layout: 8-byte little-endian header length H, H bytes of JSON
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
// padded with spaces to a multiple of 8, then the tensor bytes back to back.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::zero3 {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16" (read and converted to fp32), or another the file names
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets in the data section
  std::uint64_t end = 0;
};

struct TensorToWrite {
  std::string name;
  std::vector<std::int64_t> shape;
  // Fills `out` (numel floats) with the tensor's values; called once, in order, so a
  // writer can stream parameters one at a time without holding the whole model.
  std::function<Status(std::span<float> out)> fill;
  // How the values are stored: "F32", or "BF16" / "F16" rounded to nearest even.
  std::string dtype = "F32";
};

// Writes atomically: `path`.tmp, fsync, rename. Fails if a shape and its element count disagree.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

class SafetensorsReader {
 public:
  // Reads and validates the header: JSON, known dtypes, offsets inside the file, no overlaps.
  static Result<SafetensorsReader> open(const std::string& path);
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // Reads tensor `name` as fp32 into `out` (its element count must match).
  Status read_f32(const std::string& name, std::span<float> out) const;

 private:
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace zinf::zero3
