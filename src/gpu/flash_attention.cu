// Flash-style causal attention on the GPU: plain CUDA cores, fp32 tiles in shared memory,
// warp shuffles for the per-row softmax; no (T, T) matrix anywhere. Simple rather than
// fast: tensor-core versions can replace these once these have been checked on a GPU.
#include <cmath>

#include "gpu/attention_tiles.h"
#include "gpu/flash_attention.h"
#include "gpu/kernel_util.cuh"

namespace zinf::gpu {
namespace {

using detail::kFullMask;
using detail::to_bf16;
using detail::to_f32;
using detail::warp_max;
using detail::warp_sum;

constexpr int kAttnThreads = kAttnWarps * 32;

// The head's view of a (B,T,*) tensor: rows `pitch` elements apart, the head's hs columns
// starting at `base`.
struct HeadView {
  const bf16* base;
  std::size_t pitch;
};

// `rows` rows of the head from row `first` into shared memory as fp32, `stride` floats apart;
// rows at or past T are zero. All threads of the block call it.
__device__ void load_rows(float* dst, int stride, HeadView v, int first, int rows, int T, int hs) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * hs; i += static_cast<int>(blockDim.x)) {
    const int r = i / hs;
    const int d = i % hs;
    const int t = first + r;
    dst[r * stride + d] = t < T ? to_f32(v.base[static_cast<std::size_t>(t) * v.pitch + d]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* x, const float* y, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; d++) s += x[d] * y[d];
  return s;
}

struct Heads {
  HeadView q, k, v;  // in qkv
  std::size_t qkv_row0;  // element offset of (b, t = 0, head h's q column) in qkv / dqkv
  std::size_t out_row0;  // element offset of (b, t = 0, h*hs) in out / dout
};

__device__ Heads heads_of(const bf16* qkv, int b, int h, int T, int C, int hs) {
  const std::size_t pitch = 3 * static_cast<std::size_t>(C);
  Heads x;
  x.qkv_row0 = static_cast<std::size_t>(b) * T * pitch + static_cast<std::size_t>(h) * hs;
  x.out_row0 = static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
  x.q = HeadView{qkv + x.qkv_row0, pitch};
  x.k = HeadView{qkv + x.qkv_row0 + C, pitch};
  x.v = HeadView{qkv + x.qkv_row0 + 2 * static_cast<std::size_t>(C), pitch};
  return x;
}

// Grid (q_tiles, B*NH). Warp w owns query rows q0 + w*kAttnRowsPerWarp + rr; lane j scores key
// k0 + j of each key tile; each lane keeps P = ceil(hs/32) output columns (lane + 32 i).
template <int P>
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH, int hs, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                       // (kAttnQTile, hs)
  float* ks = qs + kAttnQTile * hs;       // (kAttnKTile, hs + 1)
  float* vs = ks + kAttnKTile * (hs + 1); // (kAttnKTile, hs)
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / NH;
  const int h = bh % NH;
  const int q0 = static_cast<int>(blockIdx.x) * kAttnQTile;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const Heads x = heads_of(qkv, b, h, T, C, hs);
  load_rows(qs, hs, x.q, q0, kAttnQTile, T, hs);

  float m[kAttnRowsPerWarp];
  float l[kAttnRowsPerWarp];
  float o[kAttnRowsPerWarp][P];
#pragma unroll
  for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < P; i++) o[rr][i] = 0.0f;
  }
  const int last = attn::last_row(q0, T);
  for (int k0 = 0; k0 <= last; k0 += kAttnKTile) {
    __syncthreads();  // the previous tile's readers are done; the q tile is in place
    load_rows(ks, hs + 1, x.k, k0, kAttnKTile, T, hs);
    load_rows(vs, hs, x.v, k0, kAttnKTile, T, hs);
    __syncthreads();
    const int key = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
      const int rl = warp * kAttnRowsPerWarp + rr;
      const int row = attn::query_row(q0, warp, rr);
      if (!attn::row_active(row, k0, T)) continue;  // the same for the whole warp
      const bool visible = key <= row;               // key k0 (lane 0) always is: the tile max is finite
      const float s = visible ? dot(qs + rl * hs, ks + lane * (hs + 1), hs) * scale : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float alpha = expf(m[rr] - m_new);  // 0 on the first tile (m = -inf)
      const float p = visible ? expf(s - m_new) : 0.0f;
      l[rr] = l[rr] * alpha + warp_sum(p);
#pragma unroll
      for (int i = 0; i < P; i++) o[rr][i] *= alpha;
      const int n = attn::keys_seen(row, k0);
      for (int j = 0; j < n; j++) {
        const float pj = __shfl_sync(kFullMask, p, j);
#pragma unroll
        for (int i = 0; i < P; i++) {
          const int d = lane + 32 * i;
          if (d < hs) o[rr][i] += pj * vs[j * hs + d];
        }
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
    const int row = attn::query_row(q0, warp, rr);
    if (row >= T) continue;
    const float inv = 1.0f / l[rr];
    bf16* orow = out + x.out_row0 + static_cast<std::size_t>(row) * C;
#pragma unroll
    for (int i = 0; i < P; i++) {
      const int d = lane + 32 * i;
      if (d < hs) orow[d] = to_bf16(o[rr][i] * inv);
    }
    if (lane == 0) lse[static_cast<std::size_t>(bh) * T + row] = m[rr] + logf(l[rr]);
  }
}

