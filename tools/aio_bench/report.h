// aio_bench report: table, best points, the ready-to-paste "aio" block, CSV, JSON and SVG heat map.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "sweep.h"
#include "zinf/status.h"

namespace zinf::aio_bench {

struct Best {
  const PointResult* read = nullptr;      // highest median read
  const PointResult* write = nullptr;     // highest median write
  const PointResult* balanced = nullptr;  // highest geometric mean of read and write: the block's point
  double fio_read = 0.0;                  // fio's best median read (0 without --vs-fio)
  double fio_write = 0.0;
};

Best find_best(const std::vector<PointResult>& results);

void print_table(std::ostream& out, const std::vector<PointResult>& results, bool with_fio);
// `{"aio": {...}}` with the keys the runtime reads and real JSON booleans.
std::string aio_block(const Point& point);
void print_best(std::ostream& out, const Best& best, bool with_fio);

Status write_csv(const std::string& path, const std::vector<PointResult>& results);
Status write_points_json(const std::string& path, const std::vector<PointResult>& results);
// Two heat maps (read, write) of the best median over block_size x queue_depth.
Status write_svg(const std::string& path, const std::vector<PointResult>& results);
// The summary: best.read_gbps, best.write_gbps, aio, and fio.{read,write}_gbps with --vs-fio.
Status write_summary_json(const std::string& path, const Best& best, const std::string& header,
                          bool with_fio);

}  // namespace zinf::aio_bench
