// LlamaGpu: the Llama-family forward and backward on the GPU, module by module through a
// GpuParamAccess, in the order and with the checkpointing of model::LlamaModel (model/llama.cpp).
#include "gpu/llama_gpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "gpu/cuda_error.h"
#include "gpu/gemm_attention.h"
#include "gpu/kernels.h"
#include "gpu/launch_geometry.h"
#include "gpu/llama_kernels.h"
#include "model/layout.h"
#include "model/llama_kernels.h"

namespace zinf::gpu {

using model::Phase;

// One block's activations at the pass's N = B*T rows, in buffers sized for max_bt. Q = n_head *
// head_dim, KV = n_kv_head * head_dim, I = intermediate_size.
struct LlamaGpuLayerActs {
  bf16* xn1;     // (N,C) input_layernorm output
  float* rstd1;  // (N)
  bf16* q;       // (N,Q) after (q_norm and) RoPE
  bf16* k;       // (N,KV) after (k_norm and) RoPE
  bf16* v;       // (N,KV)
  bf16* qraw;    // (N,Q) q_proj output before q_norm (qk_norm only, else nullptr)
  bf16* kraw;    // (N,KV) k_proj output before k_norm (qk_norm only)
  float* rstdq;  // (N*NH) q_norm's rstd per head (qk_norm only)
  float* rstdk;  // (N*NKV) k_norm's rstd per head (qk_norm only)
  bf16* atty;    // (N,Q) attention output before o_proj
  float* lse;    // (B,NH,T)
  bf16* res2;    // (N,C) residual stream after attention: x + o_proj(atty)
  bf16* xn2;     // (N,C) post_attention_layernorm output
  float* rstd2;  // (N)
  bf16* gate;    // (N,I)
  bf16* up;      // (N,I)
  bf16* act;     // (N,I) silu(gate) * up
};

struct LlamaGpuActivations {
  std::vector<LlamaGpuLayerActs> layers;  // n_layer slots, or 1 with activation checkpointing
  std::vector<bf16*> resid;               // n_layer+1 of (N,C): block l reads resid[l], writes resid[l+1]
  bf16* xnf;                              // (N,C) model.norm output
  float* rstdf;                           // (N)
  bf16* logits;                           // (N, logits_ld(V)): logits, then their gradient
  bf16* head_weight;                      // head_weight_pad_elems(V, C): the head's padded weight
  float* losses;                          // (N)
  float* loss;                            // (1) the mean
  float* dres;                            // (N,C) gradient of the residual stream
  bf16* dres_bf;                          // (N,C) its bf16 copy, a product's input
  bf16* dx;                               // (N,max(C,Q)): d(atty), or a norm output's first part
  bf16* dx2;                              // (N,C) a norm output's second part
  bf16* dx3;                              // (N,C) its third part (v_proj's)
  bf16* dbig;                             // (N,max(Q+2KV, 2I)): dq|dk|dv, or dgate|dup
  float* dqk_raw;                         // (N,Q+KV) fp32 d(q_proj), d(k_proj) outputs before the norms (qk_norm)
  AttentionScratch att_scratch;           // gemm_attention_scratch_bytes (launch_geometry.h)
  float* col_scratch;                     // the largest column sum (bias and norm weight gradients)
  float* rope_cos;                        // (rope rows, head_dim/2)
  float* rope_sin;                        // (rope rows, head_dim/2)
  PassTokens tokens;                      // ids, targets, embedding buckets
};

namespace {

using Dims = model::detail::LlamaDims;

// The RoPE tables' rows: every T a pass may have (T <= max_seq and T <= B*T <= max_bt).
int rope_rows(const model::LlamaConfig& c, int max_bt) { return std::min(c.max_seq, max_bt); }

uint64_t carve(const model::LlamaConfig& c, int max_bt, char* base, LlamaGpuActivations* a) {
  const Dims d(c);
  const size_t bt = static_cast<size_t>(max_bt);
  const size_t C = d.C, Q = d.Q, KV = d.KV, I = d.I;
  Carver cv(base);
  a->layers.resize(c.activation_checkpointing ? 1 : static_cast<size_t>(c.n_layer));
  for (LlamaGpuLayerActs& l : a->layers) {
    l.xn1 = cv.take<bf16>(bt * C);
    l.rstd1 = cv.take<float>(bt);
    l.q = cv.take<bf16>(bt * Q);
    l.k = cv.take<bf16>(bt * KV);
    l.v = cv.take<bf16>(bt * KV);
    l.qraw = c.qk_norm ? cv.take<bf16>(bt * Q) : nullptr;
    l.kraw = c.qk_norm ? cv.take<bf16>(bt * KV) : nullptr;
    l.rstdq = c.qk_norm ? cv.take<float>(bt * d.NH) : nullptr;
    l.rstdk = c.qk_norm ? cv.take<float>(bt * d.NKV) : nullptr;
    l.atty = cv.take<bf16>(bt * Q);
    l.lse = cv.take<float>(bt * d.NH);
    l.res2 = cv.take<bf16>(bt * C);
    l.xn2 = cv.take<bf16>(bt * C);
    l.rstd2 = cv.take<float>(bt);
    l.gate = cv.take<bf16>(bt * I);
    l.up = cv.take<bf16>(bt * I);
    l.act = cv.take<bf16>(bt * I);
  }
  a->resid.resize(static_cast<size_t>(c.n_layer) + 1);
  for (bf16*& r : a->resid) r = cv.take<bf16>(bt * C);
  a->xnf = cv.take<bf16>(bt * C);
  a->rstdf = cv.take<float>(bt);
  a->logits = cv.take<bf16>(bt * static_cast<size_t>(logits_ld(d.V)));
  a->head_weight = cv.take<bf16>(head_weight_pad_elems(d.V, d.C));
  a->losses = cv.take<float>(bt);
  a->loss = cv.take<float>(1);
  a->dres = cv.take<float>(bt * C);
  a->dres_bf = cv.take<bf16>(bt * C);
  a->dx = cv.take<bf16>(bt * std::max(C, Q));
  a->dx2 = cv.take<bf16>(bt * C);
  a->dx3 = cv.take<bf16>(bt * C);
  a->dbig = cv.take<bf16>(bt * std::max(Q + 2 * KV, 2 * I));
  a->dqk_raw = c.qk_norm ? cv.take<float>(bt * (Q + KV)) : nullptr;
  a->att_scratch.bytes = gemm_attention_scratch_bytes(max_bt, std::min(c.max_seq, max_bt), d.NH, d.NKV, d.hd);
  a->att_scratch.base = cv.take<char>(a->att_scratch.bytes);
  // Bias gradients (Q, KV or C columns over N rows), norm weights (C over N rows; head_dim over
  // N*NH or N*NKV rows).
  const size_t col = std::max({column_sum_scratch_floats(max_bt, std::max({d.C, d.Q, d.KV})),
                               rmsnorm_backward_scratch_floats(max_bt * d.NH, d.hd)});
  a->col_scratch = cv.take<float>(col);
  const size_t table = static_cast<size_t>(rope_rows(c, max_bt)) * static_cast<size_t>(d.hd / 2);
  a->rope_cos = cv.take<float>(table);
  a->rope_sin = cv.take<float>(table);
  a->tokens.carve(cv, bt);
  return cv.used();
}

}  // namespace

// build_llama_layout's names, the same in every layer.
LlamaGpu::AttnSlots LlamaGpu::attn_slots(std::span<const model::ParamSpec> params, const model::ModuleSpec& attn) {
  AttnSlots s;
  const std::pair<std::string_view, int*> names[] = {
      {"q_proj.weight", &s.q}, {"q_proj.bias", &s.qb}, {"k_proj.weight", &s.k}, {"k_proj.bias", &s.kb},
      {"v_proj.weight", &s.v}, {"v_proj.bias", &s.vb}, {"o_proj.weight", &s.o}, {"o_proj.bias", &s.ob},
      {"q_norm.weight", &s.qn}, {"k_norm.weight", &s.kn}};
  for (size_t i = 0; i < attn.params.size(); i++) {
    const std::string_view name = params[static_cast<size_t>(attn.params[i])].name;
    for (const auto& [suffix, slot] : names) {
      if (name.ends_with(suffix)) *slot = static_cast<int>(i);
    }
  }
  return s;
}

namespace {

// p[i], or nullptr for an absent parameter (i < 0).
template <typename T>
T at_or_null(const T* p, int i) {
  return i >= 0 ? p[i] : nullptr;
}

}  // namespace

LlamaGpu::LlamaGpu(const model::LlamaConfig& config, Blas* blas, cudaStream_t stream)
    : GpuPassNet("LlamaGpu", stream, config.vocab_size, config.max_seq), config_(config), blas_(blas) {
  model::detail::build_llama_layout(config_, &params_, &modules_);
  ix_ = attn_slots(params_, modules_[static_cast<size_t>(block_module(0, 1))]);
}

LlamaGpu::~LlamaGpu() = default;

Status LlamaGpu::check_config(const model::LlamaConfig& config) {
  ZINF_RETURN_IF_ERROR(model::validate_llama_config(config));
  return gqa_attention_geometry(1, 1, config.n_head, config.n_kv_head, config.head_size()).status();
}

Status LlamaGpu::check_seq_len(const model::LlamaConfig& config, int T) {
  const int window = config.sliding_window;
  if (window <= 0 || T <= window) return Status::ok();
  return Status::invalid_argument(fmt::format("sequence length T ({}) is above the model's sliding_window ({}); "
                                              "zinf's attention is fully causal, so it trains windows of at most "
                                              "{} tokens (--seq)",
                                              T, window, window));
}

Result<std::unique_ptr<LlamaGpu>> LlamaGpu::create(const model::LlamaConfig& config, Blas* blas, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(check_config(config).with_context("LlamaGpu::create"));
  if (blas == nullptr) return Status::invalid_argument("LlamaGpu::create: blas is null");
  return std::unique_ptr<LlamaGpu>(new LlamaGpu(config, blas, stream));
}

uint64_t LlamaGpu::workspace_bytes(const model::LlamaConfig& config, int max_bt) {
  if (max_bt < 1) return 0;
  LlamaGpuActivations counting;
  return carve(config, max_bt, nullptr, &counting);
}

Status LlamaGpu::bind_workspace(void* base, uint64_t bytes, int max_bt) {
  ZINF_RETURN_IF_ERROR(check_workspace("LlamaGpu", base, bytes, max_bt, workspace_bytes(config_, max_bt)));
  auto a = std::make_unique<LlamaGpuActivations>();
  carve(config_, max_bt, static_cast<char*>(base), a.get());
  // The CPU model's tables (computed in double, rounded once), so both sides rotate by the same bits.
  const int rows = rope_rows(config_, max_bt);
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(config_.head_size() / 2);
  std::vector<float> cos(n), sin(n);
  const model::RopeFrequencies rope = model::rope_frequencies(config_, rows);
  model::kernels::rope_tables(cos.data(), sin.data(), rows, rope.inv_freq, rope.attention_factor);
  ZINF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(a->rope_cos, cos.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
      "LlamaGpu: upload of the RoPE cos table");
  ZINF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(a->rope_sin, sin.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
      "LlamaGpu: upload of the RoPE sin table");
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "LlamaGpu: RoPE tables uploaded");
  acts_ = std::move(a);
  max_bt_ = max_bt;
  rope_rows_ = rows;
  return Status::ok();
}

