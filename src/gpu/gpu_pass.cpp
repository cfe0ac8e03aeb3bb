// What GptGpu and LlamaGpu share: workspace checks, a pass's token ids, the loss read-back.
#include "gpu/gpu_pass.h"

#include <fmt/format.h>

#include <climits>

#include "gpu/cuda_error.h"
#include "gpu/kernels.h"

namespace zinf::gpu {

Status check_workspace(std::string_view who, const void* base, uint64_t bytes, int max_bt, uint64_t need) {
  if (max_bt < 1 || max_bt > INT_MAX / 4) {
    return Status::invalid_argument(
        fmt::format("{}::bind_workspace: max_bt {} outside [1, {}]", who, max_bt, INT_MAX / 4));
  }
  if (base == nullptr || reinterpret_cast<std::uintptr_t>(base) % kViewAlign != 0 || bytes < need) {
    return Status::invalid_argument(fmt::format("{}::bind_workspace: {} bytes at {} for max_bt {}: need {} bytes, "
                                                "{}-byte aligned",
                                                who, bytes, base, max_bt, need, kViewAlign));
  }
  return Status::ok();
}

void PassTokens::carve(Carver& cv, size_t max_bt) {
  inputs_ = cv.take<int32_t>(max_bt);
  targets_ = cv.take<int32_t>(max_bt);
  bucket_tokens_ = cv.take<int32_t>(max_bt);
  bucket_starts_ = cv.take<int32_t>(max_bt + 1);
  bucket_positions_ = cv.take<int32_t>(max_bt);
}

Status PassTokens::begin(std::string_view who, std::span<const int32_t> inputs, std::span<const int32_t> targets,
                         int B, int T, int vocab, int max_seq, int max_bt, bool backward, cudaStream_t stream) {
  const int64_t bt = static_cast<int64_t>(B) * T;
  if (B < 1 || T < 1 || T > max_seq || bt > max_bt) {
    return Status::invalid_argument(fmt::format("{}: B ({}) and T ({}) must be >= 1 with T <= max_seq ({}) and "
                                                "B*T <= the workspace's {}",
                                                who, B, T, max_seq, max_bt));
  }
  if (inputs.size() != static_cast<size_t>(bt) || targets.size() != static_cast<size_t>(bt)) {
    return Status::invalid_argument(
        fmt::format("{}: {} inputs and {} targets for B*T = {}", who, inputs.size(), targets.size(), bt));
  }
  for (size_t i = 0; i < targets.size(); i++) {
    if (targets[i] < 0 || targets[i] >= vocab) {
      return Status::invalid_argument(
          fmt::format("{}: target {} at position {} is outside the vocabulary of {}", who, targets[i], i, vocab));
    }
  }
  // Also checks every input id (naming the position).
  ZINF_ASSIGN_OR_RETURN(buckets_, make_embedding_buckets(inputs, vocab));
  // Pageable host memory: each copy returns once its source has been staged.
  auto h2d = [&](int32_t* dst, std::span<const int32_t> src, const char* what) {
    if (src.empty()) return Status::ok();
    return cuda_status(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream),
                       fmt::format("{}: H2D copy of {} ({} bytes)", who, what, src.size_bytes()));
  };
  ZINF_RETURN_IF_ERROR(h2d(inputs_, inputs, "input ids"));
  ZINF_RETURN_IF_ERROR(h2d(targets_, targets, "targets"));
  if (!backward) return Status::ok();
  ZINF_RETURN_IF_ERROR(h2d(bucket_tokens_, buckets_.tokens, "embedding bucket tokens"));
  ZINF_RETURN_IF_ERROR(h2d(bucket_starts_, buckets_.starts, "embedding bucket starts"));
  return h2d(bucket_positions_, buckets_.positions, "embedding bucket positions");
}

Status GpuPassNet::begin_pass(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                              bool backward) {
  PassTokens* tokens = pass_tokens();
  if (tokens == nullptr) return Status::invalid_argument(fmt::format("{}: no workspace (bind_workspace first)", name_));
  ZINF_RETURN_IF_ERROR(check_seq(T).with_context(name_));
  return tokens->begin(name_, inputs, targets, B, T, vocab_, max_seq_, max_bt_, backward, stream_);
}