// dsum[(b*NH + h)*T + t] = dout . out over the head's hs columns; one warp per row.
__global__ void attention_row_dot_kernel(float* dsum, const bf16* dout, const bf16* out, int T, int C, int NH, int hs,
                                         long long rows) {
  const long long idx = static_cast<long long>(blockIdx.x) * kAttnWarps + threadIdx.x / 32;
  if (idx >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long bh = idx / T;
  const int t = static_cast<int>(idx % T);
  const int b = static_cast<int>(bh / NH);
  const int h = static_cast<int>(bh % NH);
  const std::size_t base = (static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs;
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += to_f32(dout[base + d]) * to_f32(out[base + d]);
  acc = warp_sum(acc);
  if (lane == 0) dsum[idx] = acc;
}

// dQ: grid (q_tiles, B*NH), rows as in the forward; lane j handles key k0 + j.
// dS = P * (dP - D) * scale, dQ = dS @ K.
template <int P>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dsum,
                                 int T, int C, int NH, int hs, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                        // (kAttnQTile, hs)
  float* dos = qs + kAttnQTile * hs;       // (kAttnQTile, hs)
  float* ks = dos + kAttnQTile * hs;       // (kAttnKTile, hs + 1)
  float* vs = ks + kAttnKTile * (hs + 1);  // (kAttnKTile, hs + 1)
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / NH;
  const int h = bh % NH;
  const int q0 = static_cast<int>(blockIdx.x) * kAttnQTile;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const Heads x = heads_of(qkv, b, h, T, C, hs);
  load_rows(qs, hs, x.q, q0, kAttnQTile, T, hs);
  load_rows(dos, hs, HeadView{dout + x.out_row0, static_cast<std::size_t>(C)}, q0, kAttnQTile, T, hs);

  float row_lse[kAttnRowsPerWarp];
  float row_d[kAttnRowsPerWarp];
  float dq[kAttnRowsPerWarp][P];
#pragma unroll
  for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
    const int row = attn::query_row(q0, warp, rr);
    const std::size_t at = static_cast<std::size_t>(bh) * T + row;
    row_lse[rr] = row < T ? lse[at] : 0.0f;
    row_d[rr] = row < T ? dsum[at] : 0.0f;
#pragma unroll
    for (int i = 0; i < P; i++) dq[rr][i] = 0.0f;
  }
  const int last = attn::last_row(q0, T);
  for (int k0 = 0; k0 <= last; k0 += kAttnKTile) {
    __syncthreads();
    load_rows(ks, hs + 1, x.k, k0, kAttnKTile, T, hs);
    load_rows(vs, hs + 1, x.v, k0, kAttnKTile, T, hs);
    __syncthreads();
    const int key = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
      const int rl = warp * kAttnRowsPerWarp + rr;
      const int row = attn::query_row(q0, warp, rr);
      if (!attn::row_active(row, k0, T)) continue;
      float ds = 0.0f;
      if (key <= row) {
        const float p = expf(dot(qs + rl * hs, ks + lane * (hs + 1), hs) * scale - row_lse[rr]);
        const float dp = dot(dos + rl * hs, vs + lane * (hs + 1), hs);
        ds = p * (dp - row_d[rr]) * scale;
      }
      const int n = attn::keys_seen(row, k0);
      for (int j = 0; j < n; j++) {
        const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
        for (int i = 0; i < P; i++) {
          const int d = lane + 32 * i;
          if (d < hs) dq[rr][i] += dsj * ks[j * (hs + 1) + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kAttnRowsPerWarp; rr++) {
    const int row = attn::query_row(q0, warp, rr);
    if (row >= T) continue;
    bf16* dq_row = dqkv + x.qkv_row0 + static_cast<std::size_t>(row) * x.q.pitch;
#pragma unroll
    for (int i = 0; i < P; i++) {
      const int d = lane + 32 * i;
      if (d < hs) dq_row[d] = to_bf16(dq[rr][i]);
    }
  }
}

// dK, dV: grid (k_tiles, B*NH). Warp w owns keys key0 + w*kAttnKeysPerWarp + kk; lane j
// handles query row q0 + j of each query tile from the diagonal down.
// dV = P^T @ dO, dK = dS^T @ Q.
template <int P>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dsum,
                                  int T, int C, int NH, int hs, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                         // (kAttnKTile, hs + 1)
  float* dos = qs + kAttnKTile * (hs + 1);  // (kAttnKTile, hs + 1)
  float* ks = dos + kAttnKTile * (hs + 1);  // (kAttnKTile, hs)
  float* vs = ks + kAttnKTile * hs;         // (kAttnKTile, hs)
  float* lse_s = vs + kAttnKTile * hs;      // (kAttnKTile)
  float* d_s = lse_s + kAttnKTile;          // (kAttnKTile)
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / NH;
  const int h = bh % NH;
  const int key0 = static_cast<int>(blockIdx.x) * kAttnKTile;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const Heads x = heads_of(qkv, b, h, T, C, hs);
  const HeadView dov{dout + x.out_row0, static_cast<std::size_t>(C)};
  load_rows(ks, hs, x.k, key0, kAttnKTile, T, hs);
  load_rows(vs, hs, x.v, key0, kAttnKTile, T, hs);

  float dk[kAttnKeysPerWarp][P];
  float dv[kAttnKeysPerWarp][P];
#pragma unroll
  for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
#pragma unroll
    for (int i = 0; i < P; i++) dk[kk][i] = dv[kk][i] = 0.0f;
  }
  // Query tiles start at the key tile: rows above it see none of its keys.
  for (int q0 = key0; q0 < T; q0 += kAttnKTile) {
    __syncthreads();
    load_rows(qs, hs + 1, x.q, q0, kAttnKTile, T, hs);
    load_rows(dos, hs + 1, dov, q0, kAttnKTile, T, hs);
    if (threadIdx.x < kAttnKTile) {
      const int row = q0 + static_cast<int>(threadIdx.x);
      const std::size_t at = static_cast<std::size_t>(bh) * T + row;
      lse_s[threadIdx.x] = row < T ? lse[at] : 0.0f;
      d_s[threadIdx.x] = row < T ? dsum[at] : 0.0f;
    }
    __syncthreads();
    const int row = q0 + lane;
    const int rows_here = attn::dkv_rows_here(q0, T);
#pragma unroll
    for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
      const int kl = warp * kAttnKeysPerWarp + kk;
      const int key = attn::dkv_key(key0, warp, kk);
      if (key >= T) continue;  // the same for the whole warp
      float p = 0.0f;
      float ds = 0.0f;
      if (row < T && key <= row) {
        p = expf(dot(qs + lane * (hs + 1), ks + kl * hs, hs) * scale - lse_s[lane]);
        const float dp = dot(dos + lane * (hs + 1), vs + kl * hs, hs);
        ds = p * (dp - d_s[lane]) * scale;
      }
      // Rows j of the tile that see the key: q0 + j >= key.
      for (int j = attn::dkv_first_row(key, q0); j < rows_here; j++) {
        const float pj = __shfl_sync(kFullMask, p, j);
        const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
        for (int i = 0; i < P; i++) {
          const int d = lane + 32 * i;
          if (d < hs) {
            dv[kk][i] += pj * dos[j * (hs + 1) + d];
            dk[kk][i] += dsj * qs[j * (hs + 1) + d];
          }
        }
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
    const int key = attn::dkv_key(key0, warp, kk);
    if (key >= T) continue;
    bf16* dk_row = dqkv + x.qkv_row0 + static_cast<std::size_t>(key) * x.q.pitch + C;
    bf16* dv_row = dk_row + C;
#pragma unroll
    for (int i = 0; i < P; i++) {
      const int d = lane + 32 * i;
      if (d < hs) {
        dk_row[d] = to_bf16(dk[kk][i]);
        dv_row[d] = to_bf16(dv[kk][i]);
      }
    }
  }
}

// Allows `bytes` of dynamic shared memory for `kernel` when above the default 48 KiB.
template <typename Kernel>
Status allow_smem(Kernel kernel, std::size_t bytes, const char* name, std::initializer_list<Dim> dims) {
  if (bytes <= 48 * 1024) return Status::ok();
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     describe(name, dims) + ": cudaFuncSetAttribute(MaxDynamicSharedMemorySize " +
                         std::to_string(bytes) + ")");
}

template <int P>
Status forward_impl(const AttentionGeometry& g, bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                    float scale, cudaStream_t stream) {
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  ZINF_RETURN_IF_ERROR(allow_smem(attention_forward_kernel<P>, g.forward_smem, "attention_forward", dims));
  const dim3 grid(g.q_tiles, g.heads);
  attention_forward_kernel<P><<<grid, kAttnThreads, g.forward_smem, stream>>>(out, lse, qkv, T, C, NH, g.hs, scale);
  return launched("attention_forward", dims);
}

template <int P>
Status backward_impl(const AttentionGeometry& g, bf16* dqkv, const float* dsum, const bf16* dout, const bf16* qkv,
                     const float* lse, int B, int T, int C, int NH, float scale, cudaStream_t stream) {
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  ZINF_RETURN_IF_ERROR(allow_smem(attention_backward_dkv_kernel<P>, g.dkv_smem, "attention_backward (dK, dV)", dims));
  ZINF_RETURN_IF_ERROR(allow_smem(attention_backward_dq_kernel<P>, g.dq_smem, "attention_backward (dQ)", dims));
  attention_backward_dkv_kernel<P><<<dim3(g.k_tiles, g.heads), kAttnThreads, g.dkv_smem, stream>>>(
      dqkv, dout, qkv, lse, dsum, T, C, NH, g.hs, scale);
  ZINF_RETURN_IF_ERROR(launched("attention_backward (dK, dV)", dims));
  attention_backward_dq_kernel<P><<<dim3(g.q_tiles, g.heads), kAttnThreads, g.dq_smem, stream>>>(
      dqkv, dout, qkv, lse, dsum, T, C, NH, g.hs, scale);
  return launched("attention_backward (dQ)", dims);
}

float score_scale(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }  // as the CPU kernels

}  // namespace