PassTokens* LlamaGpu::pass_tokens() { return acts_ != nullptr ? &acts_->tokens : nullptr; }
const float* LlamaGpu::pass_loss() const { return acts_ != nullptr ? acts_->loss : nullptr; }

Status LlamaGpu::forward_pass(int B, int T, GpuParamAccess& access, Phase phase, float loss_scale) {
  LlamaGpuActivations& a = *acts_;
  const Dims d(config_);
  const int N = B * T;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, embed_module(), phase, [&](const bf16* const* v) {
    return embedding_forward(a.resid[0], a.tokens.inputs(), v[0], nullptr, B, T, d.C, d.V, stream_);
  }));
  // Every layer gets its own slot only when backward will read it without recomputing.
  const bool own_slots = phase == Phase::kForward && !config_.activation_checkpointing;
  for (int l = 0; l < d.L; l++) ZINF_RETURN_IF_ERROR(block_forward(l, own_slots ? l : 0, B, T, access, phase, true));
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, norm_module(config_.n_layer), phase, [&](const bf16* const* v) {
    return rmsnorm_forward(a.xnf, a.rstdf, a.resid[static_cast<size_t>(d.L)], v[0], eps, N, d.C, stream_);
  }));
  return head_forward(*blas_, access, modules_, head_module(d.L), phase, a.xnf,
                      HeadBuffers{a.logits, a.losses, a.loss, a.tokens.targets(), a.head_weight}, N, d.C, loss_scale);
}

