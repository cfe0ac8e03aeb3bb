// LlamaModel: runs the Llama forward and backward module by module through a ParamAccess.
#include "zinf/model/llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "model/bf16_weights.h"
#include "model/carver.h"
#include "model/fused_kernels.h"
#include "model/kernels.h"
#include "model/layout.h"
#include "model/llama_kernels.h"
#include "zinf/model/float_buffer.h"
#include "zinf/model/module_calls.h"

namespace zinf::model {

namespace k = kernels;

// Activations of one block, (B,T,...) packed at the pass's B and T; KV = n_kv_head * head_dim,
// I = intermediate_size. Backward needs all of them; the block output lives in resid.
struct LlamaLayerActs {
  float* xn1;    // (B,T,C) input_layernorm output
  float* rstd1;  // (B,T)
  float* q;      // (B,T,Q) after RoPE (and q_norm)
  float* k;      // (B,T,KV) after RoPE (and k_norm)
  float* v;      // (B,T,KV)
  float* qraw;   // (B,T,Q) q_proj output before q_norm (qk_norm only, else nullptr)
  float* kraw;   // (B,T,KV) k_proj output before k_norm (qk_norm only)
  float* rstdq;  // (B,T,NH) q_norm's rstd per head (qk_norm only)
  float* rstdk;  // (B,T,NKV) k_norm's rstd per head (qk_norm only)
  float* atty;   // (B,T,Q) attention output before o_proj
  float* lse;    // (B,NH,T)
  float* res2;   // (B,T,C) residual stream after attention (o_proj output until norm 2 adds x)
  float* xn2;    // (B,T,C) post_attention_layernorm output
  float* rstd2;  // (B,T)
  float* gate;   // (B,T,I)
  float* up;     // (B,T,I)
  float* act;    // (B,T,I) silu(gate) * up
  // bf16 copies of the activations products read, forward and backward, written by their
  // producers (the norms, attention's tasks, SwiGLU); nullptr unless the products are bf16.
  uint16_t* xn1_bf16;   // (B,T,C)
  uint16_t* atty_bf16;  // (B,T,C)
  uint16_t* xn2_bf16;   // (B,T,C)
  uint16_t* act_bf16;   // (B,T,I)
};

struct LlamaActivations {
  size_t cap_bt = 0;  // B*T the buffers hold
  size_t cap_t = 0;   // T the RoPE tables hold
  bool bf16 = false;  // the bf16 copies are there (Matmul::reads_bf16_inputs)
  FloatBuffer storage;
  std::vector<LlamaLayerActs> layers;  // n_layer slots, or 1 with activation checkpointing
  // n_layer+1 of (B,T,C): block l reads resid[l] and writes its MLP output to resid[l+1]; the
  // next norm (input_layernorm of block l+1, or model.norm) adds block l's res2 there (fused).
  std::vector<float*> resid;
  float* xnf;                          // (B,T,C) model.norm output
  float* rstdf;                        // (B,T)
  uint16_t* xnf_bf16;                  // (B,T,C) or nullptr, as the layers' copies
  float* logits;                       // (B,T,V): logits, then (training) their gradient
  float* losses;                       // (B,T)
  float* dres;                         // (B,T,C) gradient of the residual stream
  uint16_t* dres_bf16;                 // (B,T,C) or nullptr: dres in bf16, from the norms' backward
  // The q, k and v products' output gradients in bf16 ((B,T,Q), (B,T,KV), (B,T,KV)), or nullptr:
  // from RoPE's backward (or the q/k norms' with qk_norm) and attention's backward.
  uint16_t* dq_bf16;
  uint16_t* dk_bf16;
  uint16_t* dv_bf16;
  float* dx;                           // (B,T,max(C,Q)) scratch gradient: a norm output's first part, or d(atty)
  float* dx2;                          // (B,T,C) scratch gradient: its second part
  float* dbig;                         // (B,T,max(max(Q,C)+2KV, 2I)): dq|dk|dv (then v's part, C wide, over dq), or dact|dup
  float* dqk_raw;                      // (B,T,Q+KV): d(q_proj), d(k_proj) output before the q/k norms (qk_norm only)
  float* att_scratch;                  // gqa_attention_scratch_floats()
  float* rope_cos;                     // (T, head_dim/2)
  float* rope_sin;                     // (T, head_dim/2)
  // The weights' bf16 copies (bf16 products only): rounded at a weight's first product of a
  // pass, read again by its backward product.
  detail::Bf16Weights weights;
};

namespace {

using Dims = detail::LlamaDims;

// Where each self_attn parameter sits in its module's list (build_llama_layout's order); -1
// when the configuration has none.
struct AttnIndex {
  int q = -1, qb = -1, k = -1, kb = -1, v = -1, vb = -1, o = -1, ob = -1, qn = -1, kn = -1;
  explicit AttnIndex(const LlamaConfig& c) {
    int i = 0;
    for (auto [w, b] : {std::pair{&q, &qb}, std::pair{&k, &kb}, std::pair{&v, &vb}}) {
      *w = i++;
      if (c.qkv_bias) *b = i++;
    }
    o = i++;
    if (c.o_bias) ob = i++;
    if (c.qk_norm) {
      qn = i++;
      kn = i++;
    }
  }
};

// v[i], or nullptr for an absent parameter (i < 0).
template <typename Ptrs>
auto param_or_null(const Ptrs& v, int i) -> std::remove_cvref_t<decltype(v[0])> {
  return i >= 0 ? v[i] : nullptr;
}

// Points every buffer of `a` into `base` for (bt, t) and returns the floats used; the bf16 copies
// only when bf16.
size_t carve(const LlamaConfig& c, size_t bt, size_t t, bool bf16, float* base, LlamaActivations* a) {
  const Dims d(c);
  const size_t C = d.C, Q = d.Q, KV = d.KV, I = d.I;
  detail::Carver cv(base);
  auto half = [&](size_t n) { return bf16 ? cv.take_bf16(n) : nullptr; };
  a->bf16 = bf16;
  a->layers.resize(c.activation_checkpointing ? 1 : c.n_layer);
  for (LlamaLayerActs& l : a->layers) {
    l.xn1 = cv.take(bt * C);
    l.rstd1 = cv.take(bt);
    l.q = cv.take(bt * Q);
    l.k = cv.take(bt * KV);
    l.v = cv.take(bt * KV);
    l.qraw = c.qk_norm ? cv.take(bt * Q) : nullptr;
    l.kraw = c.qk_norm ? cv.take(bt * KV) : nullptr;
    l.rstdq = c.qk_norm ? cv.take(bt * d.NH) : nullptr;
    l.rstdk = c.qk_norm ? cv.take(bt * d.NKV) : nullptr;
    l.atty = cv.take(bt * Q);
    l.lse = cv.take(bt * d.NH);
    l.res2 = cv.take(bt * C);
    l.xn2 = cv.take(bt * C);
    l.rstd2 = cv.take(bt);
    l.gate = cv.take(bt * I);
    l.up = cv.take(bt * I);
    l.act = cv.take(bt * I);
    l.xn1_bf16 = half(bt * C);
    l.atty_bf16 = half(bt * Q);
    l.xn2_bf16 = half(bt * C);
    l.act_bf16 = half(bt * I);
  }
  a->resid.resize(c.n_layer + 1);
  for (float*& r : a->resid) r = cv.take(bt * C);
  a->xnf = cv.take(bt * C);
  a->rstdf = cv.take(bt);
  a->xnf_bf16 = half(bt * C);
  a->logits = cv.take(bt * d.V);
  a->losses = cv.take(bt);
  a->dres = cv.take(bt * C);
  a->dres_bf16 = half(bt * C);
  a->dq_bf16 = half(bt * Q);
  a->dk_bf16 = half(bt * KV);
  a->dv_bf16 = half(bt * KV);
  a->dx = cv.take(bt * std::max(C, Q));
  a->dx2 = cv.take(bt * C);
  a->dbig = cv.take(bt * std::max(std::max(Q, C) + 2 * KV, 2 * I));
  a->dqk_raw = c.qk_norm ? cv.take(bt * (Q + KV)) : nullptr;
  a->att_scratch = cv.take(k::gqa_attention_scratch_floats());
  a->rope_cos = cv.take(t * (d.hd / 2));
  a->rope_sin = cv.take(t * (d.hd / 2));
  return cv.used();
}

float mean_loss(const float* losses, int N) {
  double sum = 0.0;  // fixed order
  for (int n = 0; n < N; n++) sum += losses[n];
  return static_cast<float>(sum / N);
}

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::create(LlamaConfig config) {
  ZINF_RETURN_IF_ERROR(validate_llama_config(config));
  return std::unique_ptr<LlamaModel>(new LlamaModel(config));
}

LlamaModel::LlamaModel(LlamaConfig config) : config_(config) {
  detail::build_llama_layout(config_, &params_, &modules_);
}

LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;
LlamaModel::~LlamaModel() = default;

Status LlamaModel::set_compute_precision(ComputePrecision precision) {
  ZINF_ASSIGN_OR_RETURN(const MatmulKind kind, resolve_matmul(precision));
  return matmul_.use(kind);
}

std::string LlamaModel::describe() const {
  const LlamaConfig& c = config_;
  std::string extras;
  if (c.head_dim > 0 && c.head_dim * c.n_head != c.n_embd) extras += fmt::format(", head_dim {}", c.head_dim);
  if (c.qkv_bias) extras += ", q/k/v biases";
  if (c.o_bias) extras += ", o_proj bias";
  if (c.qk_norm) extras += ", q/k norms";
  if (c.rope_scaling.type != RopeType::kDefault) {
    extras += fmt::format(", RoPE {} x{}", rope_type_name(c.rope_scaling.type), c.rope_scaling.factor);
  }
  if (c.sliding_window > 0) extras += fmt::format(", sliding window {}", c.sliding_window);
  return fmt::format("{}: {} layers, hidden {}, {} heads ({} kv), intermediate {}, max positions {}, vocab {}, {} head{}{}",
                     llama_family_name(c.family), c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.intermediate_size, c.max_seq,
                     c.vocab_size, c.tie_word_embeddings ? "tied" : "untied", extras,
                     c.activation_checkpointing ? ", activation checkpointing" : "");
}

uint64_t LlamaModel::weight_copy_bytes() const {
  if (!matmul_.reads_bf16_inputs()) return 0;
  // The weight matrices the products read, whose bf16 copies a bf16 run keeps (bf16_weights.h):
  // q, k, v, o, gate, up, down of every layer and the head (the tied embedding or lm_head).
  std::vector<int> matrices;
  const AttnIndex ix(config_);
  for (int l = 0; l < config_.n_layer; l++) {
    for (int k : {ix.q, ix.k, ix.v, ix.o}) matrices.push_back(modules_[block_module(l, 1)].params[k]);
    for (int k : {0, 1, 2}) matrices.push_back(modules_[block_module(l, 3)].params[k]);
  }
  matrices.push_back(modules_[head_module()].params[0]);
  return std::min<uint64_t>(weight_copy_limit_, detail::Bf16Weights::bytes_for(params_, matrices));
}

void LlamaModel::limit_weight_copies(uint64_t bytes) {
  weight_copy_limit_ = bytes;
  if (acts_) acts_->weights.limit_bytes(bytes);
}

uint64_t LlamaModel::activation_bytes(int B, int T) const {
  LlamaActivations counting;
  const bool bf16 = matmul_.reads_bf16_inputs();
  return carve(config_, static_cast<size_t>(B) * T, T, bf16, nullptr, &counting) * sizeof(float) + weight_copy_bytes();
}

Status LlamaModel::reserve(int B, int T) {
  if (B < 1 || T < 1 || T > config_.max_seq || static_cast<int64_t>(B) * T > INT_MAX / 4) {
    return Status::invalid_argument(
        fmt::format("reserve: B ({}) and T ({}) must be >= 1, T <= max_seq ({})", B, T, config_.max_seq));
  }
  if (config_.sliding_window > 0 && T > config_.sliding_window) {
    // Positions further apart than the window would see each other in zinf's fully causal
    // attention but not in the model's: refuse rather than compute another model.
    return Status::invalid_argument(fmt::format(
        "sequence length T ({}) is above the model's sliding_window ({}); zinf's attention is fully causal, so it "
        "trains windows of at most {} tokens (--seq)",
        T, config_.sliding_window, config_.sliding_window));
  }
  const size_t bt = static_cast<size_t>(B) * T;
  const bool bf16 = matmul_.reads_bf16_inputs();
  if (acts_ && bt <= acts_->cap_bt && static_cast<size_t>(T) <= acts_->cap_t && acts_->bf16 == bf16) {
    return Status::ok();
  }
  auto a = std::make_unique<LlamaActivations>();
  a->cap_bt = acts_ ? std::max(bt, acts_->cap_bt) : bt;
  a->cap_t = acts_ ? std::max<size_t>(T, acts_->cap_t) : T;
  acts_.reset();  // free the old buffers before taking the new ones
  const size_t floats = carve(config_, a->cap_bt, a->cap_t, bf16, nullptr, a.get());
  a->storage = FloatBuffer::allocate(floats);
  if (a->storage.data() == nullptr) {
    return Status::resource_exhausted(
        fmt::format("model activations for B={} T={}: cannot allocate {} bytes", B, T, floats * sizeof(float)));
  }
  carve(config_, a->cap_bt, a->cap_t, bf16, a->storage.data(), a.get());
  a->weights.configure(params_, bf16);
  a->weights.limit_bytes(weight_copy_limit_);
  const RopeFrequencies rope = rope_frequencies(config_, static_cast<int>(a->cap_t));
  k::rope_tables(a->rope_cos, a->rope_sin, static_cast<int>(a->cap_t), rope.inv_freq, rope.attention_factor);
  acts_ = std::move(a);
  return Status::ok();
}

Result<float> LlamaModel::forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                           int T, ParamAccess& access, float loss_scale) {
  ZINF_RETURN_IF_ERROR(check_batch(*this, inputs, targets, B, T));
  ZINF_RETURN_IF_ERROR(reserve(B, T));
  ZINF_RETURN_IF_ERROR(forward_to_logits(inputs.data(), B, T, access, Phase::kForward));
  // The loss and d(loss * loss_scale)/dlogits in one pass (the mean puts 1/N on every row).
  const int N = B * T;
  k::softmax_xent_fused(acts_->logits, acts_->losses, targets.data(), loss_scale / static_cast<float>(N), N,
                        config_.vocab_size);
  const float loss = mean_loss(acts_->losses, N);
  ZINF_RETURN_IF_ERROR(backward_pass(inputs.data(), B, T, access));
  return loss;
}

Result<float> LlamaModel::forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                       int T, ParamAccess& access) {
  ZINF_RETURN_IF_ERROR(check_batch(*this, inputs, targets, B, T));
  ZINF_RETURN_IF_ERROR(reserve(B, T));
  ZINF_RETURN_IF_ERROR(forward_to_logits(inputs.data(), B, T, access, Phase::kEval));
  k::softmax_xent_loss(acts_->logits, acts_->losses, targets.data(), B * T, config_.vocab_size);
  return mean_loss(acts_->losses, B * T);
}

