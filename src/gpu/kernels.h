// Internal: the GPT kernels on the GPU (embedding, LayerNorm, GELU, residual, casts, column
// sums, softmax + cross-entropy): bf16 storage, fp32 arithmetic. Each has a CPU reference in
// src/model/kernels.h that tests/gpu compares it with.
//
// Common contract of every launcher below:
// - Pointers are device memory (or managed/mapped memory the device can read); nothing is
//   copied to or from the host. The work is enqueued on `stream`; the call returns before it
//   runs, so buffers must stay valid until the stream has passed that point.
// - Returns invalid_argument (naming the kernel and the bad size) before launching anything
//   for sizes out of range, and the CUDA launch error (naming the kernel and its sizes)
//   otherwise. An error inside the kernel at run time surfaces at the next synchronisation.
// - N = B*T rows throughout; "(N,C)" is row-major with C contiguous. "+=" marks an output the
//   kernel adds to. Every reduction runs in a fixed order (no atomics): the same inputs give the
//   same bits on the same GPU.
// - bf16 outputs are the fp32 result rounded to nearest even.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

// out (B,T,C) = wte[ids[b,t]] (V,C) + wpe[t] (>=T,C); wpe == nullptr: no position term (Llama).
// An id outside [0, V) gives a row of NaN (never a read out of bounds); callers check ids on the
// host first (make_embedding_buckets).
Status embedding_forward(bf16* out, const int32_t* ids, const bf16* wte, const bf16* wpe, int B, int T, int C, int V,
                         cudaStream_t stream);
// dwpe[t] (C) += sum over b of dout[b,t]; dwte[tokens[i]] (C) += sum of dout over positions
// [starts[i], starts[i+1]) of `positions` (EmbeddingBuckets, launch_geometry.h, uploaded), in
// position order. dout (B,T,C) fp32, dwte (V,C) and dwpe fp32 (nullptr: no position table, no
// dwpe). num_tokens = tokens.size().
Status embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* starts,
                          const int32_t* positions, int num_tokens, int B, int T, int C, cudaStream_t stream);

// out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) fp32 saved for backward
// (eps 1e-5, two passes over the row as the CPU kernel does).
Status layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                         int N, int C, cudaStream_t stream);
// dinp (N,C) fp32 +=; dweight, dbias (C) fp32 +=. scratch: layernorm_backward_scratch_floats(N, C).
Status layernorm_backward(float* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                          const bf16* inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream);

// GPT-2's tanh GELU (numerics.h), n values. gelu_backward: dinp = gelu'(inp) * dout; dinp may
// alias dout.
Status gelu_forward(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream);
Status gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, cudaStream_t stream);

// out = a + b, n values (fp32 sum, one rounding); out may alias a or b.
Status residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream);

// Conversions, n values: to bf16 rounds to nearest even (hardware conversion), to fp32 is exact.
Status cast_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t stream);
Status cast_to_f32(float* out, const bf16* in, std::size_t n, cudaStream_t stream);

// out (C) += column sums of x (N rows of C, row stride ld >= C), summed in fp32 in row order
// within chunks of kColumnChunkRows rows and then in chunk order. scratch:
// column_sum_scratch_floats(N, C). The bias gradient of a linear layer.
Status column_sum_add(float* out, float* scratch, const float* x, int N, int C, int ld, cudaStream_t stream);
Status column_sum_add(float* out, float* scratch, const bf16* x, int N, int C, int ld, cudaStream_t stream);

// The fused softmax + cross-entropy over the tied head's logits (N rows of V, row stride
// ld >= V): losses (N) fp32 = logsumexp(row) - row[target]. With write_grad, the row is then
// overwritten in place by d(loss_sum * dloss)/dlogits = (softmax(row) - onehot(target)) * dloss.
// A target outside [0, V) gives a NaN loss and leaves the gradient without the onehot term.
Status softmax_xent(bf16* logits, float* losses, const int32_t* targets, int N, int V, int ld, float dloss,
                    bool write_grad, cudaStream_t stream);

// out (1) fp32 = the mean of losses (N), summed in double in a fixed order.
Status mean_loss(float* out, const float* losses, int N, cudaStream_t stream);

}  // namespace zinf::gpu
