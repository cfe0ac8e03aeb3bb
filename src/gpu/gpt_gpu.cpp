// GptGpu: the GPT-2 forward and backward on the GPU, module by module through a
// GpuParamAccess, in the order and with the checkpointing of model::GptModel (model/gpt.cpp).
#include "gpu/gpt_gpu.h"

#include <fmt/format.h>

#include <algorithm>

#include "gpu/cuda_error.h"
#include "gpu/gemm_attention.h"
#include "gpu/kernels.h"
#include "model/layout.h"
#include "zinf/log.h"
#include "zinf/model/gpt.h"
#include "zinf/model/module_calls.h"

namespace zinf::gpu {

using model::Phase;

// One block's activations at the pass's N = B*T rows, in buffers sized for max_bt.
struct GpuLayerActs {
  bf16* ln1;        // (N,C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  bf16* qkv;        // (N,3C)
  bf16* atty;       // (N,C) attention output before c_proj
  float* lse;       // (B,NH,T)
  bf16* res2;       // (N,C) residual stream after attention
  bf16* ln2;        // (N,C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  bf16* fch;        // (N,4C) before GELU
  bf16* fch_gelu;   // (N,4C)
};

struct GptGpuActivations {
  std::vector<GpuLayerActs> layers;  // n_layer slots, or 1 with activation checkpointing
  std::vector<bf16*> resid;          // n_layer+1 of (N,C): block l reads resid[l], writes resid[l+1]
  bf16* lnf;                         // (N,C)
  float* lnf_mean;                   // (N)
  float* lnf_rstd;                   // (N)
  bf16* logits;                      // (N, logits_ld(V)): logits, then their gradient
  bf16* head_weight;                 // head_weight_pad_elems(V, C): the head's padded weight
  float* losses;                     // (N)
  float* loss;                       // (1) the mean
  float* dres;                       // (N,C) gradient of the residual stream
  bf16* dres_bf;                     // (N,C) its bf16 copy, a product's input
  bf16* dsmall;                      // (N,C) scratch gradient
  bf16* dbig;                        // (N,4C) scratch gradient (also dqkv)
  AttentionScratch att_scratch;      // gemm_attention_scratch_bytes (launch_geometry.h)
  float* col_scratch;                // column sums of up to 4C columns, and the LayerNorm's two of C
  PassTokens tokens;                 // ids, targets, embedding buckets
};

namespace {

uint64_t carve(const model::GptConfig& c, int max_bt, char* base, GptGpuActivations* a) {
  const size_t bt = static_cast<size_t>(max_bt);
  const size_t C = static_cast<size_t>(c.n_embd);
  const size_t NH = static_cast<size_t>(c.n_head);
  const size_t slots = c.activation_checkpointing ? 1 : static_cast<size_t>(c.n_layer);
  Carver cv(base);
  a->layers.resize(slots);
  for (GpuLayerActs& l : a->layers) {
    l.ln1 = cv.take<bf16>(bt * C);
    l.ln1_mean = cv.take<float>(bt);
    l.ln1_rstd = cv.take<float>(bt);
    l.qkv = cv.take<bf16>(bt * 3 * C);
    l.atty = cv.take<bf16>(bt * C);
    l.lse = cv.take<float>(bt * NH);
    l.res2 = cv.take<bf16>(bt * C);
    l.ln2 = cv.take<bf16>(bt * C);
    l.ln2_mean = cv.take<float>(bt);
    l.ln2_rstd = cv.take<float>(bt);
    l.fch = cv.take<bf16>(bt * 4 * C);
    l.fch_gelu = cv.take<bf16>(bt * 4 * C);
  }
  a->resid.resize(static_cast<size_t>(c.n_layer) + 1);
  for (bf16*& r : a->resid) r = cv.take<bf16>(bt * C);
  a->lnf = cv.take<bf16>(bt * C);
  a->lnf_mean = cv.take<float>(bt);
  a->lnf_rstd = cv.take<float>(bt);
  a->logits = cv.take<bf16>(bt * static_cast<size_t>(logits_ld(c.vocab_size)));
  a->head_weight = cv.take<bf16>(head_weight_pad_elems(c.vocab_size, static_cast<int>(C)));
  a->losses = cv.take<float>(bt);
  a->loss = cv.take<float>(1);
  a->dres = cv.take<float>(bt * C);
  a->dres_bf = cv.take<bf16>(bt * C);
  a->dsmall = cv.take<bf16>(bt * C);
  a->dbig = cv.take<bf16>(bt * 4 * C);
  const int max_T = std::min(c.max_seq, max_bt);
  a->att_scratch.bytes = gemm_attention_scratch_bytes(max_bt, max_T, c.n_head, c.n_head, c.n_embd / c.n_head);
  a->att_scratch.base = cv.take<char>(a->att_scratch.bytes);
  a->col_scratch = cv.take<float>(column_sum_scratch_floats(max_bt, 4 * c.n_embd));
  a->tokens.carve(cv, bt);
  return cv.used();
}

}  // namespace

GptGpu::GptGpu(const model::GptConfig& config, Blas* blas, cudaStream_t stream, GptGpuOptions options)
    : GpuPassNet("GptGpu", stream, config.vocab_size, config.max_seq), config_(config), blas_(blas) {
  // cuBLASLt wants the GELU aux matrix's leading dimension (4C) to be a multiple of 8.
  const bool gelu_ok = options.fuse_epilogues && (4 * config.n_embd) % 8 == 0;
  fuse_residual_ = options.fuse_epilogues;
  fuse_gelu_ = gelu_ok;
  fuse_dgelu_ = gelu_ok;
  model::detail::build_layout(config_, &params_, &modules_);
}

GptGpu::~GptGpu() = default;

Result<std::unique_ptr<GptGpu>> GptGpu::create(const model::GptConfig& config, Blas* blas, cudaStream_t stream,
                                               GptGpuOptions options) {
  ZINF_RETURN_IF_ERROR(model::validate_config(config));
  if (blas == nullptr) return Status::invalid_argument("GptGpu::create: blas is null");
  ZINF_RETURN_IF_ERROR(attention_geometry(1, 1, config.n_embd, config.n_head).status().with_context("GptGpu::create"));
  return std::unique_ptr<GptGpu>(new GptGpu(config, blas, stream, options));
}

uint64_t GptGpu::workspace_bytes(const model::GptConfig& config, int max_bt) {
  if (max_bt < 1) return 0;
  GptGpuActivations counting;
  return carve(config, max_bt, nullptr, &counting);
}

Status GptGpu::bind_workspace(void* base, uint64_t bytes, int max_bt) {
  ZINF_RETURN_IF_ERROR(check_workspace("GptGpu", base, bytes, max_bt, workspace_bytes(config_, max_bt)));
  auto a = std::make_unique<GptGpuActivations>();
  carve(config_, max_bt, static_cast<char*>(base), a.get());
  acts_ = std::move(a);
  max_bt_ = max_bt;
  return Status::ok();
}

PassTokens* GptGpu::pass_tokens() { return acts_ != nullptr ? &acts_->tokens : nullptr; }
const float* GptGpu::pass_loss() const { return acts_ != nullptr ? acts_->loss : nullptr; }

Status GptGpu::forward_pass(int B, int T, GpuParamAccess& access, Phase phase, float loss_scale) {
  GptGpuActivations& a = *acts_;
  const int N = B * T;
  const int C = config_.n_embd;
  const int V = config_.vocab_size;
  const int L = config_.n_layer;
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, model::module_wte_wpe(), phase, [&](const bf16* const* v) {
    return embedding_forward(a.resid[0], a.tokens.inputs(), v[0], v[1], B, T, C, V, stream_);
  }));
  // Every layer gets its own slot only when backward will read it without recomputing.
  const bool own_slots = phase == Phase::kForward && !config_.activation_checkpointing;
  for (int l = 0; l < L; l++) ZINF_RETURN_IF_ERROR(block_forward(l, own_slots ? l : 0, B, T, access, phase, true));
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, model::module_ln_f(L), phase, [&](const bf16* const* v) {
    return layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.resid[static_cast<size_t>(L)], v[0], v[1], N, C, stream_);
  }));
  return head_forward(*blas_, access, modules_, model::module_lm_head(L), phase, a.lnf,
                      HeadBuffers{a.logits, a.losses, a.loss, a.tokens.targets(), a.head_weight}, N, C, loss_scale);
}

