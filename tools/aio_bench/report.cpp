// aio_bench report writers. Bandwidths are medians over repeats, in GB/s (1e9 B/s).
#include "report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace zinf::aio_bench {
namespace {

double ratio(double a, double b) { return b > 0.0 ? a / b : 0.0; }

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status::sys_error(fmt::format("open {} for writing", path), errno);
  f << text;
  f.close();
  if (!f) return Status::sys_error(fmt::format("write {}", path), errno);
  return Status::ok();
}

nlohmann::json aio_json(const Point& p) {
  return nlohmann::json{{"block_size", p.block_size},
                        {"queue_depth", p.queue_depth},
                        {"intra_op_parallelism", p.parallelism},
                        {"single_submit", p.single_submit},
                        {"overlap_events", p.overlap_events}};
}

nlohmann::json samples_json(const Samples& s) {
  return nlohmann::json{{"median_gbps", s.median()}, {"min_gbps", s.min()}, {"max_gbps", s.max()},
                        {"samples_gbps", s.gbps}};
}

std::string human_bytes(std::size_t b) {
  if (b % (1 << 20) == 0) return fmt::format("{}M", b >> 20);
  if (b % (1 << 10) == 0) return fmt::format("{}K", b >> 10);
  return fmt::format("{}", b);
}

}  // namespace

Best find_best(const std::vector<PointResult>& results) {
  Best best;
  double best_bal = -1.0;
  for (const PointResult& r : results) {
    if (best.read == nullptr || r.read.median() > best.read->read.median()) best.read = &r;
    if (best.write == nullptr || r.write.median() > best.write->write.median()) best.write = &r;
    const double bal = std::sqrt(r.read.median() * r.write.median());
    if (bal > best_bal) {
      best_bal = bal;
      best.balanced = &r;
    }
    best.fio_read = std::max(best.fio_read, r.fio_read.median());
    best.fio_write = std::max(best.fio_write, r.fio_write.median());
  }
  return best;
}

void print_table(std::ostream& out, const std::vector<PointResult>& results, bool with_fio) {
  out << fmt::format("{:<9} {:>6} {:>4} {:>3} {:>6} {:>7} | {:>22} | {:>22}", "backend", "block", "qd",
                     "par", "single", "overlap", "read GB/s med [min-max]", "write GB/s med [min-max]");
  if (with_fio) out << fmt::format(" | {:>8} {:>8} | {:>6} {:>6}", "fio rd", "fio wr", "rd x", "wr x");
  out << "\n";
  for (const PointResult& r : results) {
    const Point& p = r.point;
    out << fmt::format("{:<9} {:>6} {:>4} {:>3} {:>6} {:>7} | {:>6.2f} [{:>5.2f}-{:>5.2f}]    | "
                       "{:>6.2f} [{:>5.2f}-{:>5.2f}]   ",
                       aio::backend_name(p.backend), human_bytes(p.block_size), p.queue_depth,
                       p.parallelism, p.single_submit, p.overlap_events, r.read.median(), r.read.min(),
                       r.read.max(), r.write.median(), r.write.min(), r.write.max());
    if (with_fio && !r.fio_read.gbps.empty()) {
      out << fmt::format(" | {:>8.2f} {:>8.2f} | {:>6.2f} {:>6.2f}", r.fio_read.median(),
                         r.fio_write.median(), ratio(r.read.median(), r.fio_read.median()),
                         ratio(r.write.median(), r.fio_write.median()));
    }
    out << "\n";
  }
}

std::string aio_block(const Point& point) {
  return nlohmann::json{{"aio", aio_json(point)}}.dump(2);
}

void print_best(std::ostream& out, const Best& best, bool with_fio) {
  if (best.read == nullptr) return;
  out << fmt::format("\nBest read:  {:.2f} GB/s at {}\n", best.read->read.median(), describe(best.read->point));
  out << fmt::format("Best write: {:.2f} GB/s at {}\n", best.write->write.median(),
                     describe(best.write->point));
  if (with_fio) {
    out << fmt::format("fio best in the same run: read {:.2f} GB/s, write {:.2f} GB/s -> zinf/fio read "
                       "{:.2f}x, write {:.2f}x\n",
                       best.fio_read, best.fio_write, ratio(best.read->read.median(), best.fio_read),
                       ratio(best.write->write.median(), best.fio_write));
  }
  out << fmt::format("Best performance (GB/sec): read = {:.2f}, write = {:.2f}\n", best.read->read.median(),
                     best.write->write.median());
  out << fmt::format("\nRecommended block (best read x write balance: read {:.2f}, write {:.2f} GB/s), "
                     "paste into ds_config.json:\n{}\n",
                     best.balanced->read.median(), best.balanced->write.median(),
                     aio_block(best.balanced->point));
}

