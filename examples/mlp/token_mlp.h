// TokenMlp: a user-defined model for zinf, written against the public headers only. It predicts
// the next token from the current one: embedding, `layers` ReLU layers, a linear head and the
// mean cross-entropy. Plain loops, no BLAS: the point is the Model contract, not speed.
//
// Modules, in forward order: "embed" (E), "fc0" .. "fc{L-1}" (W, b each), "head" (W, b).
// Backward visits them in reverse. Each parameter is owned by the one module that lists it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <zinf/model/model.h>
#include <zinf/model/module_calls.h>
#include <zinf/status.h>

namespace example {

namespace zm = zinf::model;

struct TokenMlpConfig {
  int vocab = 256;   // V
  int embed = 32;    // C, the embedding width
  int hidden = 64;   // H, every hidden layer's width
  int layers = 2;    // L >= 1 hidden layers
  int max_seq = 64;  // longest row the model accepts (positions are independent)
};

class TokenMlp final : public zm::Model {
 public:
  static zinf::Result<std::unique_ptr<TokenMlp>> create(const TokenMlpConfig& c) {
    auto in_range = [](int v, int lo, int hi) { return v >= lo && v <= hi; };
    if (!in_range(c.vocab, 2, 1 << 20) || !in_range(c.embed, 1, 1 << 14) || !in_range(c.hidden, 1, 1 << 14) ||
        !in_range(c.layers, 1, 64) || !in_range(c.max_seq, 1, 1 << 20)) {
      return zinf::Status::invalid_argument(
          "TokenMlp: vocab in [2, 2^20], embed and hidden in [1, 2^14], layers in [1, 64], max_seq in [1, 2^20]");
    }
    return std::unique_ptr<TokenMlp>(new TokenMlp(c));
  }

  std::string_view type() const override { return "token_mlp"; }
  std::string describe() const override {
    return "token_mlp: vocab " + std::to_string(c_.vocab) + ", embed " + std::to_string(c_.embed) + ", " +
           std::to_string(c_.layers) + " x hidden " + std::to_string(c_.hidden);
  }
  std::string config_json() const override {
    return "{\"type\":\"token_mlp\",\"vocab\":" + std::to_string(c_.vocab) + ",\"embed\":" + std::to_string(c_.embed) +
           ",\"hidden\":" + std::to_string(c_.hidden) + ",\"layers\":" + std::to_string(c_.layers) +
           ",\"max_seq\":" + std::to_string(c_.max_seq) + "}";
  }
  std::span<const zm::ParamSpec> params() const override { return params_; }
  std::span<const zm::ModuleSpec> modules() const override { return modules_; }
  int vocab_size() const override { return c_.vocab; }
  int max_seq() const override { return c_.max_seq; }

