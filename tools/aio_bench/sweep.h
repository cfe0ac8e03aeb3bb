// aio_bench sweep: the grid of aio knobs and the timed, interleaved measurement of each point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zinf/aio/handle.h"
#include "zinf/aio/pinned.h"
#include "zinf/status.h"

namespace zinf::aio_bench {

enum class Op { kRead, kWrite };
const char* op_name(Op op);

// One setting of the knobs the runtime reads.
struct Point {
  aio::Backend backend = aio::Backend::kAuto;
  std::size_t block_size = 1 << 20;
  std::size_t queue_depth = 8;
  std::size_t parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

// Bandwidth samples of one (point, op), GB/s (1e9 bytes per second).
struct Samples {
  std::vector<double> gbps;
  double median() const;
  double min() const;
  double max() const;
};

struct PointResult {
  Point point;
  Samples read;
  Samples write;
  Samples fio_read;   // empty unless --vs-fio
  Samples fio_write;
};

// How long one timed run lasts: transfers of the whole file repeat for `ramp_s` (not
// counted), then for at least `runtime_s` (counted), like fio's --ramp_time/--runtime.
struct Timing {
  double ramp_s = 0.25;
  double runtime_s = 1.0;
};

// Owns the test files and the pinned buffer; measures zinf's handle at a point.
class Bench {
 public:
  // Creates `dir`/zinf_aio_bench.<pid>.read (file_bytes, written once) and a pinned buffer.
  static Result<Bench> create(const std::string& dir, std::size_t file_bytes);
  Bench(Bench&& other) noexcept;
  Bench& operator=(Bench&&) = delete;
  Bench(const Bench&) = delete;
  ~Bench();

  // One timed run. Writes go to a fresh, preallocated file each run (as fio lays out its file).
  Result<double> run(const Point& point, Op op, const Timing& timing);

  const std::string& read_path() const { return read_path_; }
  const std::string& write_path() const { return write_path_; }
  std::size_t file_bytes() const { return file_bytes_; }
  // Deletes and preallocates the write file (also used before fio's write runs).
  Status fresh_write_file() const;

 private:
  Bench() = default;
  std::string read_path_;
  std::string write_path_;
  std::size_t file_bytes_ = 0;
  aio::PinnedBuffer buffer_;
  bool owns_files_ = false;
};

std::string describe(const Point& point);

}  // namespace zinf::aio_bench