Status GptGpu::block_forward(int layer, int slot, int B, int T, GpuParamAccess& access, Phase phase,
                             bool need_output) {
  GptGpuActivations& a = *acts_;
  GpuLayerActs& la = a.layers[static_cast<size_t>(slot)];
  const int N = B * T;
  const int C = config_.n_embd;
  const size_t NC = static_cast<size_t>(N) * C;
  const bf16* x = a.resid[static_cast<size_t>(layer)];  // (N,C)
  bf16* y = a.resid[static_cast<size_t>(layer) + 1];     // (N,C)
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, model::module_ln_1(layer), phase, [&](const bf16* const* v) {
    return layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, x, v[0], v[1], N, C, stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, model::module_attn(layer), phase, [&](const bf16* const* v) {
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, LinearShape{N, C, 3 * C}, la.qkv, la.ln1, v[0], v[1], nullptr, stream_));
    ZINF_RETURN_IF_ERROR(
        gemm_attention_forward(*blas_, a.att_scratch, la.atty, la.lse, la.qkv, B, T, C, config_.n_head, stream_));
    const LinearShape proj{N, C, C};
    if (fuse_residual_) return linear_forward(*blas_, proj, la.res2, la.atty, v[2], v[3], x, stream_);
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, proj, la.res2, la.atty, v[2], v[3], nullptr, stream_));
    return residual_forward(la.res2, la.res2, x, NC, stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_forward(access, modules_, model::module_ln_2(layer), phase, [&](const bf16* const* v) {
    return layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, v[0], v[1], N, C, stream_);
  }));
  return run_forward(access, modules_, model::module_mlp(layer), phase,
                     [&](const bf16* const* v) { return mlp_forward(slot, N, y, v, need_output); });
}

