// GptModel: runs the GPT-2 forward and backward module by module through a ParamAccess.
#include "zinf/model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "model/bf16_weights.h"
#include "model/carver.h"
#include "model/fused_kernels.h"
#include "model/kernels.h"
#include "model/layout.h"
#include "zinf/model/module_calls.h"
#include "zinf/model/float_buffer.h"

namespace zinf::model {

namespace k = kernels;

// GptActivations of one block, (B,T,...) packed at the pass's B and T inside buffers sized for the
// capacity. Backward needs all of them; the block output lives in GptActivations::resid.
struct LayerActs {
  float* ln1;       // (B,T,C)
  float* ln1_mean;  // (B,T)
  float* ln1_rstd;  // (B,T)
  float* qkv;       // (B,T,3C)
  float* atty;      // (B,T,C) attention output before c_proj
  float* att_lse;   // (B,NH,T)
  float* res2;      // (B,T,C) residual stream after attention (c_proj output until ln_2 adds x)
  float* ln2;       // (B,T,C)
  float* ln2_mean;  // (B,T)
  float* ln2_rstd;  // (B,T)
  float* fch;       // (B,T,4C) c_fc output with its bias, before GELU
  float* fch_gelu;  // (B,T,4C)
  // bf16 copies of the four activations products read, forward and backward, written by their
  // producers (the norms, attention's pass, bias + GELU); nullptr unless the products are bf16.
  uint16_t* ln1_bf16;       // (B,T,C)
  uint16_t* atty_bf16;      // (B,T,C)
  uint16_t* ln2_bf16;       // (B,T,C)
  uint16_t* fch_gelu_bf16;  // (B,T,4C)
};

struct GptActivations {
  size_t cap_bt = 0;  // B*T the buffers hold
  bool bf16 = false;  // the bf16 copies are there (Matmul::reads_bf16_inputs)
  FloatBuffer storage;
  std::vector<LayerActs> layers;  // n_layer slots, or 1 with activation checkpointing
  // n_layer+1 of (B,T,C): block l reads resid[l] and writes its MLP output to resid[l+1]; the
  // next norm (ln_1 of block l+1, or ln_f) adds block l's res2 there in its pass (fused).
  std::vector<float*> resid;
  float* lnf;                     // (B,T,C)
  float* lnf_mean;                // (B,T)
  float* lnf_rstd;                // (B,T)
  uint16_t* lnf_bf16;             // (B,T,C) or nullptr, as LayerActs' copies
  float* logits;                  // (B,T,V): logits, then (training) their gradient
  float* losses;                  // (B,T)
  float* dres;                    // (B,T,C) gradient of the residual stream
  uint16_t* dres_bf16;            // (B,T,C) or nullptr: dres in bf16, from the norms' backward
  float* dsmall;                  // (B,T,C) scratch gradient
  float* dbig;                    // (B,T,4C) scratch gradient (also dqkv)
  uint16_t* dbig_bf16;            // (B,T,4C) or nullptr: d(c_fc output) in bf16 from GELU's backward,
                                  // then dqkv's (B,T,3C) from attention's backward
  float* att_scratch;             // attention_scratch_floats()
  // The weights' bf16 copies (bf16 products only): rounded at a weight's first product of a
  // pass, read again by its backward product.
  detail::Bf16Weights weights;
};

namespace {

using detail::Carver;

// The weight matrices the products read, as (module, position in its params): c_attn, attn's
// c_proj, c_fc, mlp's c_proj, and the tied head's wte.
std::vector<int> product_weights(const GptConfig& c, std::span<const ModuleSpec> modules) {
  std::vector<int> w;
  for (int l = 0; l < c.n_layer; l++) {
    for (int m : {module_attn(l), module_mlp(l)}) {
      w.push_back(modules[m].params[0]);
      w.push_back(modules[m].params[2]);
    }
  }
  w.push_back(modules[module_lm_head(c.n_layer)].params[0]);
  return w;
}

// Points every buffer of `a` into `base` for B*T = bt and returns the floats used; the bf16
// copies only when bf16.
size_t carve(const GptConfig& c, size_t bt, bool bf16, float* base, GptActivations* a) {
  const size_t C = c.n_embd;
  const size_t slots = c.activation_checkpointing ? 1 : c.n_layer;
  Carver cv(base);
  auto half = [&](size_t n) { return bf16 ? cv.take_bf16(n) : nullptr; };
  a->bf16 = bf16;
  a->layers.resize(slots);
  for (LayerActs& l : a->layers) {
    l = LayerActs{cv.take(bt * C),     cv.take(bt),         cv.take(bt),
                  cv.take(bt * 3 * C), cv.take(bt * C),     cv.take(bt * c.n_head),
                  cv.take(bt * C),     cv.take(bt * C),     cv.take(bt),
                  cv.take(bt),         cv.take(bt * 4 * C), cv.take(bt * 4 * C),
                  half(bt * C),        half(bt * C),        half(bt * C),
                  half(bt * 4 * C)};
  }
  a->resid.resize(c.n_layer + 1);
  for (float*& r : a->resid) r = cv.take(bt * C);
  a->lnf = cv.take(bt * C);
  a->lnf_mean = cv.take(bt);
  a->lnf_rstd = cv.take(bt);
  a->lnf_bf16 = half(bt * C);
  a->logits = cv.take(bt * c.vocab_size);
  a->losses = cv.take(bt);
  a->dres = cv.take(bt * C);
  a->dres_bf16 = half(bt * C);
  a->dsmall = cv.take(bt * C);
  a->dbig = cv.take(bt * 4 * C);
  a->dbig_bf16 = half(bt * 4 * C);
  a->att_scratch = cv.take(k::attention_scratch_floats());
  return cv.used();
}

}  // namespace

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kEval:
      return "eval";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kBackward:
      return "backward";
  }
  return "unknown";
}

