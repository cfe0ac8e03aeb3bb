// The readers under fuzzing: each entry point feeds bytes to one reader of untrusted files.
#include "readers.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "swap/store_manifest.h"
#include "zero3/checkpoint_folder.h"
#include "zero3/checkpoint_format.h"
#include "zinf/config/ds_config.h"
#include "zinf/model/data.h"
#include "zinf/zero3/hf_folder.h"
#include "zinf/zero3/safetensors.h"

namespace zinf::fuzz {
namespace {

// A finding that is not a crash: the reader returned something it must not.
[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s: %s\n", what, detail.c_str());
  std::abort();
}

std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A private folder for the readers that take a path, made once per process.
const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("ZINF_TEST_TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/zinf_fuzz_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp", tmpl);
    return tmpl;
  }();
  return dir;
}

void write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) fail("write", path);
}

}  // namespace

void config_text(const std::uint8_t* data, std::size_t size) {
  // Once as given, once with every "auto" taking the Trainer's defaults.
  config::AutoContext ctx;
  auto r = config::parse_ds_config(text_of(data, size), "fuzz.json", ctx);
  if (r.is_ok() && r.value().batch.train_micro_batch_size_per_gpu > 0x7fffffff) {
    fail("config", "a micro-batch over INT32_MAX passed");
  }
  ctx.trainer_defaults = true;
  ctx.hidden_size = 64;
  (void)config::parse_ds_config(text_of(data, size), "fuzz.json", ctx);
}

void engine_json(const std::uint8_t* data, std::size_t size) {
  auto r = zero3::detail::parse_engine_json(text_of(data, size), "fuzz");
  if (!r.is_ok()) return;
  const zero3::detail::EngineJson& e = r.value();
  if (e.ranks.size() != static_cast<std::size_t>(e.saved.plan.world_size())) fail("engine.json", "ranks != world");
  // Every offset a load would read lies inside the recorded rank file.
  for (std::size_t g = 0; g < e.saved.layout.subgroup_of.size(); ++g) {
    for (std::size_t which = 0; which < e.saved.arrays; ++which) {
      if (e.saved.element_offset(g, which, 0) > e.saved.rank_file_bytes) fail("engine.json", "offset past the file");
    }
  }
}

void latest_tag(const std::uint8_t* data, std::size_t size) {
  auto r = zero3::detail::parse_latest_tag(text_of(data, size), "dir");
  if (!r.is_ok()) return;
  const std::string& tag = r.value();
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos) {
    fail("latest", "a tag that leaves the folder passed: " + tag);
  }
}

void swap_manifest(const std::uint8_t* data, std::size_t size) {
  auto r = swap::detail::manifest_from_json(std::string(text_of(data, size)), "fuzz/manifest.json");
  if (!r.is_ok()) return;
  for (const auto& [key, t] : r.value().tensors) {
    for (const swap::Extent& e : t.extents) {
      if (e.offset + e.length < e.offset) fail("manifest", "extent wraps: " + key);
    }
  }
}

void safetensors(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_dir() + "/model.safetensors";
  write_file(path, data, size);
  auto r = zero3::SafetensorsReader::open(path);
  if (!r.is_ok()) return;
  // Read every tensor the header admits (small ones only: the file is at most max_len).
  for (const zero3::SafetensorsEntry& e : r.value().entries()) {
    std::uint64_t n = 1;
    for (std::int64_t d : e.shape) n *= static_cast<std::uint64_t>(d);
    if (n > size / 2) fail("safetensors", "a tensor larger than its file passed: " + e.name);
    std::vector<float> out(n);
    (void)r.value().read_f32(e.name, out);
  }
}

void token_file(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_dir() + "/tokens.bin";
  write_file(path, data, size);
  for (model::DataFormat f : {model::DataFormat::kAuto, model::DataFormat::kText, model::DataFormat::kLlmc,
                              model::DataFormat::kUint16, model::DataFormat::kUint32}) {
    (void)model::TokenDataset::load(path, f);
  }
}

void hf_config(const std::uint8_t* data, std::size_t size) {
  write_file(scratch_dir() + "/config.json", data, size);
  (void)zero3::HfFolder::open(scratch_dir());
}

Entry entry_for(std::string_view target) {
  if (target == "config_text") return config_text;
  if (target == "engine_json") return engine_json;
  if (target == "latest_tag") return latest_tag;
  if (target == "swap_manifest") return swap_manifest;
  if (target == "safetensors") return safetensors;
  if (target == "token_file") return token_file;
  if (target == "hf_config") return hf_config;
  return nullptr;
}

}  // namespace zinf::fuzz