Status LlamaModel::forward_logits(std::span<const int32_t> inputs, int B, int T, ParamAccess& access,
                                  std::span<float> logits) {
  ZINF_RETURN_IF_ERROR(check_batch(*this, inputs, inputs, B, T));  // no targets: the inputs stand in
  const size_t n = static_cast<size_t>(B) * T * config_.vocab_size;
  if (logits.size() != n) {
    return Status::invalid_argument(
        fmt::format("forward_logits: the output holds {} floats, (B, T, vocab_size) is {}", logits.size(), n));
  }
  ZINF_RETURN_IF_ERROR(reserve(B, T));
  ZINF_RETURN_IF_ERROR(forward_to_logits(inputs.data(), B, T, access, Phase::kEval));
  std::memcpy(logits.data(), acts_->logits, n * sizeof(float));
  return Status::ok();
}

Status LlamaModel::forward_to_logits(const int32_t* inputs, int B, int T, ParamAccess& access, Phase phase) {
  LlamaActivations& a = *acts_;
  const Dims d(config_);
  const int N = B * T;
  a.weights.begin_pass();  // the values may have changed since the last pass
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, embed_module(), phase, [&](auto v) {
    k::embedding_forward(a.resid[0], inputs, v[0], N, d.C);
  }));
  // Every layer gets its own slot only when backward will read it without recomputing.
  const bool own_slots = phase == Phase::kForward && !config_.activation_checkpointing;
  auto slot = [&](int l) { return own_slots ? l : 0; };
  for (int l = 0; l < d.L; l++) {
    // resid[l] still lacks block l-1's attention residual; block l's input_layernorm adds it.
    const float* pending = l > 0 ? a.layers[slot(l - 1)].res2 : nullptr;
    ZINF_RETURN_IF_ERROR(block_forward(l, slot(l), B, T, access, phase, pending));
  }
  const float eps = static_cast<float>(config_.rms_norm_eps);
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, norm_module(), phase, [&](auto v) {
    k::residual_rmsnorm_forward(a.xnf, a.rstdf, a.resid[d.L], a.layers[slot(d.L - 1)].res2, v[0], eps, N, d.C,
                                a.xnf_bf16);
  }));
  return run_module_forward(access, modules_, head_module(), phase, [&](auto v) {
    const MatmulInput head = a.weights.get(modules_[head_module()].params[0], v[0], d.V, d.C);
    matmul_.forward(a.logits, {a.xnf, a.xnf_bf16}, head, nullptr, N, d.C, d.V);  // (B,T,V)
  });
}

