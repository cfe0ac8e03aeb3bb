// aio_bench report: table, best points, the ready-to-paste "aio" block, CSV, JSON and SVG heat map.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
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
// What a heat map says it measured, in its header line.
struct HeatmapFacts {
  std::string folder;       // --dir
  std::string file_system;  // e.g. "ext4"
  std::string date;         // when it was measured, e.g. "2026-11-26 12:55 UTC"
};

// Estimated width in pixels of `text` at `font_size` in the heat map's sans-serif font (a
// generous average glyph width: the layout reserves this much for every text).
double heatmap_text_width(std::string_view text, double font_size);

// The heat map: a header line (folder, file system, the backends measured, date), two panels
// (read, write) of the best median over block_size x queue_depth (best over the other knobs),
// each with its own colour scale from 0 to its peak (labelled "0" and the peak in GB/s); the cell of the
// recommended block (best.balanced) is outlined in both. The canvas is sized so that every
// text lies inside it (by heatmap_text_width). `best` must come from find_best(results).
std::string heatmap_svg(const std::vector<PointResult>& results, const Best& best, const HeatmapFacts& facts);
Status write_svg(const std::string& path, const std::vector<PointResult>& results, const Best& best,
                 const HeatmapFacts& facts);
// The summary: best.read_gbps, best.write_gbps, aio, and fio.{read,write}_gbps with --vs-fio.
Status write_summary_json(const std::string& path, const Best& best, const std::string& header,
                          bool with_fio);

}  // namespace zinf::aio_bench