// need_output false (recompute for backward) builds the block's internals, not its output.
Status LlamaGpu::block_forward(int layer, int slot, int B, int T, GpuParamAccess& access, Phase phase,
                               bool need_output) {
  LlamaGpuActivations& a = *acts_;
  LlamaGpuLayerActs& la = a.layers[static_cast<size_t>(slot)];
  const Dims d(config_);
  const int N = B * T;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bf16* x = a.resid[static_cast<size_t>(layer)];  // (N,C)
  bf16* y = a.resid[static_cast<size_t>(layer) + 1];     // (N,C)
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, block_module(layer, 0), phase, [&](const bf16* const* v) {
    return rmsnorm_forward(la.xn1, la.rstd1, x, v[0], eps, N, d.C, stream_);
  }));
  const AttnSlots& ix = ix_;
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, block_module(layer, 1), phase, [&](const bf16* const* v) {
    const bool norms = config_.qk_norm;
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, LinearShape{N, d.C, d.Q}, norms ? la.qraw : la.q, la.xn1, v[ix.q],
                                        at_or_null(v, ix.qb), nullptr, stream_));
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, LinearShape{N, d.C, d.KV}, norms ? la.kraw : la.k, la.xn1, v[ix.k],
                                        at_or_null(v, ix.kb), nullptr, stream_));
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, LinearShape{N, d.C, d.KV}, la.v, la.xn1, v[ix.v],
                                        at_or_null(v, ix.vb), nullptr, stream_));
    if (norms) {  // Qwen3: RMSNorm over each head (rows of head_dim), before RoPE
      ZINF_RETURN_IF_ERROR(rmsnorm_forward(la.q, la.rstdq, la.qraw, v[ix.qn], eps, N * d.NH, d.hd, stream_));
      ZINF_RETURN_IF_ERROR(rmsnorm_forward(la.k, la.rstdk, la.kraw, v[ix.kn], eps, N * d.NKV, d.hd, stream_));
    }
    ZINF_RETURN_IF_ERROR(rope_forward(la.q, a.rope_cos, a.rope_sin, rope_rows_, B, T, d.NH, d.hd, stream_));
    ZINF_RETURN_IF_ERROR(rope_forward(la.k, a.rope_cos, a.rope_sin, rope_rows_, B, T, d.NKV, d.hd, stream_));
    ZINF_RETURN_IF_ERROR(
        gemm_gqa_attention_forward(*blas_, a.att_scratch, la.atty, la.lse, la.q, la.k, la.v,
                                   GqaShape{B, T, d.NH, d.NKV, d.hd}, stream_));
    // res2 = x + o_proj(atty): the residual as cuBLASLt's C.
    return linear_forward(*blas_, LinearShape{N, d.Q, d.C}, la.res2, la.atty, v[ix.o], at_or_null(v, ix.ob), x,
                          stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, block_module(layer, 2), phase, [&](const bf16* const* v) {
    return rmsnorm_forward(la.xn2, la.rstd2, la.res2, v[0], eps, N, d.C, stream_);
  }));
  return run_forward(access, modules_, block_module(layer, 3), phase, [&](const bf16* const* v) {
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, LinearShape{N, d.C, d.I}, la.gate, la.xn2, v[0], nullptr, nullptr,
                                        stream_));
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, LinearShape{N, d.C, d.I}, la.up, la.xn2, v[1], nullptr, nullptr,
                                        stream_));
    ZINF_RETURN_IF_ERROR(swiglu_forward(la.act, la.gate, la.up, static_cast<size_t>(N) * d.I, stream_));
    if (!need_output) return Status::ok();
    // y = res2 + down_proj(act).
    return linear_forward(*blas_, LinearShape{N, d.I, d.C}, y, la.act, v[2], nullptr, la.res2, stream_);
  });
}