// pending: block layer-1's res2 for input_layernorm to add into resid[layer] (the first forward),
// or nullptr when resid[layer] is complete (recompute). Recompute (kRecompute) rebuilds the
// block's internals, not its output.
Status LlamaModel::block_forward(int layer, int slot, int B, int T, ParamAccess& access, Phase phase,
                                 const float* pending) {
  LlamaActivations& a = *acts_;
  LlamaLayerActs& la = a.layers[slot];
  const Dims d(config_);
  const int N = B * T;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  float* x = a.resid[layer];      // (B,T,C)
  float* y = a.resid[layer + 1];  // (B,T,C)
  const std::vector<int>& attn = modules_[block_module(layer, 1)].params;
  const std::vector<int>& mlp = modules_[block_module(layer, 3)].params;
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, block_module(layer, 0), phase, [&](auto v) {
    k::residual_rmsnorm_forward(la.xn1, la.rstd1, x, pending, v[0], eps, N, d.C, la.xn1_bf16);
  }));
  const AttnIndex ix(config_);
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, block_module(layer, 1), phase, [&](auto v) {
    const bool norms = config_.qk_norm;
    const MatmulInput xn1{la.xn1, la.xn1_bf16};
    const MatmulInput wq = a.weights.get(attn[ix.q], v[ix.q], d.Q, d.C);
    const MatmulInput wk = a.weights.get(attn[ix.k], v[ix.k], d.KV, d.C);
    const MatmulInput wv = a.weights.get(attn[ix.v], v[ix.v], d.KV, d.C);
    matmul_.forward(norms ? la.qraw : la.q, xn1, wq, param_or_null(v, ix.qb), N, d.C, d.Q);
    matmul_.forward(norms ? la.kraw : la.k, xn1, wk, param_or_null(v, ix.kb), N, d.C, d.KV);
    matmul_.forward(la.v, xn1, wv, param_or_null(v, ix.vb), N, d.C, d.KV);
    if (norms) {  // Qwen3: RMSNorm over each head (rows of head_dim), before RoPE
      k::rmsnorm_forward(la.q, la.rstdq, la.qraw, v[ix.qn], eps, N * d.NH, d.hd);
      k::rmsnorm_forward(la.k, la.rstdk, la.kraw, v[ix.kn], eps, N * d.NKV, d.hd);
    }
    k::rope_forward(la.q, a.rope_cos, a.rope_sin, B, T, d.NH, d.hd);
    k::rope_forward(la.k, a.rope_cos, a.rope_sin, B, T, d.NKV, d.hd);
    // with its bf16 copy, read by o_proj's forward and backward; bf16 block products where the
    // linear layers run bf16 ones (attention_products.h)
    k::gqa_attention_forward(la.atty, la.lse, la.q, la.k, la.v, a.att_scratch, k::GqaShape{B, T, d.NH, d.NKV, d.hd},
                             la.atty_bf16, k::attention_products_for(matmul_.kind()));
    // the residual x: norm 2 adds it
    matmul_.forward(la.res2, {la.atty, la.atty_bf16}, a.weights.get(attn[ix.o], v[ix.o], d.C, d.Q),
                    param_or_null(v, ix.ob), N, d.Q, d.C);
  }));
  ZINF_RETURN_IF_ERROR(run_module_forward(access, modules_, block_module(layer, 2), phase, [&](auto v) {
    k::residual_rmsnorm_forward(la.xn2, la.rstd2, la.res2, x, v[0], eps, N, d.C, la.xn2_bf16);
  }));
  return run_module_forward(access, modules_, block_module(layer, 3), phase, [&](auto v) {
    matmul_.forward(la.gate, {la.xn2, la.xn2_bf16}, a.weights.get(mlp[0], v[0], d.I, d.C), nullptr, N, d.C, d.I);
    matmul_.forward(la.up, {la.xn2, la.xn2_bf16}, a.weights.get(mlp[1], v[1], d.I, d.C), nullptr, N, d.C, d.I);
    // with its bf16 copy, read by down_proj's forward and backward
    k::swiglu_forward(la.act, la.gate, la.up, static_cast<size_t>(N) * d.I, la.act_bf16);
    if (phase != Phase::kRecompute) {  // the residual res2: the next norm adds it
      matmul_.forward(y, {la.act, la.act_bf16}, a.weights.get(mlp[2], v[2], d.C, d.I), nullptr, N, d.I, d.C);
    }
  });
}

