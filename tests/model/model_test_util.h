// Helpers shared by the model tests: small configurations, random parameters, a recording
// ParamAccess, temp folders.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/rng.h"
#include "zinf/model/config.h"
#include "zinf/model/gpt.h"
#include "zinf/model/llama.h"
#include "zinf/model/local_params.h"

namespace zinf::model::testing {

// A model small enough for finite differences, with T < max_seq so some wpe rows go unused.
inline GptConfig micro_config(bool checkpointing = false) {
  GptConfig c;
  c.vocab_size = 48;
  c.max_seq = 12;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.activation_checkpointing = checkpointing;
  return c;
}

inline double test_normal(uint64_t seed, uint64_t i) {
  return detail::normal_from_key(detail::hash3(seed, i, 0x74657374));
}

// Parameters far from GPT-2 init (large weights, non-zero biases, LayerNorm weights around 1) so
// that every path of the backward carries a visible gradient.
inline void randomize(LocalParams& lp, std::span<const ParamSpec> specs, uint64_t seed) {
  uint64_t n = 0;
  for (const ParamSpec& s : specs) {
    std::span<float> p = lp.param(s.index);
    for (float& x : p) {
      const double z = test_normal(seed, n++);
      switch (s.init) {
        case ParamInit::kOnes:
          x = static_cast<float>(1.0 + 0.2 * z);
          break;
        case ParamInit::kZeros:
          x = static_cast<float>(0.1 * z);
          break;
        case ParamInit::kNormal:
          x = static_cast<float>(0.3 * z);
          break;
      }
    }
  }
}

inline std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; i++) {
    t[i] = static_cast<int32_t>(detail::below(detail::hash3(seed, i, 0x746f6b), vocab));
  }
  return t;
}

// The value of a Result that the test expects to be ok.
template <typename T>
T must(Result<T> r) {
  if (!r.is_ok()) ADD_FAILURE() << r.status().to_string();
  return std::move(r).value();
}

// A GptModel for a configuration the test expects to be valid (a default one otherwise).
inline GptModel make_gpt(const GptConfig& c) {
  Result<std::unique_ptr<GptModel>> r = GptModel::create(c);
  if (!r.is_ok()) {
    ADD_FAILURE() << r.status().to_string();
    return std::move(*must(GptModel::create(GptConfig{})));
  }
  return std::move(*r.value());
}

// A tiny Llama for finite differences: grouped-query attention (4 query heads on 2 kv heads),
// head_dim 4, T < max_seq, a small rope_theta so that both RoPE frequencies turn visibly.
inline LlamaConfig micro_llama_config(bool tied, bool checkpointing = false) {
  LlamaConfig c;
  c.vocab_size = 37;
  c.max_seq = 12;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.intermediate_size = 24;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;
  c.tie_word_embeddings = tied;
  c.activation_checkpointing = checkpointing;
  return c;
}

// A LlamaModel for a configuration the test expects to be valid (a default one otherwise).
inline LlamaModel make_llama(const LlamaConfig& c) {
  Result<std::unique_ptr<LlamaModel>> r = LlamaModel::create(c);
  if (!r.is_ok()) {
    ADD_FAILURE() << r.status().to_string();
    return std::move(*must(LlamaModel::create(LlamaConfig{})));
  }
  return std::move(*r.value());
}

// Records every call as text and forwards to LocalParams; can fail the n-th call.
class RecordingAccess final : public ParamAccess {
 public:
  explicit RecordingAccess(LocalParams* inner) : inner_(inner) {}

  Status acquire(int m, Phase ph, std::span<const float*> v) override {
    ZINF_RETURN_IF_ERROR(maybe_fail());
    log.push_back(fmt::format("acquire {} {}", m, phase_name(ph)));
    held++;
    return inner_->acquire(m, ph, v);
  }
  Status release(int m, Phase ph) override {
    log.push_back(fmt::format("release {} {}", m, phase_name(ph)));
    held--;
    return inner_->release(m, ph);
  }
  Status grad_buffers(int m, std::span<float*> g) override {
    ZINF_RETURN_IF_ERROR(maybe_fail());
    log.push_back(fmt::format("grads {}", m));
    return inner_->grad_buffers(m, g);
  }
  Status grads_ready(int m) override {
    log.push_back(fmt::format("ready {}", m));
    return inner_->grads_ready(m);
  }

  std::vector<std::string> log;
  int held = 0;
  int fail_at = -1;  // index among acquire/grad_buffers calls

 private:
  Status maybe_fail() {
    if (calls_++ == fail_at) return Status::io_error("pread", "/nvme/p.swp", 4096, 512, EIO);
    return Status::ok();
  }
  LocalParams* inner_;
  int calls_ = 0;
};

// A fresh folder under $ZINF_TEST_TMPDIR (or /tmp), removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("ZINF_TEST_TMPDIR");
    std::filesystem::path root = base != nullptr ? base : "/tmp";
    std::filesystem::create_directories(root);
    std::string tmpl = (root / "zinf_model_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace zinf::model::testing