  zinf::Result<float> forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                       int T, zm::ParamAccess& access, float loss_scale) override {
    ZINF_ASSIGN_OR_RETURN(float loss, forward(inputs, targets, B, T, access, zm::Phase::kForward));
    ZINF_RETURN_IF_ERROR(backward(inputs, targets, B * T, access, loss_scale));
    return loss;
  }
  zinf::Result<float> forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                   zm::ParamAccess& access) override {
    return forward(inputs, targets, B, T, access, zm::Phase::kEval);
  }

  zinf::Status reserve(int B, int T) override {
    if (B < 1 || T < 1 || T > c_.max_seq) return zinf::Status::invalid_argument("TokenMlp::reserve: bad B or T");
    const std::size_t n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    if (n <= rows_) return zinf::Status::ok();
    rows_ = n;
    x0_.assign(n * c_.embed, 0.0f);
    z_.assign(static_cast<std::size_t>(c_.layers), std::vector<float>(n * c_.hidden));
    h_.assign(static_cast<std::size_t>(c_.layers), std::vector<float>(n * c_.hidden));
    logits_.assign(n * c_.vocab, 0.0f);
    dh_.assign(n * std::max(c_.hidden, c_.embed), 0.0f);
    dprev_.assign(n * std::max(c_.hidden, c_.embed), 0.0f);
    return zinf::Status::ok();
  }
  uint64_t activation_bytes(int B, int T) const override {
    const uint64_t n = static_cast<uint64_t>(B) * static_cast<uint64_t>(T);
    return n * sizeof(float) *
           (c_.embed + 2ull * c_.layers * c_.hidden + c_.vocab + 2ull * std::max(c_.hidden, c_.embed));
  }

 private:
  explicit TokenMlp(const TokenMlpConfig& c) : c_(c) {
    auto add_module = [&](std::string name, bool backward_reads_values) {
      modules_.push_back(zm::ModuleSpec{std::move(name), {}, backward_reads_values});
    };
    auto add_param = [&](std::string name, std::vector<int64_t> shape, zm::ParamInit init, float std_dev) {
      zm::ParamSpec p;
      p.name = std::move(name);
      p.numel = 1;
      for (int64_t d : shape) p.numel *= static_cast<std::size_t>(d);
      p.shape = std::move(shape);
      p.index = static_cast<int>(params_.size());
      p.module = static_cast<int>(modules_.size()) - 1;
      p.init = init;
      p.init_std = std_dev;
      modules_.back().params.push_back(p.index);
      params_.push_back(std::move(p));
    };
    add_module("embed", /*backward_reads_values=*/false);  // backward only scatters into dE
    add_param("embed.weight", {c.vocab, c.embed}, zm::ParamInit::kNormal, 0.5f);
    for (int l = 0; l < c.layers; ++l) {
      const int in = l == 0 ? c.embed : c.hidden;
      add_module("fc" + std::to_string(l), true);
      add_param("fc" + std::to_string(l) + ".weight", {c.hidden, in}, zm::ParamInit::kNormal,
                std::sqrt(2.0f / static_cast<float>(in)));
      add_param("fc" + std::to_string(l) + ".bias", {c.hidden}, zm::ParamInit::kZeros, 0.0f);
    }
    add_module("head", true);
    add_param("head.weight", {c.vocab, c.hidden}, zm::ParamInit::kNormal, 1.0f / std::sqrt(float(c.hidden)));
    add_param("head.bias", {c.vocab}, zm::ParamInit::kZeros, 0.0f);
  }

  int head_module() const { return c_.layers + 1; }

  // y (n, out) = x (n, in) @ W^T (W is [out, in]) + b
  static void linear(float* y, const float* x, const float* W, const float* b, std::size_t n, int in, int out) {
    for (std::size_t r = 0; r < n; ++r) {
      for (int o = 0; o < out; ++o) {
        float acc = b[o];
        for (int i = 0; i < in; ++i) acc += x[r * in + i] * W[static_cast<std::size_t>(o) * in + i];
        y[r * out + o] = acc;
      }
    }
  }
  // dW += dy^T x, db += sum dy, dx = dy W (dx may be null).
  static void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x, const float* W,
                              std::size_t n, int in, int out) {
    for (std::size_t r = 0; r < n; ++r) {
      for (int o = 0; o < out; ++o) {
        const float g = dy[r * out + o];
        db[o] += g;
        for (int i = 0; i < in; ++i) dW[static_cast<std::size_t>(o) * in + i] += g * x[r * in + i];
      }
      if (dx == nullptr) continue;
      for (int i = 0; i < in; ++i) {
        float acc = 0.0f;
        for (int o = 0; o < out; ++o) acc += dy[r * out + o] * W[static_cast<std::size_t>(o) * in + i];
        dx[r * in + i] = acc;
      }
    }
  }

  zinf::Result<float> forward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                              zm::ParamAccess& access, zm::Phase phase) {
    ZINF_RETURN_IF_ERROR(zm::check_batch(*this, inputs, targets, B, T));
    ZINF_RETURN_IF_ERROR(reserve(B, T));
    const std::size_t n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const int C = c_.embed, H = c_.hidden, V = c_.vocab;
    ZINF_RETURN_IF_ERROR(zm::run_module_forward(access, modules_, 0, phase, [&](const float* const* v) {
      for (std::size_t r = 0; r < n; ++r) {
        std::copy_n(v[0] + static_cast<std::size_t>(inputs[r]) * C, C, x0_.data() + r * C);
      }
    }));
    for (int l = 0; l < c_.layers; ++l) {
      ZINF_RETURN_IF_ERROR(zm::run_module_forward(access, modules_, 1 + l, phase, [&](const float* const* v) {
        const float* x = l == 0 ? x0_.data() : h_[l - 1].data();
        linear(z_[l].data(), x, v[0], v[1], n, l == 0 ? C : H, H);
        for (std::size_t i = 0; i < n * H; ++i) h_[l][i] = std::max(0.0f, z_[l][i]);
      }));
    }
    ZINF_RETURN_IF_ERROR(zm::run_module_forward(access, modules_, head_module(), phase, [&](const float* const* v) {
      linear(logits_.data(), h_[c_.layers - 1].data(), v[0], v[1], n, H, V);
    }));
    // Softmax in place; the loss in a fixed order.
    double sum = 0.0;
    for (std::size_t r = 0; r < n; ++r) {
      float* row = logits_.data() + r * V;
      const float mx = *std::max_element(row, row + V);
      double z = 0.0;
      for (int k = 0; k < V; ++k) z += std::exp(static_cast<double>(row[k] - mx));
      for (int k = 0; k < V; ++k) row[k] = static_cast<float>(std::exp(static_cast<double>(row[k] - mx)) / z);
      sum += -std::log(std::max(static_cast<double>(row[targets[r]]), 1e-30));
    }
    return static_cast<float>(sum / static_cast<double>(n));
  }

  zinf::Status backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, std::size_t n,
                        zm::ParamAccess& access, float loss_scale) {
    const int C = c_.embed, H = c_.hidden, V = c_.vocab;
    // logits_ holds the probabilities; make it d(loss * scale)/dlogits.
    const float g = loss_scale / static_cast<float>(n);
    for (std::size_t r = 0; r < n; ++r) {
      float* row = logits_.data() + r * V;
      row[targets[r]] -= 1.0f;
      for (int k = 0; k < V; ++k) row[k] *= g;
    }
    ZINF_RETURN_IF_ERROR(
        zm::run_module_backward(access, modules_, head_module(), [&](const float* const* v, float* const* d) {
          linear_backward(dh_.data(), d[0], d[1], logits_.data(), h_[c_.layers - 1].data(), v[0], n, H, V);
        }));
    for (int l = c_.layers - 1; l >= 0; --l) {
      ZINF_RETURN_IF_ERROR(zm::run_module_backward(access, modules_, 1 + l, [&](const float* const* v, float* const* d) {
        for (std::size_t i = 0; i < n * H; ++i) dh_[i] = z_[l][i] > 0.0f ? dh_[i] : 0.0f;  // through the ReLU
        const float* x = l == 0 ? x0_.data() : h_[l - 1].data();
        linear_backward(dprev_.data(), d[0], d[1], dh_.data(), x, v[0], n, l == 0 ? C : H, H);
        std::swap(dh_, dprev_);  // dh_ now holds d(layer input)
      }));
    }
    return zm::run_module_backward(access, modules_, 0, [&](const float* const*, float* const* d) {
      for (std::size_t r = 0; r < n; ++r) {
        float* dE = d[0] + static_cast<std::size_t>(inputs[r]) * C;
        for (int i = 0; i < C; ++i) dE[i] += dh_[r * C + i];
      }
    });
  }

  TokenMlpConfig c_;
  std::vector<zm::ParamSpec> params_;
  std::vector<zm::ModuleSpec> modules_;
  std::size_t rows_ = 0;                        // B*T the activations hold
  std::vector<float> x0_;                       // (n, C) embeddings
  std::vector<std::vector<float>> z_, h_;       // per layer (n, H): before and after the ReLU
  std::vector<float> logits_;                   // (n, V): logits, probabilities, their gradient
  std::vector<float> dh_, dprev_;               // (n, max(H, C)) gradient scratch
};

}  // namespace example
