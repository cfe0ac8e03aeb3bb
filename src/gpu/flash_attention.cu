// Flash-style causal attention on the GPU: plain CUDA cores, fp32 tiles in shared memory,
// warp shuffles for the per-row softmax; no (T, T) matrix anywhere. Simple rather than
// fast: tensor-core versions can replace these once these have been checked on a GPU.
// One set of kernels serves GPT's multi-head attention (q, k, v packed in one (B,T,3C) tensor)
// and Llama's grouped-query attention (separate q, k, v; NH / NKV query heads per kv head).
#include <cmath>

#include "gpu/attention_tiles.h"
#include "gpu/flash_attention.h"
#include "gpu/kernel_util.cuh"

namespace zinf::gpu {
// Kernel parameter types: outside the anonymous namespace, because the host-side launch code nvcc
// generates must be able to name them.
namespace flash {

// Where one call's tensors live. Head h of row (b, t) of q starts at element
// (b*T + t) * q_ld + h*hs of q (dq alike); kv head g of k, v at (b*T + t) * kv_ld + g*hs of
// k, v (dk, dv alike); query head h of out and dout at (b*T + t) * o_ld + h*hs. Query head h
// reads kv head h / group. GPT: q, k, v = qkv, qkv + C, qkv + 2C, q_ld = kv_ld = 3C,
// o_ld = C, group 1.
struct AttnTensors {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  std::size_t q_ld, kv_ld, o_ld;
  int T, NH, NKV, group, hs;
};
struct AttnGrads {
  bf16* dq;
  bf16* dk;
  bf16* dv;
};

}  // namespace flash

namespace {

using flash::AttnGrads;
using flash::AttnTensors;

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

// Element offsets of (b, t = 0) of query head h (in q, dq), of kv head g (in k, v, dk, dv) and
// of query head h (in out, dout).
__device__ __forceinline__ std::size_t q_row0(const AttnTensors& a, int b, int h) {
  return static_cast<std::size_t>(b) * a.T * a.q_ld + static_cast<std::size_t>(h) * a.hs;
}
__device__ __forceinline__ std::size_t kv_row0(const AttnTensors& a, int b, int g) {
  return static_cast<std::size_t>(b) * a.T * a.kv_ld + static_cast<std::size_t>(g) * a.hs;
}
__device__ __forceinline__ std::size_t o_row0(const AttnTensors& a, int b, int h) {
  return static_cast<std::size_t>(b) * a.T * a.o_ld + static_cast<std::size_t>(h) * a.hs;
}

struct Heads {
  HeadView q, k, v;      // query head h; kv head h / group
  std::size_t q_row0;    // as q_row0(), kv_row0(), o_row0()
  std::size_t kv_row0;
  std::size_t out_row0;
};

__device__ Heads heads_of(const AttnTensors& a, int b, int h) {
  Heads x;
  x.q_row0 = q_row0(a, b, h);
  x.kv_row0 = kv_row0(a, b, h / a.group);
  x.out_row0 = o_row0(a, b, h);
  x.q = HeadView{a.q + x.q_row0, a.q_ld};
  x.k = HeadView{a.k + x.kv_row0, a.kv_ld};
  x.v = HeadView{a.v + x.kv_row0, a.kv_ld};
  return x;
}

// Grid (q_tiles, B*NH). Warp w owns query rows q0 + w*kAttnRowsPerWarp + rr; lane j scores key
// k0 + j of each key tile; each lane keeps P = ceil(hs/32) output columns (lane + 32 i).
template <int P>
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(bf16* out, float* lse, AttnTensors a, float scale) {
  extern __shared__ float smem[];
  const int T = a.T;
  const int hs = a.hs;
  float* qs = smem;                       // (kAttnQTile, hs)
  float* ks = qs + kAttnQTile * hs;       // (kAttnKTile, hs + 1)
  float* vs = ks + kAttnKTile * (hs + 1); // (kAttnKTile, hs)
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / a.NH;
  const int h = bh % a.NH;
  const int q0 = static_cast<int>(blockIdx.x) * kAttnQTile;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const Heads x = heads_of(a, b, h);
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
    bf16* orow = out + x.out_row0 + static_cast<std::size_t>(row) * a.o_ld;
#pragma unroll
    for (int i = 0; i < P; i++) {
      const int d = lane + 32 * i;
      if (d < hs) orow[d] = to_bf16(o[rr][i] * inv);
    }
    if (lane == 0) lse[static_cast<std::size_t>(bh) * T + row] = m[rr] + logf(l[rr]);
  }
}

// dsum[(b*NH + h)*T + t] = dout . out over query head h's hs columns; one warp per row.
__global__ void attention_row_dot_kernel(float* dsum, const bf16* dout, const bf16* out, AttnTensors a,
                                         long long rows) {
  const long long idx = static_cast<long long>(blockIdx.x) * kAttnWarps + threadIdx.x / 32;
  if (idx >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long bh = idx / a.T;
  const int t = static_cast<int>(idx % a.T);
  const int b = static_cast<int>(bh / a.NH);
  const int h = static_cast<int>(bh % a.NH);
  const std::size_t base = o_row0(a, b, h) + static_cast<std::size_t>(t) * a.o_ld;
  float acc = 0.0f;
  for (int d = lane; d < a.hs; d += 32) acc += to_f32(dout[base + d]) * to_f32(out[base + d]);
  acc = warp_sum(acc);
  if (lane == 0) dsum[idx] = acc;
}

// dQ: grid (q_tiles, B*NH), rows as in the forward; lane j handles key k0 + j.
// dS = P * (dP - D) * scale, dQ = dS @ K.
template <int P>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(AttnGrads grads, const bf16* dout, AttnTensors a, const float* lse,
                                 const float* dsum, float scale) {
  extern __shared__ float smem[];
  const int T = a.T;
  const int hs = a.hs;
  float* qs = smem;                        // (kAttnQTile, hs)
  float* dos = qs + kAttnQTile * hs;       // (kAttnQTile, hs)
  float* ks = dos + kAttnQTile * hs;       // (kAttnKTile, hs + 1)
  float* vs = ks + kAttnKTile * (hs + 1);  // (kAttnKTile, hs + 1)
  const int bh = static_cast<int>(blockIdx.y);
  const int b = bh / a.NH;
  const int h = bh % a.NH;
  const int q0 = static_cast<int>(blockIdx.x) * kAttnQTile;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const Heads x = heads_of(a, b, h);
  load_rows(qs, hs, x.q, q0, kAttnQTile, T, hs);
  load_rows(dos, hs, HeadView{dout + x.out_row0, a.o_ld}, q0, kAttnQTile, T, hs);

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
    bf16* dq_row = grads.dq + x.q_row0 + static_cast<std::size_t>(row) * a.q_ld;
#pragma unroll
    for (int i = 0; i < P; i++) {
      const int d = lane + 32 * i;
      if (d < hs) dq_row[d] = to_bf16(dq[rr][i]);
    }
  }
}

// dK, dV: grid (k_tiles, B*NKV): one block per key tile of one kv head. For each query head of
// the kv head's group in head order, warp w's keys key0 + w*kAttnKeysPerWarp + kk take the
// query tiles from the diagonal down, lane j handling row q0 + j. dV = P^T @ dO, dK = dS^T @ Q,
// summed over the group's heads in registers (fp32) and rounded once.
template <int P>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkv_kernel(AttnGrads grads, const bf16* dout, AttnTensors a, const float* lse,
                                  const float* dsum, float scale) {
  extern __shared__ float smem[];
  const int T = a.T;
  const int hs = a.hs;
  float* qs = smem;                         // (kAttnKTile, hs + 1)
  float* dos = qs + kAttnKTile * (hs + 1);  // (kAttnKTile, hs + 1)
  float* ks = dos + kAttnKTile * (hs + 1);  // (kAttnKTile, hs)
  float* vs = ks + kAttnKTile * hs;         // (kAttnKTile, hs)
  float* lse_s = vs + kAttnKTile * hs;      // (kAttnKTile)
  float* d_s = lse_s + kAttnKTile;          // (kAttnKTile)
  const int bg = static_cast<int>(blockIdx.y);
  const int b = bg / a.NKV;
  const int g = bg % a.NKV;
  const int key0 = static_cast<int>(blockIdx.x) * kAttnKTile;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::size_t kv0 = kv_row0(a, b, g);
  load_rows(ks, hs, HeadView{a.k + kv0, a.kv_ld}, key0, kAttnKTile, T, hs);
  load_rows(vs, hs, HeadView{a.v + kv0, a.kv_ld}, key0, kAttnKTile, T, hs);

  float dk[kAttnKeysPerWarp][P];
  float dv[kAttnKeysPerWarp][P];
#pragma unroll
  for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
#pragma unroll
    for (int i = 0; i < P; i++) dk[kk][i] = dv[kk][i] = 0.0f;
  }
  for (int h = g * a.group; h < (g + 1) * a.group; h++) {
    const int bh = b * a.NH + h;
    const HeadView qv{a.q + q_row0(a, b, h), a.q_ld};
    const HeadView dov{dout + o_row0(a, b, h), a.o_ld};
    // Query tiles start at the key tile: rows above it see none of its keys.
    for (int q0 = key0; q0 < T; q0 += kAttnKTile) {
      __syncthreads();  // the previous tile's (or head's) readers are done
      load_rows(qs, hs + 1, qv, q0, kAttnKTile, T, hs);
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
  }
#pragma unroll
  for (int kk = 0; kk < kAttnKeysPerWarp; kk++) {
    const int key = attn::dkv_key(key0, warp, kk);
    if (key >= T) continue;
    const std::size_t at = kv0 + static_cast<std::size_t>(key) * a.kv_ld;
    bf16* dk_row = grads.dk + at;
    bf16* dv_row = grads.dv + at;
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
Status allow_smem(Kernel kernel, std::size_t bytes, const std::string& name, std::initializer_list<Dim> dims) {
  if (bytes <= 48 * 1024) return Status::ok();
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     describe(name.c_str(), dims) + ": cudaFuncSetAttribute(MaxDynamicSharedMemorySize " +
                         std::to_string(bytes) + ")");
}

// `name` is the public function ("attention_forward", "gqa_attention_backward"); errors and
// launch failures name it, its sizes `dims`, and the kernel's part.
template <int P>
Status forward_impl(const AttentionGeometry& g, bf16* out, float* lse, const AttnTensors& a, float scale,
                    const std::string& name, std::initializer_list<Dim> dims, cudaStream_t stream) {
  ZINF_RETURN_IF_ERROR(allow_smem(attention_forward_kernel<P>, g.forward_smem, name, dims));
  const dim3 grid(g.q_tiles, g.heads);
  attention_forward_kernel<P><<<grid, kAttnThreads, g.forward_smem, stream>>>(out, lse, a, scale);
  return launched(name.c_str(), dims);
}

template <int P>
Status backward_impl(const AttentionGeometry& g, const AttnGrads& grads, const float* dsum, const bf16* dout,
                     const AttnTensors& a, const float* lse, float scale, const std::string& name,
                     std::initializer_list<Dim> dims, cudaStream_t stream) {
  const std::string dkv = name + " (dK, dV)";
  const std::string dq = name + " (dQ)";
  ZINF_RETURN_IF_ERROR(allow_smem(attention_backward_dkv_kernel<P>, g.dkv_smem, dkv, dims));
  ZINF_RETURN_IF_ERROR(allow_smem(attention_backward_dq_kernel<P>, g.dq_smem, dq, dims));
  attention_backward_dkv_kernel<P><<<dim3(g.k_tiles, g.kv_heads), kAttnThreads, g.dkv_smem, stream>>>(
      grads, dout, a, lse, dsum, scale);
  ZINF_RETURN_IF_ERROR(launched(dkv.c_str(), dims));
  attention_backward_dq_kernel<P><<<dim3(g.q_tiles, g.heads), kAttnThreads, g.dq_smem, stream>>>(grads, dout, a, lse,
                                                                                                  dsum, scale);
  return launched(dq.c_str(), dims);
}

float score_scale(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }  // as the CPU kernels

Status run_forward(const AttentionGeometry& g, bf16* out, float* lse, const AttnTensors& a, const std::string& name,
                   std::initializer_list<Dim> dims, cudaStream_t stream) {
  const float scale = score_scale(g.hs);
  switch (g.per_lane) {
    case 1: return forward_impl<1>(g, out, lse, a, scale, name, dims, stream);
    case 2: return forward_impl<2>(g, out, lse, a, scale, name, dims, stream);
    case 3: return forward_impl<3>(g, out, lse, a, scale, name, dims, stream);
    case 4: return forward_impl<4>(g, out, lse, a, scale, name, dims, stream);
    default: break;
  }
  return Status::internal(name + ": per_lane " + std::to_string(g.per_lane) + " outside 1..4");
}

// scratch: B*NH*T floats for D = rowsum(dO * O).
Status run_backward(const AttentionGeometry& g, const AttnGrads& grads, float* scratch, const bf16* dout,
                    const AttnTensors& a, const bf16* out, const float* lse, int B, const std::string& name,
                    std::initializer_list<Dim> dims, cudaStream_t stream) {
  const long long rows = static_cast<long long>(B) * a.NH * a.T;
  const long long blocks = (rows + kAttnWarps - 1) / kAttnWarps;
  if (blocks > 0x7fffffffLL) return Status::unsupported(describe(name.c_str(), dims) + ": too many rows");
  attention_row_dot_kernel<<<static_cast<unsigned>(blocks), kAttnThreads, 0, stream>>>(scratch, dout, out, a, rows);
  ZINF_RETURN_IF_ERROR(launched((name + " (row sums)").c_str(), dims));
  const float scale = score_scale(g.hs);
  switch (g.per_lane) {
    case 1: return backward_impl<1>(g, grads, scratch, dout, a, lse, scale, name, dims, stream);
    case 2: return backward_impl<2>(g, grads, scratch, dout, a, lse, scale, name, dims, stream);
    case 3: return backward_impl<3>(g, grads, scratch, dout, a, lse, scale, name, dims, stream);
    case 4: return backward_impl<4>(g, grads, scratch, dout, a, lse, scale, name, dims, stream);
    default: break;
  }
  return Status::internal(name + ": per_lane " + std::to_string(g.per_lane) + " outside 1..4");
}

// GPT: q, k, v packed in qkv (B,T,3C), one kv head per query head.
AttnTensors packed_qkv(const bf16* qkv, const AttentionGeometry& g, int T, int C, int NH) {
  const std::size_t c = static_cast<std::size_t>(C);
  return AttnTensors{qkv, qkv + c, qkv + 2 * c, 3 * c, 3 * c, c, T, NH, NH, 1, g.hs};
}

// Llama: dense q, out (B,T,NH*hs) and k, v (B,T,NKV*hs).
AttnTensors separate_qkv(const bf16* q, const bf16* k, const bf16* v, const GqaShape& s) {
  const std::size_t hs = static_cast<std::size_t>(s.hs);
  const std::size_t qw = static_cast<std::size_t>(s.NH) * hs;
  const std::size_t kvw = static_cast<std::size_t>(s.NKV) * hs;
  return AttnTensors{q, k, v, qw, kvw, qw, s.T, s.NH, s.NKV, s.NH / s.NKV, s.hs};
}

}  // namespace

Status attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  ZINF_ASSIGN_OR_RETURN(const AttentionGeometry g, attention_geometry(B, T, C, NH));
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  return run_forward(g, out, lse, packed_qkv(qkv, g, T, C, NH), "attention_forward", dims, stream);
}