Result<std::unique_ptr<GptModel>> GptModel::create(GptConfig config) {
  ZINF_RETURN_IF_ERROR(validate_config(config));
  return std::unique_ptr<GptModel>(new GptModel(config));
}

GptModel::GptModel(GptConfig config) : config_(config) { detail::build_layout(config_, &params_, &modules_); }

std::string GptModel::describe() const {
  return fmt::format("gpt: {} layers, hidden {}, {} heads, seq {}, vocab {}{}", config_.n_layer, config_.n_embd,
                     config_.n_head, config_.max_seq, config_.vocab_size,
                     config_.activation_checkpointing ? ", activation checkpointing" : "");
}

std::string GptModel::config_json() const { return gpt_config_json(config_); }

GptModel::GptModel(GptModel&&) noexcept = default;
GptModel& GptModel::operator=(GptModel&&) noexcept = default;
GptModel::~GptModel() = default;

Status GptModel::set_compute_precision(ComputePrecision precision) {
  ZINF_ASSIGN_OR_RETURN(const MatmulKind kind, resolve_matmul(precision));
  return matmul_.use(kind);
}

uint64_t GptModel::weight_copy_bytes() const {
  if (!matmul_.reads_bf16_inputs()) return 0;
  return std::min<uint64_t>(weight_copy_limit_, detail::Bf16Weights::bytes_for(params_, product_weights(config_, modules_)));
}

void GptModel::limit_weight_copies(uint64_t bytes) {
  weight_copy_limit_ = bytes;
  if (acts_) acts_->weights.limit_bytes(bytes);
}

uint64_t GptModel::activation_bytes(int B, int T) const {
  GptActivations counting;
  const bool bf16 = matmul_.reads_bf16_inputs();
  return carve(config_, static_cast<size_t>(B) * T, bf16, nullptr, &counting) * sizeof(float) + weight_copy_bytes();
}