Status LlamaGpu::backward_pass(int B, int T, GpuParamAccess& access) {
  LlamaGpuActivations& a = *acts_;
  const Dims d(config_);
  const int N = B * T;
  // The logits hold d(loss * loss_scale)/dlogits (forward_pass).
  ZINF_RETURN_IF_ERROR(head_backward(*blas_, access, modules_, head_module(d.L), a.xnf, a.logits, a.head_weight, a.dx, a.dres, N, d.C));
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, norm_module(config_.n_layer), [&](const bf16* const* v, float* const* g) {
    return rmsnorm_backward(a.dres, g[0], a.col_scratch, a.dx, a.resid[static_cast<size_t>(d.L)], v[0], a.rstdf, N,
                            d.C, stream_);
  }));
  const bool ckpt = config_.activation_checkpointing;
  for (int l = d.L - 1; l >= 0; l--) {
    // With checkpointing the single slot still holds the last block from forward.
    if (ckpt && l != d.L - 1) ZINF_RETURN_IF_ERROR(block_forward(l, 0, B, T, access, Phase::kRecompute, false));
    ZINF_RETURN_IF_ERROR(block_backward(l, ckpt ? 0 : l, B, T, access));
  }
  // embed_tokens' backward reads no values (tied or not); no position table.
  return run_backward(access, modules_, embed_module(), [&](const bf16* const*, float* const* g) {
    return embedding_backward(g[0], nullptr, a.dres, a.tokens.bucket_tokens(), a.tokens.bucket_starts(),
                              a.tokens.bucket_positions(), a.tokens.num_buckets(), B, T, d.C, stream_);
  });
}

