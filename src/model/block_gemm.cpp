// Small dense products for the blocked attention core: AVX-512 and AVX2 + FMA register-blocked
// kernels, one picked at load time, and the scalar reference they match bit for bit (block_gemm.h).
#include "model/block_gemm.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "zinf/log.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "model/block_gemm_tile.h"
#include "model/transpose16.h"
#define ZINF_BLOCK_GEMM_X86 1
#endif

namespace zinf::model::kernels::detail {

void block_gemm_reference(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                          const float* B, int ldb, bool accumulate, float* C, int ldc) {
  const size_t a_rs = trans_a ? 1 : lda, a_ks = trans_a ? lda : 1;  // A(i, k) = A[i * a_rs + k * a_ks]
  const size_t b_ks = trans_b ? 1 : ldb, b_cs = trans_b ? ldb : 1;  // B(k, j) = B[k * b_ks + j * b_cs]
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      float sum = 0.0f;
      for (int k = 0; k < K; k++) sum = std::fma(A[i * a_rs + k * a_ks], B[k * b_ks + j * b_cs], sum);
      float& c = C[static_cast<size_t>(i) * ldc + j];
      c = accumulate ? c + alpha * sum : alpha * sum;
    }
  }
}

#ifdef ZINF_BLOCK_GEMM_X86
namespace {

constexpr int kTileRows = 6;  // 6 rows x 4 vectors: 24 accumulators, 4 B vectors, 1 broadcast

// Rows [0, R) x vectors [0, NV) of C from A(i, k) = A[i * a_rs + k * a_ks] and B (K rows of ldb,
// contiguous columns); the last vector's columns are `last` (a mask), the others full.
template <int R, int NV>
__attribute__((target("avx512f"))) void tile(const float* A, size_t a_rs, size_t a_ks, const float* B, size_t ldb,
                                              int K, float alpha, bool accumulate, float* C, size_t ldc,
                                              __mmask16 last) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  }
  for (int k = 0; k < K; k++) {
    const float* brow = B + k * ldb;
    __m512 b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; v++) b[v] = _mm512_loadu_ps(brow + 16 * v);
    b[NV - 1] = _mm512_maskz_loadu_ps(last, brow + 16 * (NV - 1));
    const float* acol = A + k * a_ks;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const __m512 a = _mm512_set1_ps(acol[r * a_rs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  store_tile(acc, alpha, accumulate, C, ldc, last);
}

using TileFn = void (*)(const float*, size_t, size_t, const float*, size_t, int, float, bool, float*, size_t,
                        __mmask16);

template <int R>
constexpr TileFn kRowTiles[4] = {tile<R, 1>, tile<R, 2>, tile<R, 3>, tile<R, 4>};
constexpr const TileFn* kTiles[kTileRows] = {kRowTiles<1>, kRowTiles<2>, kRowTiles<3>,
                                             kRowTiles<4>, kRowTiles<5>, kRowTiles<6>};

__attribute__((target("avx512f"))) void block_gemm_avx512(bool trans_a, int M, int N, int K, float alpha,
                                                           const float* A, int lda, const float* B, size_t ldb,
                                                           bool accumulate, float* C, int ldc) {
  const size_t a_rs = trans_a ? 1 : lda, a_ks = trans_a ? lda : 1;
  for (int j0 = 0; j0 < N; j0 += 64) {
    const int cols = N - j0 < 64 ? N - j0 : 64;
    const int nv = (cols + 15) / 16;
    const int tail = cols - 16 * (nv - 1);
    const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1);
    for (int i0 = 0; i0 < M; i0 += kTileRows) {
      const int rows = M - i0 < kTileRows ? M - i0 : kTileRows;
      kTiles[rows - 1][nv - 1](A + i0 * a_rs, a_rs, a_ks, B + j0, ldb, K, alpha, accumulate,
                               C + static_cast<size_t>(i0) * ldc + j0, ldc, last);
    }
  }
  // The callers are SSE code; GCC adds no vzeroupper to target("...") functions, and SSE code
  // after dirty upper halves pays a state-transition penalty on every instruction.
  _mm256_zeroupper();
}

// The AVX2 + FMA kernel: tiles of 4 rows x 24 columns (12 ymm accumulators), the same
// arithmetic per element as the AVX-512 one.
constexpr int kTileRows2 = 4;