Status GptModel::reserve(int B, int T) {
  if (B < 1 || T < 1 || T > config_.max_seq || static_cast<int64_t>(B) * T > INT_MAX / 4) {
    return Status::invalid_argument(fmt::format(
        "reserve: B ({}) and T ({}) must be >= 1, T <= max_seq ({})", B, T, config_.max_seq));
  }
  const size_t bt = static_cast<size_t>(B) * T;
  const bool bf16 = matmul_.reads_bf16_inputs();
  if (acts_ && bt <= acts_->cap_bt && acts_->bf16 == bf16) return Status::ok();
  auto a = std::make_unique<GptActivations>();
  a->cap_bt = acts_ ? std::max(bt, acts_->cap_bt) : bt;
  acts_.reset();  // free the old buffers before taking the new ones
  const size_t floats = carve(config_, a->cap_bt, bf16, nullptr, a.get());
  a->storage = FloatBuffer::allocate(floats);
  if (a->storage.data() == nullptr) {
    return Status::resource_exhausted(fmt::format(
        "model activations for B={} T={}: cannot allocate {} bytes", B, T, floats * sizeof(float)));
  }
  carve(config_, a->cap_bt, bf16, a->storage.data(), a.get());
  a->weights.configure(params_, bf16);
  a->weights.limit_bytes(weight_copy_limit_);
  acts_ = std::move(a);
  return Status::ok();
}

Result<float> GptModel::forward_backward(std::span<const int32_t> inputs,
                                         std::span<const int32_t> targets, int B, int T,
                                         ParamAccess& access, float loss_scale) {
  ZINF_RETURN_IF_ERROR(check_batch(*this, inputs, targets, B, T));
  ZINF_RETURN_IF_ERROR(reserve(B, T));
  // d(loss * loss_scale)/dlogits: the mean over N positions puts 1/N on every row. Forward writes
  // the logits' gradient in the pass that computes the loss.
  const float dloss = loss_scale / static_cast<float>(B * T);
  ZINF_ASSIGN_OR_RETURN(float loss,
                        forward_pass(inputs.data(), targets.data(), B, T, access, Phase::kForward, dloss));
  ZINF_RETURN_IF_ERROR(backward_pass(inputs.data(), B, T, access));
  return loss;
}

Result<float> GptModel::forward_loss(std::span<const int32_t> inputs,
                                     std::span<const int32_t> targets, int B, int T,
                                     ParamAccess& access) {
  ZINF_RETURN_IF_ERROR(check_batch(*this, inputs, targets, B, T));
  ZINF_RETURN_IF_ERROR(reserve(B, T));
  return forward_pass(inputs.data(), targets.data(), B, T, access, Phase::kEval, 0.0f);
}

Result<float> GptModel::forward_pass(const int32_t* inputs, const int32_t* targets, int B, int T,
                                     ParamAccess& access, Phase phase, float dloss) {
  GptActivations& a = *acts_;
  const int N = B * T;
  const int C = config_.n_embd;
  const int V = config_.vocab_size;
  const int L = config_.n_layer;
  a.weights.begin_pass();  // the values may have changed since the last pass
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, module_wte_wpe(), phase, [&](auto v) {
    k::encoder_forward(a.resid[0], inputs, v[0], v[1], B, T, C);
  }));
  // Every layer gets its own slot only when backward will read it without recomputing.
  const bool own_slots = phase == Phase::kForward && !config_.activation_checkpointing;
  auto slot = [&](int l) { return own_slots ? l : 0; };
  for (int l = 0; l < L; l++) {
    // resid[l] still lacks block l-1's attention residual; block l's ln_1 adds it.
    const float* pending = l > 0 ? a.layers[slot(l - 1)].res2 : nullptr;
    ZINF_RETURN_IF_ERROR(block_forward(l, slot(l), B, T, access, phase, pending));
  }
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, module_ln_f(L), phase, [&](auto v) {
    k::residual_layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.resid[L], a.layers[slot(L - 1)].res2, v[0],
                                  v[1], N, C, a.lnf_bf16);
  }));
  auto head_weight = [&](const float* wte) {
    return a.weights.get(modules_[module_lm_head(L)].params[0], wte, V, C);
  };
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, module_lm_head(L), phase, [&](auto v) {
    matmul_.forward(a.logits, {a.lnf, a.lnf_bf16}, head_weight(v[0]), nullptr, N, C, V);  // (B,T,V)
  }));
  if (phase == Phase::kForward) {
    k::softmax_xent_fused(a.logits, a.losses, targets, dloss, N, V);  // logits become dlogits
  } else {
    k::softmax_xent_loss(a.logits, a.losses, targets, N, V);
  }
  double sum = 0.0;  // fixed order
  for (int n = 0; n < N; n++) sum += a.losses[n];
  return static_cast<float>(sum / N);
}