Status attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                          const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  ZINF_ASSIGN_OR_RETURN(const AttentionGeometry g, attention_geometry(B, T, C, NH));
  const auto dims = {Dim{"B", B}, Dim{"T", T}, Dim{"C", C}, Dim{"NH", NH}};
  const std::size_t c = static_cast<std::size_t>(C);
  const AttnGrads grads{dqkv, dqkv + c, dqkv + 2 * c};
  return run_backward(g, grads, scratch, dout, packed_qkv(qkv, g, T, C, NH), out, lse, B, "attention_backward", dims,
                      stream);
}

Status gqa_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const GqaShape& s,
                             cudaStream_t stream) {
  ZINF_ASSIGN_OR_RETURN(const AttentionGeometry g, gqa_attention_geometry(s.B, s.T, s.NH, s.NKV, s.hs));
  const auto dims = {Dim{"B", s.B}, Dim{"T", s.T}, Dim{"NH", s.NH}, Dim{"NKV", s.NKV}, Dim{"hs", s.hs}};
  return run_forward(g, out, lse, separate_qkv(q, k, v, s), "gqa_attention_forward", dims, stream);
}

Status gqa_attention_backward(bf16* dq, bf16* dk, bf16* dv, float* scratch, const bf16* dout, const bf16* q,
                              const bf16* k, const bf16* v, const bf16* out, const float* lse, const GqaShape& s,
                              cudaStream_t stream) {
  ZINF_ASSIGN_OR_RETURN(const AttentionGeometry g, gqa_attention_geometry(s.B, s.T, s.NH, s.NKV, s.hs));
  const auto dims = {Dim{"B", s.B}, Dim{"T", s.T}, Dim{"NH", s.NH}, Dim{"NKV", s.NKV}, Dim{"hs", s.hs}};
  return run_backward(g, AttnGrads{dq, dk, dv}, scratch, dout, separate_qkv(q, k, v, s), out, lse, s.B,
                      "gqa_attention_backward", dims, stream);
}

}  // namespace zinf::gpu
