// Internal: small dense products for the blocked attention core (blocks of up to 64 x 64 with a
// head-size inner dimension), register-blocked with AVX-512 or AVX2 + FMA, a bf16 variant on
// AVX512-BF16, and the scalar references they match.
#pragma once

namespace zinf::model::kernels::detail {

// C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) [+ C when accumulate], row-major, with op(A) = A
// (M rows of lda) or A^T (A is K rows of lda), op(B) = B (K rows of ldb) or B^T (B is N rows of
// ldb). C must not overlap A or B. Any M, N, K >= 0 work; the fast path is made for M, N <= 64.
//
// Every output element is sum = fma(a_k, b_k, sum) over k ascending from sum = 0, then
// alpha * sum, then C + that when accumulating (no other contraction): the reference below does
// exactly this with std::fma, so the AVX-512 and AVX2 kernels and the reference give the same
// bits, and the bits depend only on the inputs (not on the thread or the CPU).
//
// Thread-safe; the transposed-B case packs B^T into a thread-local buffer.
void block_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                int ldb, bool accumulate, float* C, int ldc);

// The plain loops (what block_gemm runs on CPUs without AVX2 + FMA).
void block_gemm_reference(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                          const float* B, int ldb, bool accumulate, float* C, int ldc);

// The kernels, widest last. block_gemm runs block_gemm_isa(), the widest this CPU has (read once).
enum class BlockGemmIsa { kReference, kAvx2Fma, kAvx512 };
BlockGemmIsa block_gemm_isa();
bool block_gemm_supports(BlockGemmIsa isa);
// block_gemm on a given kernel (tests compare them); one this CPU lacks runs the reference.
void block_gemm_on(BlockGemmIsa isa, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                   int lda, const float* B, int ldb, bool accumulate, float* C, int ldc);

// ---- bf16 products (block_gemm_bf16.cpp)

// block_gemm's arguments, layouts and conventions (fp32 A, B and C in memory), with the operands
// rounded to bf16 first: every element of op(A) and op(B) goes through to_bf16 (bf16.h: round to
// nearest even, NaN stays NaN), and each output element is then, with a(k), b(k) those bf16
// values and a(K) = b(K) = +0 when K is odd,
//   sum = +0; for p = 0, 1, ... < (K + 1) / 2:
//     sum = step(sum, a(2p+1), b(2p+1)); sum = step(sum, a(2p), b(2p))
// then alpha * sum, then C + that when accumulating (block_gemm's epilogue). step is one lane of
// VDPBF16PS as the Intel SDM defines it: acc + a * b with the exact product and one rounding to
// nearest even (an fp32 FMA), bf16 denormal inputs read as zero, and a tiny result flushed to a
// zero of its sign, tininess detected after rounding (x86's rule: a result that rounds, with an
// unbounded exponent, to below FLT_MIN). The AVX512-BF16 kernel runs exactly that, so it and
// block_gemm_bf16_reference give the same bits for finite inputs (a NaN in gives a NaN, its
// payload unspecified); the bits depend only on the inputs.
//
// Thread-safe: the packed bf16 operands live in thread-local buffers.
void block_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                     const float* B, int ldb, bool accumulate, float* C, int ldc);

// The plain loops, step by step (what block_gemm_bf16 runs on CPUs without AVX512-BF16: slow, as
// every step is an fma call; the attention core never chooses bf16 products on such CPUs).
void block_gemm_bf16_reference(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                               const float* B, int ldb, bool accumulate, float* C, int ldc);

// Whether the CPU has AVX512-BF16 (and AVX-512F and BW, as every such CPU has), so block_gemm_bf16
// runs the VDPBF16PS kernel.
// Read once.
bool block_gemm_bf16_supported();

}  // namespace zinf::model::kernels::detail