// On entry dres holds d(block output); on exit d(block input).
Status LlamaGpu::block_backward(int layer, int slot, int B, int T, GpuParamAccess& access) {
  LlamaGpuActivations& a = *acts_;
  const LlamaGpuLayerActs& la = a.layers[static_cast<size_t>(slot)];
  const Dims d(config_);
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * d.C;
  const size_t NI = static_cast<size_t>(N) * d.I;
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, block_module(layer, 3), [&](const bf16* const* v, float* const* g) {
    ZINF_RETURN_IF_ERROR(cast_to_bf16(a.dres_bf, a.dres, NC, stream_));
    const LinearShape down{N, d.I, d.C};
    const LinearShape in{N, d.C, d.I};  // gate_proj and up_proj
    bf16* dact = a.dbig;     // (N,I), then dgate
    bf16* dup = a.dbig + NI;  // (N,I)
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, down, g[2], a.dres_bf, la.act, stream_));
    ZINF_RETURN_IF_ERROR(linear_backward_input(*blas_, down, dact, a.dres_bf, v[2], nullptr, stream_));
    ZINF_RETURN_IF_ERROR(swiglu_backward(dact, dup, dact, la.gate, la.up, NI, stream_));
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, in, g[0], dact, la.xn2, stream_));
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, in, g[1], dup, la.xn2, stream_));
    // d(xn2) in two parts, gate's and up's; norm 2's backward sums them in fp32 in its one pass.
    ZINF_RETURN_IF_ERROR(linear_backward_input(*blas_, in, a.dx, dact, v[0], nullptr, stream_));
    return linear_backward_input(*blas_, in, a.dx2, dup, v[1], nullptr, stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, block_module(layer, 2), [&](const bf16* const* v, float* const* g) {
    return summed_rmsnorm_backward(a.dres, g[0], a.col_scratch, a.dx, a.dx2, nullptr, la.res2, v[0], la.rstd2, N,
                                   d.C, stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, block_module(layer, 1), [&](const bf16* const* v, float* const* g) {
    return attention_backward_body(la, B, T, v, g);
  }));
  return run_backward(access, modules_, block_module(layer, 0), [&](const bf16* const* v, float* const* g) {
    return summed_rmsnorm_backward(a.dres, g[0], a.col_scratch, a.dx, a.dx2, a.dx3,
                                   a.resid[static_cast<size_t>(layer)], v[0], la.rstd1, N, d.C, stream_);
  });
}