// FullLast: the last vector's 8 columns are all in C, so it loads and stores plainly like the
// others; only a partial one goes through the mask. AVX2's masked moves (vmaskmovps) are cheap on
// Intel but slow on AMD Zen 2/3, especially the store, and the attention blocks' 64 columns are
// always whole vectors.
template <int R, int NV, bool FullLast>
__attribute__((target("avx2,fma"))) void tile2(const float* A, size_t a_rs, size_t a_ks, const float* B, size_t ldb,
                                                int K, float alpha, bool accumulate, float* C, size_t ldc,
                                                __m256i last) {
  __m256 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
  }
  for (int k = 0; k < K; k++) {
    const float* brow = B + k * ldb;
    __m256 b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; v++) b[v] = _mm256_loadu_ps(brow + 8 * v);
    b[NV - 1] = FullLast ? _mm256_loadu_ps(brow + 8 * (NV - 1)) : _mm256_maskload_ps(brow + 8 * (NV - 1), last);
    const float* acol = A + k * a_ks;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const __m256 a = _mm256_broadcast_ss(acol + r * a_rs);
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    float* crow = C + r * ldc;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      __m256 x = _mm256_mul_ps(va, acc[r][v]);
      if (FullLast || v < NV - 1) {
        if (accumulate) x = _mm256_add_ps(_mm256_loadu_ps(crow + 8 * v), x);
        _mm256_storeu_ps(crow + 8 * v, x);
      } else {
        if (accumulate) x = _mm256_add_ps(_mm256_maskload_ps(crow + 8 * v, last), x);
        _mm256_maskstore_ps(crow + 8 * v, last, x);
      }
    }
  }
}

using TileFn2 = void (*)(const float*, size_t, size_t, const float*, size_t, int, float, bool, float*, size_t,
                         __m256i);

// kTiles2[full last vector][rows - 1][vectors - 1]
template <int R, bool FullLast>
constexpr TileFn2 kRowTiles2[3] = {tile2<R, 1, FullLast>, tile2<R, 2, FullLast>, tile2<R, 3, FullLast>};
template <bool FullLast>
constexpr const TileFn2* kTiles2Of[kTileRows2] = {kRowTiles2<1, FullLast>, kRowTiles2<2, FullLast>,
                                                  kRowTiles2<3, FullLast>, kRowTiles2<4, FullLast>};
constexpr const TileFn2* const* kTiles2[2] = {kTiles2Of<false>, kTiles2Of<true>};

__attribute__((target("avx2,fma"))) void block_gemm_avx2(bool trans_a, int M, int N, int K, float alpha,
                                                          const float* A, int lda, const float* B, size_t ldb,
                                                          bool accumulate, float* C, int ldc) {
  const size_t a_rs = trans_a ? 1 : lda, a_ks = trans_a ? lda : 1;
  for (int j0 = 0; j0 < N; j0 += 24) {
    const int cols = N - j0 < 24 ? N - j0 : 24;
    const int nv = (cols + 7) / 8;
    const int tail = cols - 8 * (nv - 1);
    const __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i0 = 0; i0 < M; i0 += kTileRows2) {
      const int rows = M - i0 < kTileRows2 ? M - i0 : kTileRows2;
      kTiles2[tail == 8][rows - 1][nv - 1](A + i0 * a_rs, a_rs, a_ks, B + j0, ldb, K, alpha, accumulate,
                                           C + static_cast<size_t>(i0) * ldc + j0, ldc, last);
    }
  }
  _mm256_zeroupper();  // as in block_gemm_avx512
}

// GCC 12: transpose16.h says why.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// What a packing by whole w x w tiles leaves of bt = B^T, element by element: every column j of
// the rows k past the last whole tile, and the columns past the last whole tile of the others.
void pack_transposed_edges(const float* B, size_t ldb, int N, int K, float* bt, size_t ldp, int w) {
  const int nw = N / w * w, kw = K / w * w;
  for (int k = 0; k < K; k++) {
    for (int j = k < kw ? nw : 0; j < N; j++) bt[k * ldp + j] = B[j * ldb + k];
  }
}

// bt (K, N) rows of ldp = B^T for B (N rows of ldb, K columns): 16 x 16 tiles in registers, the
// edges element by element, because a scalar transpose costs a large share of the NT product
// (docs/benchmarks.md, "Figures behind choices in the code").
__attribute__((target("avx512f"))) void pack_transposed(const float* B, size_t ldb, int N, int K, float* bt,
                                                         size_t ldp) {
  const int n16 = N / 16 * 16, k16 = K / 16 * 16;
  for (int j0 = 0; j0 < n16; j0 += 16) {
    for (int k0 = 0; k0 < k16; k0 += 16) {
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(B + (j0 + i) * ldb + k0);
      transpose16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) _mm512_storeu_ps(bt + (k0 + i) * ldp + j0, r[i]);
    }
  }
  pack_transposed_edges(B, ldb, N, K, bt, ldp, 16);
}