Status attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  ZINF_ASSIGN_OR_RETURN(const AttentionGeometry g, attention_geometry(B, T, C, NH));
  const float scale = score_scale(g.hs);
  switch (g.per_lane) {
    case 1: return forward_impl<1>(g, out, lse, qkv, B, T, C, NH, scale, stream);
    case 2: return forward_impl<2>(g, out, lse, qkv, B, T, C, NH, scale, stream);
    case 3: return forward_impl<3>(g, out, lse, qkv, B, T, C, NH, scale, stream);
    case 4: return forward_impl<4>(g, out, lse, qkv, B, T, C, NH, scale, stream);
    default: break;
  }
  return Status::internal("attention_forward: per_lane " + std::to_string(g.per_lane) + " outside 1..4");
}

Status attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                          const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  ZINF_ASSIGN_OR_RETURN(const AttentionGeometry g, attention_geometry(B, T, C, NH));
  const long long rows = static_cast<long long>(B) * NH * T;
  const long long blocks = (rows + kAttnWarps - 1) / kAttnWarps;
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  if (blocks > 0x7fffffffLL) return Status::unsupported(describe("attention_backward", dims) + ": too many rows");
  attention_row_dot_kernel<<<static_cast<unsigned>(blocks), kAttnThreads, 0, stream>>>(scratch, dout, out, T, C, NH,
                                                                                      g.hs, rows);
  ZINF_RETURN_IF_ERROR(launched("attention_backward (row sums)", dims));
  const float scale = score_scale(g.hs);
  switch (g.per_lane) {
    case 1: return backward_impl<1>(g, dqkv, scratch, dout, qkv, lse, B, T, C, NH, scale, stream);
    case 2: return backward_impl<2>(g, dqkv, scratch, dout, qkv, lse, B, T, C, NH, scale, stream);
    case 3: return backward_impl<3>(g, dqkv, scratch, dout, qkv, lse, B, T, C, NH, scale, stream);
    case 4: return backward_impl<4>(g, dqkv, scratch, dout, qkv, lse, B, T, C, NH, scale, stream);
    default: break;
  }
  return Status::internal("attention_backward: per_lane " + std::to_string(g.per_lane) + " outside 1..4");
}

}  // namespace zinf::gpu
