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

Status write_svg(const std::string& path, const std::vector<PointResult>& results) {
  std::set<std::size_t> blocks, depths;
  std::map<std::pair<std::size_t, std::size_t>, std::pair<double, double>> cell;  // (bs,qd) -> (rd,wr)
  double peak = 0.0;
  for (const PointResult& r : results) {
    blocks.insert(r.point.block_size);
    depths.insert(r.point.queue_depth);
    auto& c = cell[{r.point.block_size, r.point.queue_depth}];
    c.first = std::max(c.first, r.read.median());
    c.second = std::max(c.second, r.write.median());
    peak = std::max({peak, c.first, c.second});
  }
  const int cw = 70, ch = 34, left = 70, top = 50, gap = 60;
  const int panel_w = cw * static_cast<int>(blocks.size());
  const int width = left + 2 * panel_w + gap + 20;
  const int height = top + ch * static_cast<int>(depths.size()) + 50;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  for (int panel = 0; panel < 2; ++panel) {
    const int x0 = left + panel * (panel_w + gap);
    svg += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\">{} GB/s (best over other knobs)</text>\n", x0,
                       panel == 0 ? "read" : "write");
    int col = 0;
    for (std::size_t bs : blocks) {
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x0 + col * cw + cw / 2,
                         top - 8, human_bytes(bs));
      int row = 0;
      for (std::size_t qd : depths) {
        if (col == 0) {
          svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">qd {}</text>\n", x0 - 6,
                             top + row * ch + ch / 2 + 4, qd);
        }
        auto it = cell.find({bs, qd});
        const double v = it == cell.end() ? 0.0 : (panel == 0 ? it->second.first : it->second.second);
        const double t = peak > 0.0 ? v / peak : 0.0;  // 0 (pale) .. 1 (dark blue)
        const int red = static_cast<int>(240 - 200 * t), green = static_cast<int>(245 - 160 * t);
        svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},255)\" "
                           "stroke=\"white\"/>\n",
                           x0 + col * cw, top + row * ch, cw, ch, red, green);
        if (it != cell.end()) {
          svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{:.2f}</text>\n",
                             x0 + col * cw + cw / 2, top + row * ch + ch / 2 + 4, t > 0.6 ? "white" : "black", v);
        }
        ++row;
      }
      ++col;
    }
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">block_size</text>\n", x0 + panel_w / 2,
                       top + ch * static_cast<int>(depths.size()) + 20);
  }
  svg += "</svg>\n";
  return write_file(path, svg);
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