// The same packing with 8 x 8 tiles in AVX registers (unpack, shuffle, then 128-bit lanes), for
// CPUs without AVX-512: element by element it took about 1% of an fp32 training step on a Zen 3.
__attribute__((target("avx2"))) void pack_transposed_avx2(const float* B, size_t ldb, int N, int K, float* bt,
                                                          size_t ldp) {
  const int n8 = N / 8 * 8, k8 = K / 8 * 8;
  for (int j0 = 0; j0 < n8; j0 += 8) {
    for (int k0 = 0; k0 < k8; k0 += 8) {
      __m256 r[8], t[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(B + (j0 + i) * ldb + k0);
#pragma GCC unroll 4
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
#pragma GCC unroll 2
      for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(bt + (k0 + i) * ldp + j0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(bt + (k0 + i + 4) * ldp + j0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
      }
    }
  }
  pack_transposed_edges(B, ldb, N, K, bt, ldp, 8);
}

#pragma GCC diagnostic pop

// The widest kernel the CPU has.
BlockGemmIsa cpu_isa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f")                                       ? BlockGemmIsa::kAvx512
         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? BlockGemmIsa::kAvx2Fma
                                                                            : BlockGemmIsa::kReference;
}

// cpu_isa(), or a narrower kernel ZINF_BLOCK_GEMM_ISA (avx2, reference) asks for (benchmarks of
// the AVX2 kernel on an AVX-512 CPU).
BlockGemmIsa detect_isa() {
  BlockGemmIsa isa = cpu_isa();
  const char* want = std::getenv("ZINF_BLOCK_GEMM_ISA");
  const std::string_view w = want == nullptr ? "" : want;
  if (w == "avx2" && isa == BlockGemmIsa::kAvx512) isa = BlockGemmIsa::kAvx2Fma;
  if (w == "reference") isa = BlockGemmIsa::kReference;
  if (w != "" && w != "avx2" && w != "reference") {
    log_once(LogLevel::kWarning, "ZINF_BLOCK_GEMM_ISA",
             fmt::format("ZINF_BLOCK_GEMM_ISA={}: expected avx2 or reference; using the widest kernel the CPU has", w));
  }
  return isa;
}

}  // namespace
#endif

BlockGemmIsa block_gemm_isa() {
#ifdef ZINF_BLOCK_GEMM_X86
  static const BlockGemmIsa isa = detect_isa();
  return isa;
#else
  return BlockGemmIsa::kReference;
#endif
}

bool block_gemm_supports(BlockGemmIsa isa) {
#ifdef ZINF_BLOCK_GEMM_X86
  static const BlockGemmIsa cpu = cpu_isa();  // what the CPU has, whatever ZINF_BLOCK_GEMM_ISA says
  return static_cast<int>(isa) <= static_cast<int>(cpu);
#else
  return isa == BlockGemmIsa::kReference;
#endif
}

void block_gemm_on(BlockGemmIsa isa, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                   int lda, const float* B, int ldb, bool accumulate, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef ZINF_BLOCK_GEMM_X86
  if (isa != BlockGemmIsa::kReference && block_gemm_supports(isa)) {
    const bool wide = isa == BlockGemmIsa::kAvx512;
    size_t ldp = ldb;
    if (trans_b) {  // B^T (K, N) packed with rows of N rounded up to a vector: the kernels load rows
      thread_local std::vector<float> packed;
      ldp = (static_cast<size_t>(N) + 15) / 16 * 16;
      if (packed.size() < ldp * K) packed.resize(ldp * K);
      if (wide) {
        pack_transposed(B, ldb, N, K, packed.data(), ldp);
      } else {
        pack_transposed_avx2(B, ldb, N, K, packed.data(), ldp);
      }
      B = packed.data();
    }
    if (wide) {
      block_gemm_avx512(trans_a, M, N, K, alpha, A, lda, B, ldp, accumulate, C, ldc);
    } else {
      block_gemm_avx2(trans_a, M, N, K, alpha, A, lda, B, ldp, accumulate, C, ldc);
    }
    return;
  }
#else
  (void)isa;  // only the reference off x86-64
#endif
  block_gemm_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
}

void block_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                int ldb, bool accumulate, float* C, int ldc) {
  block_gemm_on(block_gemm_isa(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc);
}

}  // namespace zinf::model::kernels::detail