Status write_csv(const std::string& path, const std::vector<PointResult>& results) {
  std::string text =
      "backend,block_size,queue_depth,intra_op_parallelism,single_submit,overlap_events,"
      "read_median_gbps,read_min_gbps,read_max_gbps,write_median_gbps,write_min_gbps,write_max_gbps,"
      "fio_read_median_gbps,fio_write_median_gbps\n";
  for (const PointResult& r : results) {
    const Point& p = r.point;
    text += fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n",
                        aio::backend_name(p.backend), p.block_size, p.queue_depth, p.parallelism,
                        p.single_submit, p.overlap_events, r.read.median(), r.read.min(), r.read.max(),
                        r.write.median(), r.write.min(), r.write.max(), r.fio_read.median(),
                        r.fio_write.median());
  }
  return write_file(path, text);
}

Status write_points_json(const std::string& path, const std::vector<PointResult>& results) {
  nlohmann::json points = nlohmann::json::array();
  for (const PointResult& r : results) {
    nlohmann::json j = aio_json(r.point);
    j["backend"] = aio::backend_name(r.point.backend);
    j["read"] = samples_json(r.read);
    j["write"] = samples_json(r.write);
    if (!r.fio_read.gbps.empty()) {
      j["fio_read"] = samples_json(r.fio_read);
      j["fio_write"] = samples_json(r.fio_write);
    }
    points.push_back(std::move(j));
  }
  return write_file(path, points.dump(2) + "\n");
}

namespace {

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// The cell colour at t in [0, 1] of a panel's scale: pale (0) to dark blue (its peak).
std::string cell_colour(double t) {
  return fmt::format("rgb({},{},255)", static_cast<int>(240 - 200 * t), static_cast<int>(245 - 160 * t));
}

// A text element; `anchor` "start", "middle" or "end".
std::string svg_text(double x, double y, std::string_view text, int font_size, const char* anchor,
                     const char* fill = "black") {
  return fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"{}\" text-anchor=\"{}\" fill=\"{}\">{}</text>\n", x,
                     y, font_size, anchor, fill, xml_escape(text));
}

}  // namespace

double heatmap_text_width(std::string_view text, double font_size) {
  return 0.62 * font_size * static_cast<double>(text.size());
}