// fch = ln2 @ W_fc^T + b_fc, fch_gelu = gelu(fch); y = fch_gelu @ W_proj^T + b_proj + res2 when
// need_output (recompute for backward needs the block's internals, not its output).
Status GptGpu::mlp_forward(int slot, int N, bf16* y, const bf16* const* v, bool need_output) {
  GpuLayerActs& la = acts_->layers[static_cast<size_t>(slot)];
  const int C = config_.n_embd;
  const size_t NC = static_cast<size_t>(N) * C;
  const LinearShape fc{N, C, 4 * C};
  if (fuse_gelu_) {
    const Status st = linear_forward_gelu(*blas_, fc, la.fch_gelu, la.fch, la.ln2, v[0], v[1], stream_);
    if (st.code() == ErrorCode::kUnsupported) {
      fuse_gelu_ = false;  // nothing was launched: run the kernels below from now on
      log_once(LogLevel::kNotice, "gpu gelu epilogue",
               fmt::format("gpu: cuBLASLt GELU epilogue unavailable, GELU runs as its own kernel ({})", st.message()));
    } else {
      ZINF_RETURN_IF_ERROR(st);
    }
  }
  if (!fuse_gelu_) {
    ZINF_RETURN_IF_ERROR(linear_forward(*blas_, fc, la.fch, la.ln2, v[0], v[1], nullptr, stream_));
    ZINF_RETURN_IF_ERROR(gelu_forward(la.fch_gelu, la.fch, 4 * NC, stream_));
  }
  if (!need_output) return Status::ok();
  const LinearShape proj{N, 4 * C, C};
  if (fuse_residual_) return linear_forward(*blas_, proj, y, la.fch_gelu, v[2], v[3], la.res2, stream_);
  ZINF_RETURN_IF_ERROR(linear_forward(*blas_, proj, y, la.fch_gelu, v[2], v[3], nullptr, stream_));
  return residual_forward(y, y, la.res2, NC, stream_);
}

Status GptGpu::backward_pass(int B, int T, GpuParamAccess& access) {
  GptGpuActivations& a = *acts_;
  const int N = B * T;
  const int C = config_.n_embd;
  const int L = config_.n_layer;
  // The logits hold d(loss * loss_scale)/dlogits (forward_pass).
  ZINF_RETURN_IF_ERROR(
      head_backward(*blas_, access, modules_, model::module_lm_head(L), a.lnf, a.logits, a.head_weight, a.dsmall, a.dres, N, C));
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, model::module_ln_f(L), [&](const bf16* const* v, float* const* g) {
    return layernorm_backward(a.dres, g[0], g[1], a.col_scratch, a.dsmall, a.resid[static_cast<size_t>(L)], v[0],
                              a.lnf_mean, a.lnf_rstd, N, C, stream_);
  }));
  const bool ckpt = config_.activation_checkpointing;
  for (int l = L - 1; l >= 0; l--) {
    // With checkpointing the single slot still holds the last block from forward.
    if (ckpt && l != L - 1) ZINF_RETURN_IF_ERROR(block_forward(l, 0, B, T, access, Phase::kRecompute, false));
    ZINF_RETURN_IF_ERROR(block_backward(l, ckpt ? 0 : l, B, T, access));
  }
  return run_backward(access, modules_, model::module_wte_wpe(), [&](const bf16* const*, float* const* g) {
    return embedding_backward(g[0], g[1], a.dres, a.tokens.bucket_tokens(), a.tokens.bucket_starts(),
                              a.tokens.bucket_positions(), a.tokens.num_buckets(), B, T, C, stream_);
  });
}

