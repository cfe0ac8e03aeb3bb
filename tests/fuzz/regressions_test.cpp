// Every seed and every input a fuzzer once crashed on, fed through the same reader entry points
// in the ordinary builds (release and ASan), so a fixed finding stays fixed without libFuzzer.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "readers.h"

namespace zinf::fuzz {
namespace {

namespace fs = std::filesystem;

const char* const kTargets[] = {"config_text", "engine_json", "latest_tag", "swap_manifest",
                                "safetensors", "token_file",  "hf_config"};

std::vector<fs::path> inputs_of(const std::string& kind, const std::string& target) {
  std::vector<fs::path> files;
  const fs::path dir = fs::path(ZINF_FUZZ_DIR) / kind / target;
  if (!fs::is_directory(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

class FuzzInputs : public ::testing::TestWithParam<const char*> {};

TEST_P(FuzzInputs, SeedsAndRegressionsPass) {
  const Entry entry = entry_for(GetParam());
  ASSERT_NE(entry, nullptr);
  const std::vector<fs::path> seeds = inputs_of("corpus", GetParam());
  EXPECT_FALSE(seeds.empty()) << "every target has a seed corpus under tests/fuzz/corpus/" << GetParam();
  std::vector<fs::path> all = seeds;
  for (const fs::path& p : inputs_of("regressions", GetParam())) all.push_back(p);
  for (const fs::path& p : all) {
    SCOPED_TRACE(p.string());
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    entry(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());  // aborts on a finding
  }
}

INSTANTIATE_TEST_SUITE_P(All, FuzzInputs, ::testing::ValuesIn(kTargets),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace zinf::fuzz