// self_attn's backward. On entry dres holds d(res2); on exit dx, dx2, dx3 hold d(xn1)'s q, k and v
// parts for input_layernorm's backward.
Status LlamaGpu::attention_backward_body(const LlamaGpuLayerActs& la, int B, int T, const bf16* const* v,
                                         float* const* g) {
  LlamaGpuActivations& a = *acts_;
  const Dims d(config_);
  const int N = B * T;
  const size_t NQ = static_cast<size_t>(N) * d.Q, NKV = static_cast<size_t>(N) * d.KV;
  const AttnSlots& ix = ix_;
  ZINF_RETURN_IF_ERROR(cast_to_bf16(a.dres_bf, a.dres, static_cast<size_t>(N) * d.C, stream_));
  const LinearShape o{N, d.Q, d.C};
  ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, o, g[ix.o], a.dres_bf, la.atty, stream_));
  if (ix.ob >= 0) ZINF_RETURN_IF_ERROR(column_sum_add(g[ix.ob], a.col_scratch, a.dres, N, d.C, d.C, stream_));
  bf16* datty = a.dx;  // (N,Q)
  ZINF_RETURN_IF_ERROR(linear_backward_input(*blas_, o, datty, a.dres_bf, v[ix.o], nullptr, stream_));
  bf16* dq = a.dbig;    // (N,Q)
  bf16* dk = dq + NQ;   // (N,KV)
  bf16* dv = dk + NKV;  // (N,KV)
  ZINF_RETURN_IF_ERROR(gemm_gqa_attention_backward(*blas_, a.att_scratch, dq, dk, dv, datty, la.q, la.k, la.v,
                                                   la.atty, la.lse, GqaShape{B, T, d.NH, d.NKV, d.hd}, stream_));
  ZINF_RETURN_IF_ERROR(rope_backward(dq, a.rope_cos, a.rope_sin, rope_rows_, B, T, d.NH, d.hd, stream_));
  ZINF_RETURN_IF_ERROR(rope_backward(dk, a.rope_cos, a.rope_sin, rope_rows_, B, T, d.NKV, d.hd, stream_));
  if (config_.qk_norm) {
    // The norms' input gradients in fp32 (rmsnorm_backward adds), then rounded once into dq and
    // dk's places as the products' inputs.
    float* dq_raw = a.dqk_raw;
    float* dk_raw = dq_raw + NQ;
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_raw, 0, sizeof(float) * (NQ + NKV), stream_),
                              "LlamaGpu: zeroing the q/k norms' input gradients");
    ZINF_RETURN_IF_ERROR(rmsnorm_backward(dq_raw, g[ix.qn], a.col_scratch, dq, la.qraw, v[ix.qn], la.rstdq, N * d.NH,
                                          d.hd, stream_));
    ZINF_RETURN_IF_ERROR(rmsnorm_backward(dk_raw, g[ix.kn], a.col_scratch, dk, la.kraw, v[ix.kn], la.rstdk,
                                          N * d.NKV, d.hd, stream_));
    ZINF_RETURN_IF_ERROR(cast_to_bf16(dq, dq_raw, NQ, stream_));
    ZINF_RETURN_IF_ERROR(cast_to_bf16(dk, dk_raw, NKV, stream_));
  }
  // Weight and bias gradients, then d(xn1) in three parts (q's, k's, v's) that input_layernorm's
  // backward sums in fp32.
  struct Proj {
    int w, b, out;
    const bf16* dout;
    bf16* dxn;
  };
  for (const Proj& p : {Proj{ix.q, ix.qb, d.Q, dq, a.dx}, Proj{ix.k, ix.kb, d.KV, dk, a.dx2},
                        Proj{ix.v, ix.vb, d.KV, dv, a.dx3}}) {
    const LinearShape s{N, d.C, p.out};
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, s, g[p.w], p.dout, la.xn1, stream_));
    if (p.b >= 0) ZINF_RETURN_IF_ERROR(column_sum_add(g[p.b], a.col_scratch, p.dout, N, p.out, p.out, stream_));
    ZINF_RETURN_IF_ERROR(linear_backward_input(*blas_, s, p.dxn, p.dout, v[p.w], nullptr, stream_));
  }
  return Status::ok();
}

}  // namespace zinf::gpu