std::string heatmap_svg(const std::vector<PointResult>& results, const Best& best, const HeatmapFacts& facts) {
  std::set<std::size_t> blocks, depths;
  std::set<std::string> backends;
  std::map<std::pair<std::size_t, std::size_t>, std::pair<double, double>> cell;  // (bs,qd) -> (rd,wr)
  double peak[2] = {0.0, 0.0};  // per panel: read, write
  for (const PointResult& r : results) {
    blocks.insert(r.point.block_size);
    depths.insert(r.point.queue_depth);
    backends.insert(std::string(aio::backend_name(r.point.backend)));
    auto& c = cell[{r.point.block_size, r.point.queue_depth}];
    c.first = std::max(c.first, r.read.median());
    c.second = std::max(c.second, r.write.median());
    peak[0] = std::max(peak[0], c.first);
    peak[1] = std::max(peak[1], c.second);
  }
  std::string backend_list;
  for (const std::string& b : backends) backend_list += (backend_list.empty() ? "" : ", ") + b;
  const std::string head = fmt::format("{} ({}) | backend{} {} | {}", facts.folder, facts.file_system,
                                       backends.size() == 1 ? "" : "s", backend_list, facts.date);
  const Point* rec = best.balanced != nullptr ? &best.balanced->point : nullptr;
  const std::string captions[2] = {
      "cells: the best median GB/s over the other knobs at that block_size and queue_depth",
      rec == nullptr ? std::string("no points measured")
                     : fmt::format("outlined: the recommended block's cell ({})", describe(*rec))};
  const char* titles[2] = {"read GB/s", "write GB/s"};

  // Layout: every width is the widest of what must fit, so no text leaves the canvas.
  constexpr int kSmall = 11, kTitle = 14, kHead = 12;
  constexpr double kMargin = 12, kCellW = 70, kCellH = 34;
  double qd_label_w = 0;
  for (std::size_t qd : depths) qd_label_w = std::max(qd_label_w, heatmap_text_width(fmt::format("qd {}", qd), kSmall));
  std::string scale_labels[2];
  for (int p = 0; p < 2; ++p) scale_labels[p] = fmt::format("{:.2f} GB/s", peak[p]);
  double panel_w = kCellW * static_cast<double>(std::max<std::size_t>(blocks.size(), 1));
  for (int p = 0; p < 2; ++p) {
    panel_w = std::max({panel_w, heatmap_text_width(titles[p], kTitle),
                        heatmap_text_width("0", kSmall) + 10 + heatmap_text_width(scale_labels[p], kSmall)});
  }
  const double gap = qd_label_w + 2 * kMargin;  // the second panel's qd labels stand in it
  const double left = kMargin + qd_label_w + 6;
  const double width = std::max({left + 2 * panel_w + gap + kMargin, 2 * kMargin + heatmap_text_width(head, kHead),
                                 2 * kMargin + heatmap_text_width(captions[0], kSmall),
                                 2 * kMargin + heatmap_text_width(captions[1], kSmall)});
  const double head_y = kMargin + kHead;
  const double title_y = head_y + 14 + kTitle;
  const double top = title_y + 12 + kSmall + 8;  // block-size labels sit 8 above the cells
  const double cells_bottom = top + kCellH * static_cast<double>(depths.size());
  const double axis_y = cells_bottom + 16;
  const double bar_y = axis_y + 10, bar_h = 10;
  const double scale_text_y = bar_y + bar_h + 14;
  const double caption_y = scale_text_y + 22;
  const double height = caption_y + 16 + kMargin;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"{}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<defs><linearGradient id=\"scale\"><stop offset=\"0\" stop-color=\"{}\"/><stop offset=\"1\" "
      "stop-color=\"{}\"/></linearGradient></defs>\n",
      std::ceil(width), std::ceil(height), kSmall, cell_colour(0.0), cell_colour(1.0));
  svg += svg_text(kMargin, head_y, head, kHead, "start");
  for (int panel = 0; panel < 2; ++panel) {
    const double x0 = left + panel * (panel_w + gap);
    svg += svg_text(x0, title_y, titles[panel], kTitle, "start");
    int col = 0;
    for (std::size_t bs : blocks) {
      const double cx = x0 + col * kCellW;
      svg += svg_text(cx + kCellW / 2, top - 8, human_bytes(bs), kSmall, "middle");
      int row = 0;
      for (std::size_t qd : depths) {
        const double cy = top + row * kCellH;
        if (col == 0) svg += svg_text(x0 - 6, cy + kCellH / 2 + 4, fmt::format("qd {}", qd), kSmall, "end");
        auto it = cell.find({bs, qd});
        const double v = it == cell.end() ? 0.0 : (panel == 0 ? it->second.first : it->second.second);
        const double t = peak[panel] > 0.0 ? v / peak[panel] : 0.0;
        svg += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"{}\" stroke=\"white\"/>\n",
                           cx, cy, kCellW, kCellH, cell_colour(t));
        if (it != cell.end()) {
          svg += svg_text(cx + kCellW / 2, cy + kCellH / 2 + 4, fmt::format("{:.2f}", v), kSmall, "middle",
                          t > 0.6 ? "white" : "black");
        }
        ++row;
      }
      ++col;
    }
    // The recommended block's cell, outlined on top of the cells.
    if (rec != nullptr) {
      const auto bcol = std::distance(blocks.begin(), blocks.find(rec->block_size));
      const auto drow = std::distance(depths.begin(), depths.find(rec->queue_depth));
      svg += fmt::format("<rect class=\"recommended\" x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" "
                         "fill=\"none\" stroke=\"black\" stroke-width=\"3\"/>\n",
                         x0 + static_cast<double>(bcol) * kCellW + 1.5, top + static_cast<double>(drow) * kCellH + 1.5,
                         kCellW - 3, kCellH - 3);
    }
    const double cells_w = kCellW * static_cast<double>(blocks.size());
    svg += svg_text(x0 + cells_w / 2, axis_y, "block_size", kSmall, "middle");
    // This panel's colour scale: 0 at the left, its peak at the right.
    svg += fmt::format("<rect class=\"scale\" x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" "
                       "fill=\"url(#scale)\" stroke=\"#888\"/>\n",
                       x0, bar_y, panel_w, bar_h);
    svg += svg_text(x0, scale_text_y, "0", kSmall, "start");
    svg += svg_text(x0 + panel_w, scale_text_y, scale_labels[panel], kSmall, "end");
  }
  svg += svg_text(kMargin, caption_y, captions[0], kSmall, "start");
  svg += svg_text(kMargin, caption_y + 16, captions[1], kSmall, "start");
  svg += "</svg>\n";
  return svg;
}

Status write_svg(const std::string& path, const std::vector<PointResult>& results, const Best& best,
                 const HeatmapFacts& facts) {
  return write_file(path, heatmap_svg(results, best, facts));
}

Status write_summary_json(const std::string& path, const Best& best, const std::string& header,
                          bool with_fio) {
  nlohmann::json j;
  j["machine"] = header;
  if (best.read != nullptr) {
    j["best"] = {{"read_gbps", best.read->read.median()},
                 {"write_gbps", best.write->write.median()},
                 {"read_point", aio_json(best.read->point)},
                 {"write_point", aio_json(best.write->point)},
                 {"backend", aio::backend_name(best.balanced->point.backend)}};
    j["aio"] = aio_json(best.balanced->point);
    if (with_fio) {
      j["fio"] = {{"read_gbps", best.fio_read}, {"write_gbps", best.fio_write}};
      j["ratio_vs_fio"] = {{"read", ratio(best.read->read.median(), best.fio_read)},
                           {"write", ratio(best.write->write.median(), best.fio_write)}};
    }
  }
  return write_file(path, j.dump(2) + "\n");
}

}  // namespace zinf::aio_bench
