// Internal: small dense products for the blocked attention core (blocks of up to 64 x 64 with a
// head-size inner dimension), register-blocked with AVX-512 or AVX2 + FMA, and the scalar
// reference they match.
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

}  // namespace zinf::model::kernels::detail