// pending: block layer-1's res2 for ln_1 to add into resid[layer] (the first forward), or nullptr
// when resid[layer] is complete (recompute). Recompute (kRecompute) rebuilds the block's
// internals, not its output.
Status GptModel::block_forward(int layer, int slot, int B, int T, ParamAccess& access, Phase phase,
                               const float* pending) {
  GptActivations& a = *acts_;
  LayerActs& la = a.layers[slot];
  const int N = B * T;
  const int C = config_.n_embd;
  float* x = a.resid[layer];      // (B,T,C)
  float* y = a.resid[layer + 1];  // (B,T,C)
  const std::vector<int>& attn = modules_[module_attn(layer)].params;
  const std::vector<int>& mlp = modules_[module_mlp(layer)].params;
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, module_ln_1(layer), phase, [&](auto v) {
    k::residual_layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, x, pending, v[0], v[1], N, C, la.ln1_bf16);
  }));
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, module_attn(layer), phase, [&](auto v) {
    matmul_.forward(la.qkv, {la.ln1, la.ln1_bf16}, a.weights.get(attn[0], v[0], 3 * C, C), v[1], N, C, 3 * C);
    // with its bf16 copy, read by c_proj's forward and backward; bf16 block products where the
    // linear layers run bf16 ones (attention_products.h)
    k::attention_forward(la.atty, la.att_lse, la.qkv, a.att_scratch, B, T, C, config_.n_head, la.atty_bf16,
                         k::attention_products_for(matmul_.kind()));
    // the residual x: ln_2 adds it
    matmul_.forward(la.res2, {la.atty, la.atty_bf16}, a.weights.get(attn[2], v[2], C, C), v[3], N, C, C);
  }));
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, module_ln_2(layer), phase, [&](auto v) {
    k::residual_layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, x, v[0], v[1], N, C, la.ln2_bf16);
  }));
  return run_module_forward(access, modules_, module_mlp(layer), phase, [&](auto v) {
    matmul_.forward(la.fch, {la.ln2, la.ln2_bf16}, a.weights.get(mlp[0], v[0], 4 * C, C), nullptr, N, C, 4 * C);
    k::bias_gelu_forward(la.fch, la.fch_gelu, v[1], N, 4 * C, la.fch_gelu_bf16);
    if (phase != Phase::kRecompute) {  // the residual res2: the next norm adds it
      matmul_.forward(y, {la.fch_gelu, la.fch_gelu_bf16}, a.weights.get(mlp[2], v[2], C, 4 * C), v[3], N, 4 * C, C);
    }
  });
}

