// Internal: fused causal multi-head self-attention on the GPU that never materialises the
// (T, T) scores (flash-style: online softmax in forward, recomputation from the saved
// log-sum-exp in backward). The CPU reference is model/kernels.h attention_*.
//
// Layout as the CPU kernels: qkv (B,T,3C) is [q | k | v] with NH heads of hs = C/NH, head h at
// columns h*hs of each third; out (B,T,C); lse (B,NH,T) fp32. hs <= 128 (every GPT preset), and
// B * NH <= 65535 (attention_geometry() says why otherwise).
//
// Numerics: bf16 in and out, fp32 scores, softmax and accumulation, expf/logf at full
// precision. Deterministic: no atomics; every sum runs in an order fixed by the shapes.
// Launch contract as kernels.h (device pointers, enqueued on `stream`, Status naming sizes).
#pragma once

#include <cuda_runtime_api.h>

#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

// out (B,T,C) bf16, lse (B,NH,T) fp32 (each query row's log-sum-exp of its scaled scores).
Status attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream);

// dqkv (B,T,3C) bf16, overwritten, from dout (B,T,C) and forward's out and lse. scratch:
// attention_backward_scratch_floats(B, T, NH) floats (launch_geometry.h). Three kernels: the
// row sums D = rowsum(dO * O), dK and dV (one block per key tile, walking the query tiles at or
// below the diagonal), and dQ (one block per query tile, walking the key tiles).
Status attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                          const float* lse, int B, int T, int C, int NH, cudaStream_t stream);

}  // namespace zinf::gpu
