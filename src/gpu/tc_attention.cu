// Tensor-core causal attention (FlashAttention-2 style): the launchers of tc_attention_kernels.cuh's
// kernels, one instance per supported head size, and the backward's row sums.
#include <cmath>
#include <string>

#include "gpu/kernel_util.cuh"
#include "gpu/tc_attention.h"
#include "gpu/tc_attention_kernels.cuh"
#include "gpu/tc_attention_tiles.h"

namespace zinf::gpu {
namespace {

// Allows `bytes` of dynamic shared memory for `kernel` when above the default 48 KiB.
template <typename Kernel>
Status allow_smem(Kernel kernel, std::size_t bytes, const std::string& what) {
  if (bytes <= 48 * 1024) return Status::ok();
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     what + ": cudaFuncSetAttribute(MaxDynamicSharedMemorySize " + std::to_string(bytes) + ")");
}

std::string describe_call(const char* name, const TcAttentionTensors& a) {
  return describe(name, {Dim{"B", a.B}, Dim{"T", a.T}, Dim{"NH", a.NH}, Dim{"NKV", a.NKV}, Dim{"hs", a.hs}});
}

float score_scale(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }  // as the CPU kernels

template <int HS>
Status forward_hs(bf16* out, float* lse, const TcAttentionTensors& a, cudaStream_t stream) {
  const std::string what = describe_call("tc_attention_forward", a);
  const std::size_t bytes = tc::smem_layout(tc::Kernel::kForward, HS).bytes;
  ZINF_RETURN_IF_ERROR(allow_smem(tc_forward_kernel<HS>, bytes, what));
  const dim3 grid(static_cast<unsigned>(tc::tiles(a.T)), static_cast<unsigned>(a.B * a.NH));
  tc_forward_kernel<HS><<<grid, tc::kThreads, bytes, stream>>>(out, lse, a, score_scale(HS));
  return last_launch_status(what);
}

template <int HS>
Status backward_hs(const TcAttentionGrads& grads, const float* dsum, const bf16* dout, const float* lse,
                   const TcAttentionTensors& a, cudaStream_t stream) {
  const std::string dkv = describe_call("tc_attention_backward (dK, dV)", a);
  const std::string dq = describe_call("tc_attention_backward (dQ)", a);
  const std::size_t dkv_bytes = tc::smem_layout(tc::Kernel::kDkv, HS).bytes;
  const std::size_t dq_bytes = tc::smem_layout(tc::Kernel::kDq, HS).bytes;
  ZINF_RETURN_IF_ERROR(allow_smem(tc_dkv_kernel<HS>, dkv_bytes, dkv));
  ZINF_RETURN_IF_ERROR(allow_smem(tc_dq_kernel<HS>, dq_bytes, dq));
  const unsigned t = static_cast<unsigned>(tc::tiles(a.T));
  const float scale = score_scale(HS);
  const dim3 kv_grid(t, static_cast<unsigned>(a.B * a.NKV));
  tc_dkv_kernel<HS><<<kv_grid, tc::kThreads, dkv_bytes, stream>>>(grads, dout, lse, dsum, a, scale);
  ZINF_RETURN_IF_ERROR(last_launch_status(dkv));
  const dim3 q_grid(t, static_cast<unsigned>(a.B * a.NH));
  tc_dq_kernel<HS><<<q_grid, tc::kThreads, dq_bytes, stream>>>(grads.dq, dout, lse, dsum, a, scale);
  return last_launch_status(dq);
}

// Calls fn.template operator()<HS>() for the instantiated head sizes.
template <typename Fn>
Status with_head_size(int hs, Fn&& fn) {
  switch (hs) {
    case 16: return fn.template operator()<16>();
    case 32: return fn.template operator()<32>();
    case 48: return fn.template operator()<48>();
    case 64: return fn.template operator()<64>();
    case 80: return fn.template operator()<80>();
    case 96: return fn.template operator()<96>();
    case 112: return fn.template operator()<112>();
    case 128: return fn.template operator()<128>();
    default: break;
  }
  return Status::unsupported("tc_attention: head size " + std::to_string(hs) + " has no kernel instance");
}

}  // namespace

Status tc_attention_forward(bf16* out, float* lse, const TcAttentionTensors& a, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(tc_attention_supports(a));
  return with_head_size(a.hs, [&]<int HS>() { return forward_hs<HS>(out, lse, a, stream); });
}

Status tc_attention_backward(const TcAttentionGrads& grads, float* dsum, const bf16* dout, const bf16* out,
                             const float* lse, const TcAttentionTensors& a, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(tc_attention_supports(a, {dout}));
  if (dsum == nullptr || lse == nullptr) {
    return Status::invalid_argument(describe_call("tc_attention_backward", a) + ": null dsum or lse");
  }
  const long long rows = static_cast<long long>(a.B) * a.NH * a.T;
  const long long blocks = (rows + tc::kWarps - 1) / tc::kWarps;
  if (blocks > 0x7fffffffLL) {
    return Status::unsupported(describe_call("tc_attention_backward", a) + ": too many rows");
  }
  tc_row_dot_kernel<<<static_cast<unsigned>(blocks), tc::kThreads, 0, stream>>>(dsum, dout, out, a, rows);
  ZINF_RETURN_IF_ERROR(last_launch_status(describe_call("tc_attention_backward (row sums)", a)));
  return with_head_size(a.hs, [&]<int HS>() { return backward_hs<HS>(grads, dsum, dout, lse, a, stream); });
}

}  // namespace zinf::gpu
