// aio_bench's heatmap.svg: its geometry (every text and rectangle inside the canvas, by a width
// estimate independent of the one the layout uses), the header's facts, the recommended cell
// outlined in both panels, and one labelled colour scale per panel.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "report.h"

namespace zinf::aio_bench {
namespace {

PointResult result(std::size_t block, std::size_t qd, std::size_t par, double read, double write) {
  PointResult r;
  r.point.backend = aio::Backend::kIoUring;
  r.point.block_size = block;
  r.point.queue_depth = qd;
  r.point.parallelism = par;
  r.read.gbps = {read};
  r.write.gbps = {write};
  return r;
}

std::string attr(const std::string& element, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(element, m, std::regex(" " + name + "=\"([^\"]*)\""))) return "";
  return m[1];
}

std::string unescape(std::string s) {
  for (auto [from, to] : {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}}) {
    for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + 1)) s.replace(at, std::string(from).size(), to);
  }
  return s;
}

// Every text's box (at 0.6 em per glyph, ascent one em) and every rectangle lie in the canvas.
void expect_inside_canvas(const std::string& svg) {
  std::smatch root;
  ASSERT_TRUE(std::regex_search(svg, root, std::regex("<svg [^>]*width=\"([0-9.]+)\" height=\"([0-9.]+)\"")));
  const double width = std::stod(root[1]), height = std::stod(root[2]);
  const std::regex text_re("<text([^>]*)>([^<]*)</text>");
  int texts = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text_re); it != std::sregex_iterator(); ++it, ++texts) {
    const std::string a = (*it)[1], content = unescape((*it)[2]);
    const double x = std::stod(attr(a, "x")), y = std::stod(attr(a, "y"));
    const double fs = attr(a, "font-size").empty() ? 11.0 : std::stod(attr(a, "font-size"));
    const double w = 0.6 * fs * static_cast<double>(content.size());
    const std::string anchor = attr(a, "text-anchor");
    const double x_left = anchor == "middle" ? x - w / 2 : anchor == "end" ? x - w : x;
    EXPECT_GE(x_left, 0.0) << content;
    EXPECT_LE(x_left + w, width) << content << " (canvas " << width << " wide)";
    EXPECT_GE(y - fs, 0.0) << content;
    EXPECT_LE(y + 0.3 * fs, height) << content;
  }
  EXPECT_GT(texts, 10);
  const std::regex rect_re("<rect x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" height=\"([0-9.]+)\"");
  const std::regex any_rect("<rect class=\"[a-z]+\" x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" height=\"([0-9.]+)\"");
  for (const std::regex* re : {&rect_re, &any_rect}) {
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), *re); it != std::sregex_iterator(); ++it) {
      EXPECT_LE(std::stod((*it)[1]) + std::stod((*it)[3]), width) << (*it)[0];
      EXPECT_LE(std::stod((*it)[2]) + std::stod((*it)[4]), height) << (*it)[0];
    }
  }
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(HeatmapTest, QuickGridFitsAndSaysWhatItMeasured) {
  std::vector<PointResult> results;
  for (std::size_t block : {256u << 10, 1u << 20, 4u << 20}) {
    for (std::size_t qd : {8u, 32u}) {
      for (std::size_t par : {1u, 2u}) {
        results.push_back(result(block, qd, par, 0.5 + 1e-7 * block + 0.01 * qd, 0.2 + 1e-8 * block * par));
      }
    }
  }
  const Best best = find_best(results);
  const std::string svg =
      heatmap_svg(results, best, HeatmapFacts{"/tmp/a folder & <more>", "ext4", "2026-11-26 12:55 UTC"});
  expect_inside_canvas(svg);
  EXPECT_NE(svg.find("/tmp/a folder &amp; &lt;more&gt; (ext4) | backend io_uring | 2026-11-26 12:55 UTC"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(">write GB/s</text>"), std::string::npos);
  // The recommended cell, outlined once per panel, at its block and queue depth.
  EXPECT_EQ(count(svg, "class=\"recommended\""), 2);
  EXPECT_NE(svg.find(describe(best.balanced->point)), std::string::npos);
  // One colour scale per panel, labelled with that panel's peak.
  EXPECT_EQ(count(svg, "class=\"scale\""), 2);
  EXPECT_NE(svg.find(fmt::format(">{:.2f} GB/s<", best.read->read.median())), std::string::npos);
  EXPECT_NE(svg.find(fmt::format(">{:.2f} GB/s<", best.write->write.median())), std::string::npos);
}

// One block size and one queue depth (the narrowest map) with a long folder: still inside.
TEST(HeatmapTest, ANarrowMapAndALongFolderStayInsideTheCanvas) {
  const std::vector<PointResult> results = {result(1 << 20, 128, 1, 12.345, 6.789)};
  const std::string folder = "/mnt/" + std::string(150, 'x');
  const std::string svg = heatmap_svg(results, find_best(results), HeatmapFacts{folder, "xfs", "2026-01-01 00:00 UTC"});
  expect_inside_canvas(svg);
  EXPECT_NE(svg.find(folder + " (xfs)"), std::string::npos);
}

}  // namespace
}  // namespace zinf::aio_bench