// On entry logits holds d(loss * loss_scale)/dlogits (softmax_xent_fused in forward_backward).
Status LlamaModel::backward_pass(const int32_t* inputs, int B, int T, ParamAccess& access) {
  LlamaActivations& a = *acts_;
  const Dims d(config_);
  const int N = B * T;
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, head_module(), [&](auto v, auto g) {
    const MatmulInput head = a.weights.get(modules_[head_module()].params[0], v[0], d.V, d.C);
    matmul_.backward(a.dx, g[0], nullptr, a.logits, {a.xnf, a.xnf_bf16}, head, N, d.C, d.V);
  }));
  std::memset(a.dres, 0, sizeof(float) * static_cast<size_t>(N) * d.C);
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, norm_module(), [&](auto v, auto g) {
    k::rmsnorm_backward(a.dres, g[0], a.dx, a.resid[d.L], v[0], a.rstdf, N, d.C, a.dres_bf16);
  }));
  const bool ckpt = config_.activation_checkpointing;
  for (int l = d.L - 1; l >= 0; l--) {
    // With checkpointing the single slot still holds the last block from forward.
    if (ckpt && l != d.L - 1) {
      ZINF_RETURN_IF_ERROR(block_forward(l, 0, B, T, access, Phase::kRecompute, nullptr));
    }
    ZINF_RETURN_IF_ERROR(block_backward(l, ckpt ? 0 : l, B, T, access));
  }
  return run_module_backward(access, modules_, embed_module(), [&](auto, auto g) {
    k::embedding_backward(g[0], a.dres, inputs, static_cast<size_t>(N), d.C);
  });
}