Result<float> GpuPassNet::forward_backward(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B,
                                           int T, GpuParamAccess& access, float loss_scale) {
  ZINF_RETURN_IF_ERROR(begin_pass(inputs, targets, B, T, true));
  ZINF_RETURN_IF_ERROR(forward_pass(B, T, access, model::Phase::kForward, loss_scale));
  ZINF_RETURN_IF_ERROR(backward_pass(B, T, access));
  return read_loss();
}

Result<float> GpuPassNet::forward_loss(std::span<const int32_t> inputs, std::span<const int32_t> targets, int B, int T,
                                       GpuParamAccess& access) {
  ZINF_RETURN_IF_ERROR(begin_pass(inputs, targets, B, T, false));
  ZINF_RETURN_IF_ERROR(forward_pass(B, T, access, model::Phase::kEval, 1.0f));
  return read_loss();
}

Status GpuPassNet::head_forward(Blas& blas, GpuParamAccess& access, std::span<const model::ModuleSpec> modules,
                                int head, model::Phase phase, const bf16* x, const HeadBuffers& h, int N, int C,
                                float loss_scale) {
  const int V = vocab_;
  ZINF_RETURN_IF_ERROR(run_forward(access, modules, head, phase, [&](const bf16* const* v) -> Status {
    int rows = V;
    ZINF_ASSIGN_OR_RETURN(const bf16* w, head_weight(v[0], h.padded_weight, C, &rows));
    // With the padded weight the logits' padding columns are computed as zeros; softmax_xent
    // reads and overwrites the first V, so the backward products see zeros there too.
    return linear_forward(blas, LinearShape{N, C, rows, logits_ld(V)}, h.logits, x, w, nullptr, nullptr, stream_);
  }));
  ZINF_RETURN_IF_ERROR(softmax_xent(h.logits, h.losses, h.targets, N, V, logits_ld(V),
                                    loss_scale / static_cast<float>(N), phase == model::Phase::kForward, stream_));
  return mean_loss(h.loss, h.losses, N, stream_);
}

Status GpuPassNet::head_backward(Blas& blas, GpuParamAccess& access, std::span<const model::ModuleSpec> modules,
                                 int head, const bf16* x, const bf16* logits, bf16* padded_weight, bf16* dx,
                                 float* dres, int N, int C) {
  const LinearShape shape{N, C, vocab_, logits_ld(vocab_)};
  ZINF_RETURN_IF_ERROR(run_backward(access, modules, head, [&](const bf16* const* v, float* const* g) -> Status {
    // dx over the padded rows (their weight rows and logits columns are zero: the same sum);
    // the weight's gradient over the V real rows only.
    int rows = vocab_;
    ZINF_ASSIGN_OR_RETURN(const bf16* w, head_weight(v[0], padded_weight, C, &rows));
    ZINF_RETURN_IF_ERROR(linear_backward_input(blas, LinearShape{N, C, rows, shape.ld_out}, dx, logits, w, nullptr, stream_));
    return linear_backward_weight(blas, shape, g[0], logits, x, stream_);
  }));
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dres, 0, sizeof(float) * static_cast<size_t>(N) * C, stream_),
                            fmt::format("{}: zeroing the residual gradient", name_));
  return Status::ok();
}

Result<const bf16*> GpuPassNet::head_weight(const bf16* w, bf16* padded, int C, int* rows) {
  const int V = vocab_;
  *rows = V;
  if (padded == nullptr || head_weight_pad_elems(V, C) == 0) return w;
  const std::size_t real = static_cast<std::size_t>(V) * static_cast<std::size_t>(C);
  const std::size_t pad = head_weight_pad_elems(V, C) - real;
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(padded, w, real * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_),
                            fmt::format("{}: copying the head's weight into its padded rows", name_));
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(padded + real, 0, pad * sizeof(bf16), stream_),
                            fmt::format("{}: zeroing the head's padding rows", name_));
  *rows = logits_ld(V);
  return static_cast<const bf16*>(padded);
}

// The end of a pass: the mean loss back, after everything enqueued.
Result<float> GpuPassNet::read_loss() {
  float loss = 0.0f;
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&loss, pass_loss(), sizeof loss, cudaMemcpyDeviceToHost, stream_),
                            fmt::format("{}: D2H copy of the loss", name_));
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_),
                            fmt::format("{}: end of pass (cudaStreamSynchronize)", name_));
  return loss;
}

}  // namespace zinf::gpu