// On entry dres holds d(block output); on exit d(block input).
Status GptGpu::block_backward(int layer, int slot, int B, int T, GpuParamAccess& access) {
  GptGpuActivations& a = *acts_;
  const GpuLayerActs& la = a.layers[static_cast<size_t>(slot)];
  const int N = B * T;
  const int C = config_.n_embd;
  const size_t NC = static_cast<size_t>(N) * C;
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, model::module_mlp(layer), [&](const bf16* const* v, float* const* g) {
    ZINF_RETURN_IF_ERROR(cast_to_bf16(a.dres_bf, a.dres, NC, stream_));
    const LinearShape proj{N, 4 * C, C};
    const LinearShape fc{N, C, 4 * C};
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, proj, g[2], a.dres_bf, la.fch_gelu, stream_));
    ZINF_RETURN_IF_ERROR(column_sum_add(g[3], a.col_scratch, a.dres, N, C, C, stream_));
    bf16* dfch = a.dbig;  // (N,4C)
    if (fuse_dgelu_) {
      const Status st = linear_backward_input(*blas_, proj, dfch, a.dres_bf, v[2], la.fch, stream_);
      if (st.code() == ErrorCode::kUnsupported) {
        fuse_dgelu_ = false;  // nothing was launched
        log_once(LogLevel::kNotice, "gpu dgelu epilogue",
                 fmt::format("gpu: cuBLASLt DGELU epilogue unavailable, GELU's backward runs as its own kernel ({})",
                             st.message()));
      } else {
        ZINF_RETURN_IF_ERROR(st);
      }
    }
    if (!fuse_dgelu_) {
      ZINF_RETURN_IF_ERROR(linear_backward_input(*blas_, proj, dfch, a.dres_bf, v[2], nullptr, stream_));
      ZINF_RETURN_IF_ERROR(gelu_backward(dfch, la.fch, dfch, 4 * NC, stream_));
    }
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, fc, g[0], dfch, la.ln2, stream_));
    ZINF_RETURN_IF_ERROR(column_sum_add(g[1], a.col_scratch, dfch, N, 4 * C, 4 * C, stream_));
    return linear_backward_input(*blas_, fc, a.dsmall, dfch, v[0], nullptr, stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, model::module_ln_2(layer), [&](const bf16* const* v, float* const* g) {
    return layernorm_backward(a.dres, g[0], g[1], a.col_scratch, a.dsmall, la.res2, v[0], la.ln2_mean, la.ln2_rstd, N,
                              C, stream_);
  }));
  ZINF_RETURN_IF_ERROR(run_backward(access, modules_, model::module_attn(layer), [&](const bf16* const* v, float* const* g) {
    ZINF_RETURN_IF_ERROR(cast_to_bf16(a.dres_bf, a.dres, NC, stream_));
    const LinearShape proj{N, C, C};
    const LinearShape qkv{N, C, 3 * C};
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, proj, g[2], a.dres_bf, la.atty, stream_));
    ZINF_RETURN_IF_ERROR(column_sum_add(g[3], a.col_scratch, a.dres, N, C, C, stream_));
    bf16* datty = a.dsmall;  // (N,C)
    bf16* dqkv = a.dbig;     // (N,3C)
    ZINF_RETURN_IF_ERROR(linear_backward_input(*blas_, proj, datty, a.dres_bf, v[2], nullptr, stream_));
    ZINF_RETURN_IF_ERROR(gemm_attention_backward(*blas_, a.att_scratch, dqkv, datty, la.qkv, la.atty, la.lse, B, T,
                                                 C, config_.n_head, stream_));
    ZINF_RETURN_IF_ERROR(linear_backward_weight(*blas_, qkv, g[0], dqkv, la.ln1, stream_));
    ZINF_RETURN_IF_ERROR(column_sum_add(g[1], a.col_scratch, dqkv, N, 3 * C, 3 * C, stream_));
    return linear_backward_input(*blas_, qkv, a.dsmall, dqkv, v[0], nullptr, stream_);
  }));
  return run_backward(access, modules_, model::module_ln_1(layer), [&](const bf16* const* v, float* const* g) {
    return layernorm_backward(a.dres, g[0], g[1], a.col_scratch, a.dsmall, a.resid[static_cast<size_t>(layer)], v[0],
                              la.ln1_mean, la.ln1_rstd, N, C, stream_);
  });
}

}  // namespace zinf::gpu