// On entry dres holds d(block output); on exit d(block input).
Status LlamaModel::block_backward(int layer, int slot, int B, int T, ParamAccess& access) {
  LlamaActivations& a = *acts_;
  const LlamaLayerActs& la = a.layers[slot];
  const Dims d(config_);
  const int N = B * T;
  const size_t NI = static_cast<size_t>(N) * d.I;
  const std::vector<int>& attn = modules_[block_module(layer, 1)].params;
  const std::vector<int>& mlp = modules_[block_module(layer, 3)].params;
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, block_module(layer, 3), [&](auto v, auto g) {
    float* dact = a.dbig;     // (B,T,I), then dgate
    float* dup = a.dbig + NI;  // (B,T,I)
    matmul_.backward(dact, g[2], nullptr, {a.dres, a.dres_bf16}, {la.act, la.act_bf16}, a.weights.get(mlp[2], v[2], d.C, d.I), N,
                     d.I, d.C);
    k::swiglu_backward(dact, dup, dact, la.gate, la.up, NI);
    // d(xn2) in two parts, gate's and up's; norm 2's backward sums them in its one pass.
    matmul_.backward(a.dx, g[0], nullptr, dact, {la.xn2, la.xn2_bf16}, a.weights.get(mlp[0], v[0], d.I, d.C), N, d.C,
                     d.I);
    matmul_.backward(a.dx2, g[1], nullptr, dup, {la.xn2, la.xn2_bf16}, a.weights.get(mlp[1], v[1], d.I, d.C), N, d.C,
                     d.I);
  }));
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, block_module(layer, 2), [&](auto v, auto g) {
    k::summed_rmsnorm_backward(a.dres, g[0], a.dx, a.dx2, nullptr, la.res2, v[0], la.rstd2, N, d.C, a.dres_bf16);
  }));
  const AttnIndex ix(config_);
  ZINF_RETURN_IF_ERROR(run_module_backward(access, modules_, block_module(layer, 1), [&](auto v, auto g) {
    const size_t NQ = static_cast<size_t>(N) * d.Q;
    float* datty = a.dx;                                  // (B,T,Q)
    float* dq = a.dbig;                                   // (B,T,Q), in a slot of (B,T,max(Q,C))
    float* dk = dq + static_cast<size_t>(N) * std::max(d.Q, d.C);  // (B,T,KV)
    float* dv = dk + static_cast<size_t>(N) * d.KV;       // (B,T,KV)
    matmul_.backward(datty, g[ix.o], param_or_null(g, ix.ob), {a.dres, a.dres_bf16}, {la.atty, la.atty_bf16},
                     a.weights.get(attn[ix.o], v[ix.o], d.C, d.Q), N, d.Q, d.C);
    k::gqa_attention_backward(dq, dk, dv, datty, la.q, la.k, la.v, la.atty, la.lse, a.att_scratch,
                              k::GqaShape{B, T, d.NH, d.NKV, d.hd}, a.dv_bf16,
                              k::attention_products_for(matmul_.kind()));
    // The products read RoPE's output gradients, or with q/k norms those norms' input gradients:
    // whichever runs last writes the bf16 copies.
    const bool norms = config_.qk_norm;
    k::rope_backward(dq, a.rope_cos, a.rope_sin, B, T, d.NH, d.hd, norms ? nullptr : a.dq_bf16);
    k::rope_backward(dk, a.rope_cos, a.rope_sin, B, T, d.NKV, d.hd, norms ? nullptr : a.dk_bf16);
    // The products' output gradients: dq and dk, or with q/k norms their inputs' gradients.
    float* dq_out = dq;
    float* dk_out = dk;
    if (config_.qk_norm) {
      dq_out = a.dqk_raw;   // (B,T,Q)
      dk_out = dq_out + NQ;  // (B,T,KV)
      std::memset(dq_out, 0, sizeof(float) * (NQ + static_cast<size_t>(N) * d.KV));
      k::rmsnorm_backward(dq_out, g[ix.qn], dq, la.qraw, v[ix.qn], la.rstdq, N * d.NH, d.hd, a.dq_bf16);
      k::rmsnorm_backward(dk_out, g[ix.kn], dk, la.kraw, v[ix.kn], la.rstdk, N * d.NKV, d.hd, a.dk_bf16);
    }
    // d(xn1) in three parts, q's, k's and v's (v's where dq was: q's product has read it);
    // norm 1's backward sums them in its one pass.
    const MatmulInput xn1{la.xn1, la.xn1_bf16};
    const MatmulInput wq = a.weights.get(attn[ix.q], v[ix.q], d.Q, d.C);
    const MatmulInput wk = a.weights.get(attn[ix.k], v[ix.k], d.KV, d.C);
    const MatmulInput wv = a.weights.get(attn[ix.v], v[ix.v], d.KV, d.C);
    matmul_.backward(a.dx, g[ix.q], param_or_null(g, ix.qb), {dq_out, a.dq_bf16}, xn1, wq, N, d.C, d.Q);
    matmul_.backward(a.dx2, g[ix.k], param_or_null(g, ix.kb), {dk_out, a.dk_bf16}, xn1, wk, N, d.C, d.KV);
    matmul_.backward(dq, g[ix.v], param_or_null(g, ix.vb), {dv, a.dv_bf16}, xn1, wv, N, d.C, d.KV);
  }));
  return run_module_backward(access, modules_, block_module(layer, 0), [&](auto v, auto g) {
    // d(block input): the previous block's down_proj backward reads it (the embedding's reads fp32)
    k::summed_rmsnorm_backward(a.dres, g[0], a.dx, a.dx2, a.dbig, a.resid[layer], v[0], la.rstd1, N, d.C,
                               layer > 0 ? a.dres_bf16 : nullptr);
  });
}

}  // namespace zinf::model
