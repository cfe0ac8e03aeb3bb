// Internal: the blocked (flash-style) causal attention core that GPT's multi-head and Llama's
// grouped-query kernels share, and the scalar backward reference they are tested against.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "model/attention_products.h"
#include "model/fused_kernels.h"
#include "model/llama_kernels.h"
#include "zinf/thread_pool.h"

namespace zinf::model::kernels::detail {

// Query and key blocks are attention_block(hs) rows, at most kAttnBlock. Equal sizes put the
// causal diagonal inside the diagonal blocks only: block (i, j) is full for j < i, masked for
// j == i, skipped for j > i. Every block product is block x block x hs; OpenBLAS runs products
// of up to 262144 multiply-adds on the calling thread and splits larger ones over its own
// threads, which fight the pool's tasks, so the block shrinks as hs grows (figures: docs/model.md).
constexpr int kAttnBlock = 64;
inline int attention_block(int hs) { return hs <= 64 ? 64 : hs <= 256 ? 32 : 16; }

// The block products run on block_gemm (block_gemm.h: AVX-512 or AVX2, the same bits on either
// and whatever the BLAS build) unless the CPU lacks AVX2 + FMA, ZINF_ATTN_BLAS=1 was set at start, or
// set_attention_blas(true) was called: then on OpenBLAS sgemm, kept as the benchmarks' reference
// (attention_bench interleaves the two). Switch only between calls, never while attention runs.
// With AttentionProducts::kBf16 they run on block_gemm_bf16 instead, unless OpenBLAS is forced
// as above (ZINF_ATTN_BLAS=1 or set_attention_blas(true): then fp32 sgemm still).
void set_attention_blas(bool on);
bool attention_blas();

// Per worker lane: two (kAttnBlock, kAttnBlock) blocks and two kAttnBlock row vectors.
constexpr size_t kAttnLaneFloats = 2 * kAttnBlock * kAttnBlock + 2 * kAttnBlock;

// One attention head of T rows. Rows of q, dq are q_ld apart; k, v, dk, dv kv_ld apart; o, dout
// o_ld apart. lse is the head's (T) log-sum-exp.
struct HeadRows {
  const float* q;
  const float* k;
  const float* v;
  int q_ld, kv_ld, o_ld;
};

// Query block `qb` (rows qb*attention_block(hs) ...) of one head: o rows (overwritten) and their
// log-sum-exp, by online softmax over key blocks 0..qb. `lane` is kAttnLaneFloats of scratch no
// other thread uses during the call. `products`: the block products' arithmetic. The result
// depends only on the inputs (and `products`).
void attention_forward_block(const HeadRows& h, float* o, float* lse, int T, int hs, int qb, float* lane,
                             AttentionProducts products);

// The rows attention_forward_block(..., qb, ...) wrote to o, rounded to bf16 into o_bf16 (o's
// layout, rows o_ld apart): the task that wrote them rounds them while they are in cache.
inline void round_query_block(uint16_t* o_bf16, const float* o, int T, int hs, int qb, int o_ld) {
  const int block = attention_block(hs), r0 = qb * block;
  const size_t at = static_cast<size_t>(r0) * o_ld;
  round_block_to_bf16(o_bf16 + at, o + at, std::min(block, T - r0), hs, static_cast<size_t>(o_ld));
}

// Backward of one head, FlashAttention-2 style, recomputing P = exp(S - lse) block by block.
// dq (T rows of q_ld) is overwritten; dk and dv (T rows of kv_ld) are added to (the caller zeroes
// them before the first query head of a kv head). Blocks run in a fixed order (query block
// outer, key block inner), so the bits depend only on the inputs.
void attention_backward_head(const HeadRows& h, const float* o, const float* dout, const float* lse, float* dq,
                             float* dk, float* dv, int T, int hs, float* lane, AttentionProducts products);

// Runs task(lane, i) for every i in [0, tasks) on `pool` with lane < pool.threads(), each lane
// on one thread at a time, so lane-indexed scratch is private. Free lanes take tasks in index
// order; which lane runs a task varies, so a task's result must not depend on its lane. That
// keeps the bits independent of the thread count. `parallel` false runs everything on lane 0.
template <typename Fn>
void run_lanes(ThreadPool& pool, size_t tasks, bool parallel, Fn&& task) {
  const size_t lanes = parallel ? std::min(pool.threads(), tasks) : 1;
  if (lanes <= 1) {
    for (size_t i = 0; i < tasks; i++) task(size_t{0}, i);
    return;
  }
  std::atomic<size_t> next{0};
  pool.run(lanes, [&](size_t lane) {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < tasks;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      task(lane, i);
    }
  });
}

// The kernels of kernels.h and llama_kernels.h on a given pool (they use default_thread_pool()),
// so tests can compare thread counts. scratch: pool.threads() * kAttnLaneFloats.
void attention_forward_on(ThreadPool& pool, float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                          int C, int NH, uint16_t* out_bf16 = nullptr,
                          AttentionProducts products = AttentionProducts::kFp32);
void attention_backward_on(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv, const float* out,
                           const float* lse, float* scratch, int B, int T, int C, int NH,
                           uint16_t* dqkv_bf16 = nullptr, AttentionProducts products = AttentionProducts::kFp32);
void gqa_attention_forward_on(ThreadPool& pool, float* out, float* lse, const float* q, const float* k,
                              const float* v, float* scratch, const GqaShape& s, uint16_t* out_bf16 = nullptr,
                              AttentionProducts products = AttentionProducts::kFp32);
void gqa_attention_backward_on(ThreadPool& pool, float* dq, float* dk, float* dv, const float* dout,
                               const float* q, const float* k, const float* v, const float* out, const float* lse,
                               float* scratch, const GqaShape& s, uint16_t* dv_bf16 = nullptr,
                               AttentionProducts products = AttentionProducts::kFp32);
// Tests: attention passes run since start by the four functions above, [forward, backward] x
// [kFp32, kBf16] products (a relaxed count per call, not per block), so a test can see which
// products a model passed. Thread-safe.
struct AttentionPassCounts {
  uint64_t passes[2][2] = {};
};
AttentionPassCounts attention_pass_counts();
void count_attention_pass(bool backward, AttentionProducts products);

// Whether a problem of B*NH heads of T rows is worth the pool (small ones stay on the caller).
inline bool attention_worth_threads(int B, int NH, int T, int hs) {
  return static_cast<size_t>(B) * NH * T * T * hs >= (size_t{1} << 20);
}

// Scalar loops over one head (the tests' reference): overwrites dq, adds to dk and dv.
void attention_backward_head_reference(const HeadRows& h, const float* dout, float* dq, float* dk, float* dv,
                                       int T, int hs);

}  // namespace zinf::model::kernels::detail
