// Internal: causal attention as FlashAttention-2-style fused kernels on tensor cores (mma.sync
// m16n8k16, bf16 products with fp32 accumulation), for GPT (packed qkv) and Llama (grouped-query).
// Same tensors, layouts and lse contract as flash_attention.h; no (T, T) matrix anywhere. The
// nets reach these through gemm_attention.h's calls, which take this path first when
// tc_attention_supports() (see attention_path_for() below); docs/gpu-kernels.md "Tensor-core
// attention".
//
// How (tile arithmetic: tc_attention_tiles.h; instructions: mma_sm80.cuh): blocks of 4 warps,
// tiles of 64 query rows and 64 keys, each warp 16 rows (or keys); the scores, P and dS stay in
// the products' accumulator registers, where the softmax and the score gradient are computed,
// and go on, packed to bf16, as the next product's operand; shared memory holds the input tiles.
//  - forward: one block per (query tile, b, query head) walks the key tiles up to the diagonal
//    with the online softmax (running max and sum per row, O rescaled in its accumulators);
//    out = O / l, lse = m + log l.
//  - backward: D = rowsum(dO * O) into `dsum`; dK, dV: one block per (key tile, b, kv head)
//    walking, for each of the kv head's query heads in head order, the query tiles from the
//    diagonal down (P and dS recomputed from lse, D); dQ: one block per (query tile, b, query
//    head) walking the key tiles. P and dS are computed twice, and nothing is atomic.
// Numerics: P (forward: exp(S*scale - m) of the running max; backward: exp(S*scale - lse)) and dS
// are rounded to bf16 as the products' inputs, as flash attention 2 and the GEMM path do;
// scores, softmax statistics, D and every accumulation fp32; the row sum l adds the unrounded P.
// Deterministic: every sum runs in an order fixed by the shapes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "gpu/flash_attention.h"
#include "gpu/numerics.h"
#include "zinf/status.h"

namespace zinf::gpu {

// Where one call's tensors live, as the flash kernels: head h of row (b, t) of q (and dq) at
// (b*T + t) * q_ld + h*hs; kv head g of k, v (and dk, dv) at (b*T + t) * kv_ld + g*hs; query
// head h of out and dout at (b*T + t) * o_ld + h*hs. Query head h reads kv head h / (NH / NKV).
struct TcAttentionTensors {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  std::size_t q_ld, kv_ld, o_ld;
  int B, T, NH, NKV, hs;
};
struct TcAttentionGrads {
  bf16* dq;
  bf16* dk;
  bf16* dv;
};
// GPT: q, k, v = qkv, qkv + C, qkv + 2C with rows 3C apart, out (B,T,C).
TcAttentionTensors tc_packed_qkv(const bf16* qkv, int B, int T, int C, int NH);
// Llama: dense q, out (B,T,NH*hs) and k, v (B,T,NKV*hs).
TcAttentionTensors tc_separate_qkv(const bf16* q, const bf16* k, const bf16* v, const GqaShape& s);

// OK when these kernels take the call: sizes >= 1, NH divisible by NKV, hs a multiple of 16 up to
// 128, B * NH <= 65535, q, k, v and `more` (the backward: dout) 16-byte aligned (they are read in
// 16-byte vectors), row strides multiples of 8 elements, and a
// device of compute capability 8.0 or newer. Otherwise unsupported (or invalid_argument for bad
// sizes), naming why: the caller falls back. `more` may hold nullptrs (ignored).
Status tc_attention_supports(const TcAttentionTensors& a, std::initializer_list<const void*> more = {});

// out (B,T,NH*hs rows o_ld apart) bf16, lse (B,NH,T) fp32. Check tc_attention_supports() first.
Status tc_attention_forward(bf16* out, float* lse, const TcAttentionTensors& a, cudaStream_t stream);
// dq, dk, dv overwritten (a kv head's dk, dv sum its query heads in head order in fp32, rounded
// once); dsum: B*NH*T floats of scratch (attention_backward_scratch_floats()).
Status tc_attention_backward(const TcAttentionGrads& grads, float* dsum, const bf16* dout, const bf16* out,
                             const float* lse, const TcAttentionTensors& a, cudaStream_t stream);

// ---- which path gemm_attention.h's calls take ---------------------------------------------
// kAuto: the tensor-core kernels where they support the call, else the GEMM path (which itself
// falls back to the flash kernels without scratch room). kTensorCore: the same, with a notice once
// per process when the kernels do not support a call. kGemm: the GEMM path. kFlash: the flash
// kernels. The environment variable ZINF_ATTENTION=tc|gemm|flash|auto picks one for the process
// (read once, at the first call); an unknown value is noticed once and means auto.
enum class AttentionPath { kAuto, kTensorCore, kGemm, kFlash };
std::optional<AttentionPath> parse_attention_path(std::string_view s);  // "tc", "gemm", "flash", "auto"
const char* attention_path_name(AttentionPath p);
// ZINF_ATTENTION's choice, or the override.
AttentionPath requested_attention_path();
// Overrides ZINF_ATTENTION for the process (tests, benchmarks); std::nullopt returns to it.
void set_attention_path(std::optional<AttentionPath> p);
// The path a call takes: kTensorCore, kGemm or kFlash (never kAuto). `supports` is
// tc_attention_supports()'s verdict on the call.
AttentionPath attention_path_for(AttentionPath requested, const Status& supports);
// How many calls the dispatch sent to the tensor-core kernels in this process (tests check that
// the path they mean to test ran).
long long tc_attention_calls();
void count_tc_attention_call();

}  // namespace zinf::gpu