// On entry logits holds d(loss * loss_scale)/dlogits (forward_pass with Phase::kForward).
Status GptModel::backward_pass(const int32_t* inputs, int B, int T, ParamAccess& access) {
  GptActivations& a = *acts_;
  const int N = B * T;
  const int C = config_.n_embd;
  const int V = config_.vocab_size;
  const int L = config_.n_layer;
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, module_lm_head(L), [&](auto v, auto g) {
    const MatmulInput wte = a.weights.get(modules_[module_lm_head(L)].params[0], v[0], V, C);
    matmul_.backward(a.dsmall, g[0], nullptr, a.logits, {a.lnf, a.lnf_bf16}, wte, N, C, V);
  }));
  std::memset(a.dres, 0, sizeof(float) * static_cast<size_t>(N) * C);
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, module_ln_f(L), [&](auto v, auto g) {
    k::layernorm_backward(a.dres, g[0], g[1], a.dsmall, a.resid[L], v[0], a.lnf_mean, a.lnf_rstd, N, C,
                          a.dres_bf16);
  }));
  const bool ckpt = config_.activation_checkpointing;
  for (int l = L - 1; l >= 0; l--) {
    // With checkpointing the single slot still holds the last block from forward.
    if (ckpt && l != L - 1) {
      ZINF_RETURN_IF_ERROR(block_forward(l, 0, B, T, access, Phase::kRecompute, nullptr));
    }
    ZINF_RETURN_IF_ERROR(block_backward(l, ckpt ? 0 : l, B, T, access));
  }
  return run_module_backward(access, modules_, module_wte_wpe(), [&](auto, auto g) {
    k::encoder_backward(g[0], g[1], a.dres, inputs, B, T, C);
  });
}

// On entry dres holds d(block output); on exit d(block input).
Status GptModel::block_backward(int layer, int slot, int B, int T, ParamAccess& access) {
  GptActivations& a = *acts_;
  const LayerActs& la = a.layers[slot];
  const int N = B * T;
  const int C = config_.n_embd;
  const std::vector<int>& attn = modules_[module_attn(layer)].params;
  const std::vector<int>& mlp = modules_[module_mlp(layer)].params;
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, module_mlp(layer), [&](auto v, auto g) {
    float* dfch = a.dbig;  // (B,T,4C)
    matmul_.backward(dfch, g[2], g[3], {a.dres, a.dres_bf16}, {la.fch_gelu, la.fch_gelu_bf16}, a.weights.get(mlp[2], v[2], C, 4 * C),
                     N, 4 * C, C);
    // c_fc's bias gradient, and d(pre)'s bf16 copy where the products are bf16, in the same pass
    k::gelu_backward_bias_grad(dfch, g[1], la.fch, N, 4 * C, a.dbig_bf16);
    matmul_.backward(a.dsmall, g[0], nullptr, {dfch, a.dbig_bf16}, {la.ln2, la.ln2_bf16},
                     a.weights.get(mlp[0], v[0], 4 * C, C), N, C, 4 * C);
  }));
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, module_ln_2(layer), [&](auto v, auto g) {
    k::layernorm_backward(a.dres, g[0], g[1], a.dsmall, la.res2, v[0], la.ln2_mean, la.ln2_rstd, N, C,
                          a.dres_bf16);
  }));
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, module_attn(layer), [&](auto v, auto g) {
    float* datty = a.dsmall;  // (B,T,C)
    float* dqkv = a.dbig;     // (B,T,3C)
    matmul_.backward(datty, g[2], g[3], {a.dres, a.dres_bf16}, {la.atty, la.atty_bf16}, a.weights.get(attn[2], v[2], C, C), N, C,
                     C);
    k::attention_backward(dqkv, datty, la.qkv, la.atty, la.att_lse, a.att_scratch, B, T, C, config_.n_head,
                          a.dbig_bf16, k::attention_products_for(matmul_.kind()));
    matmul_.backward(a.dsmall, g[0], g[1], {dqkv, a.dbig_bf16}, {la.ln1, la.ln1_bf16}, a.weights.get(attn[0], v[0], 3 * C, C), N,
                     C, 3 * C);
  }));
  return run_module_backward(access, modules_, module_ln_1(layer), [&](auto v, auto g) {
    // d(block input): the previous block's MLP backward reads it (the embedding's reads fp32 only)
    k::layernorm_backward(a.dres, g[0], g[1], a.dsmall, a.resid[layer], v[0], la.ln1_mean, la.ln1_rstd, N, C,
                          layer > 0 ? a.dres_bf16 : nullptr);
  });
}

}  // namespace zinf::model
