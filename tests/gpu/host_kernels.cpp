// The GPU kernel API LlamaGpu calls (kernels.h, llama_kernels.h, gemm_attention.h, blas.h's linear
// layers, and the three CUDA runtime calls of its passes) on the host: "device" pointers are host
// memory, each function does what its header's contract says in plain fp32 loops with one bf16
// rounding per output, and nothing runs asynchronously. Linked (instead of libzinf_gpu and
// libcudart) into gpu_llama_host_test, it runs LlamaGpu's composition (argument order, buffers,
// shapes, the backward's algebra) against the CPU LlamaModel on any machine. It does not test the
// kernels themselves: gpu_kernels_test does, on a GPU, against the same contracts.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/blas.h"
#include "gpu/cuda_error.h"
#include "gpu/gemm_attention.h"
#include "gpu/kernels.h"
#include "gpu/llama_kernels.h"
#include "model/llama_kernels.h"
#include "zinf/optim/half.h"

namespace zinf::gpu {

static float f(const bf16& x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return optim::bf16_bits_to_f32(b);
}
static bf16 h(float v) {
  uint16_t b = optim::f32_to_bf16_bits(v);
  bf16 r;
  std::memcpy(static_cast<void*>(&r), &b, 2);
  return r;
}

Status cuda_status(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::internal(std::string(what));
}

Status embedding_forward(bf16* out, const int32_t* ids, const bf16* wte, const bf16* wpe, int B, int T, int C, int V,
                         cudaStream_t) {
  for (int n = 0; n < B * T; n++)
    for (int c = 0; c < C; c++) {
      int id = ids[n];
      if (id < 0 || id >= V) return Status::internal("bad id");
      float v = f(wte[(size_t)id * C + c]);
      if (wpe) v += f(wpe[(size_t)(n % T) * C + c]);
      out[(size_t)n * C + c] = h(v);
    }
  return Status::ok();
}
Status embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* starts,
                          const int32_t* positions, int num_tokens, int B, int T, int C, cudaStream_t) {
  if (dwpe) {
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        float a = 0;
        for (int b = 0; b < B; b++) a += dout[((size_t)b * T + t) * C + c];
        dwpe[(size_t)t * C + c] += a;
      }
  }
  for (int i = 0; i < num_tokens; i++)
    for (int c = 0; c < C; c++) {
      float a = 0;
      for (int p = starts[i]; p < starts[i + 1]; p++) a += dout[(size_t)positions[p] * C + c];
      dwte[(size_t)tokens[i] * C + c] += a;
    }
  return Status::ok();
}
Status cast_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t) {
  for (size_t i = 0; i < n; i++) out[i] = h(in[i]);
  return Status::ok();
}
Status column_sum_add(float* out, float*, const float* x, int N, int C, int ld, cudaStream_t) {
  for (int c = 0; c < C; c++) {
    float a = 0;
    for (int n = 0; n < N; n++) a += x[(size_t)n * ld + c];
    out[c] += a;
  }
  return Status::ok();
}
Status column_sum_add(float* out, float*, const bf16* x, int N, int C, int ld, cudaStream_t) {
  for (int c = 0; c < C; c++) {
    float a = 0;
    for (int n = 0; n < N; n++) a += f(x[(size_t)n * ld + c]);
    out[c] += a;
  }
  return Status::ok();
}
Status softmax_xent(bf16* logits, float* losses, const int32_t* targets, int N, int V, int ld, float dloss,
                    bool write_grad, cudaStream_t) {
  if (ld < V) return Status::internal("ld");
  for (int n = 0; n < N; n++) {
    bf16* row = logits + (size_t)n * ld;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = std::max(mx, f(row[j]));
    double sum = 0;
    for (int j = 0; j < V; j++) sum += std::exp((double)f(row[j]) - mx);
    losses[n] = (float)(mx + std::log(sum) - f(row[targets[n]]));
    if (write_grad) {
      std::vector<float> p(V);
      for (int j = 0; j < V; j++) p[j] = (float)(std::exp((double)f(row[j]) - mx) / sum);
      for (int j = 0; j < V; j++) row[j] = h((p[j] - (j == targets[n] ? 1.f : 0.f)) * dloss);
    }
  }
  return Status::ok();
}
Status mean_loss(float* out, const float* losses, int N, cudaStream_t) {
  double s = 0;
  for (int n = 0; n < N; n++) s += losses[n];
  *out = (float)(s / N);
  return Status::ok();
}

Status rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, float eps, int N, int C,
                       cudaStream_t) {
  for (int n = 0; n < N; n++) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += (double)f(inp[(size_t)n * C + c]) * f(inp[(size_t)n * C + c]);
    float r = 1.0f / std::sqrt((float)(ss / C) + eps);
    rstd[n] = r;
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = h(f(weight[c]) * (f(inp[(size_t)n * C + c]) * r));
  }
  return Status::ok();
}
Status summed_rmsnorm_backward(float* dinp, float* dweight, float*, const bf16* d0, const bf16* d1, const bf16* d2,
                               const bf16* inp, const bf16* weight, const float* rstd, int N, int C, cudaStream_t) {
  for (int n = 0; n < N; n++) {
    std::vector<float> dout(C), norm(C);
    double m = 0;
    for (int c = 0; c < C; c++) {
      size_t i = (size_t)n * C + c;
      dout[c] = f(d0[i]) + (d1 ? f(d1[i]) : 0.f) + (d2 ? f(d2[i]) : 0.f);
      norm[c] = f(inp[i]) * rstd[n];
      m += (double)dout[c] * f(weight[c]) * norm[c];
    }
    m /= C;
    for (int c = 0; c < C; c++) {
      dinp[(size_t)n * C + c] += (float)((dout[c] * f(weight[c]) - norm[c] * m) * rstd[n]);
      dweight[c] += norm[c] * dout[c];
    }
  }
  return Status::ok();
}
Status rmsnorm_backward(float* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* rstd, int N, int C, cudaStream_t s) {
  return summed_rmsnorm_backward(dinp, dweight, scratch, dout, nullptr, nullptr, inp, weight, rstd, N, C, s);
}
static Status rope(bf16* x, const float* cos, const float* sin, int rows, int B, int T, int nh, int hd, float sign) {
  if (rows < T) return Status::internal("rope rows < T");
  const int half = hd / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int hh = 0; hh < nh; hh++)
        for (int i = 0; i < half; i++) {
          bf16* p = x + (((size_t)b * T + t) * nh + hh) * hd;
          float c = cos[(size_t)t * half + i], s = sign * sin[(size_t)t * half + i];
          float a = f(p[i]), bb = f(p[i + half]);
          p[i] = h(a * c - bb * s);
          p[i + half] = h(bb * c + a * s);
        }
  return Status::ok();
}
Status rope_forward(bf16* x, const float* cos, const float* sin, int rows, int B, int T, int nh, int hd, cudaStream_t) {
  return rope(x, cos, sin, rows, B, T, nh, hd, 1.f);
}
Status rope_backward(bf16* x, const float* cos, const float* sin, int rows, int B, int T, int nh, int hd, cudaStream_t) {
  return rope(x, cos, sin, rows, B, T, nh, hd, -1.f);
}
Status swiglu_forward(bf16* out, const bf16* gate, const bf16* up, std::size_t n, cudaStream_t) {
  for (size_t i = 0; i < n; i++) {
    float g = f(gate[i]);
    out[i] = h(g / (1 + std::exp(-g)) * f(up[i]));
  }
  return Status::ok();
}
Status swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, std::size_t n,
                       cudaStream_t) {
  for (size_t i = 0; i < n; i++) {
    float g = f(gate[i]), u = f(up[i]), d = f(dout[i]);
    float s = 1 / (1 + std::exp(-g));
    dup[i] = h(d * g * s);
    dgate[i] = h(d * u * s * (1 + g * (1 - s)));
  }
  return Status::ok();
}

static std::vector<float> tof(const bf16* p, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = f(p[i]);
  return v;
}
Status gemm_gqa_attention_forward(Blas&, AttentionScratch, bf16* out, float* lse, const bf16* q, const bf16* k,
                                  const bf16* v, const GqaShape& s, cudaStream_t) {
  const size_t nq = (size_t)s.B * s.T * s.NH * s.hs, nk = (size_t)s.B * s.T * s.NKV * s.hs;
  auto Q = tof(q, nq), K = tof(k, nk), Vv = tof(v, nk);
  const int qw = s.NH * s.hs, kw = s.NKV * s.hs, g = s.NH / s.NKV;
  const float scale = 1.f / std::sqrt((float)s.hs);
  for (int b = 0; b < s.B; b++)
    for (int hh = 0; hh < s.NH; hh++)
      for (int t = 0; t < s.T; t++) {
        std::vector<float> att(t + 1);
        float mx = -INFINITY;
        for (int u = 0; u <= t; u++) {
          float d = 0;
          for (int i = 0; i < s.hs; i++)
            d += Q[((size_t)b * s.T + t) * qw + hh * s.hs + i] * K[((size_t)b * s.T + u) * kw + (hh / g) * s.hs + i];
          att[u] = d * scale;
          mx = std::max(mx, att[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; u++) sum += std::exp(att[u] - mx);
        lse[((size_t)b * s.NH + hh) * s.T + t] = (float)(mx + std::log(sum));
        for (int i = 0; i < s.hs; i++) {
          double o = 0;
          for (int u = 0; u <= t; u++)
            o += std::exp(att[u] - mx) / sum * Vv[((size_t)b * s.T + u) * kw + (hh / g) * s.hs + i];
          out[((size_t)b * s.T + t) * qw + hh * s.hs + i] = h((float)o);
        }
      }
  return Status::ok();
}
Status gemm_gqa_attention_backward(Blas&, AttentionScratch, bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                                   const bf16* q, const bf16* k, const bf16* v, const bf16*, const float*,
                                   const GqaShape& s, cudaStream_t) {
  const size_t nq = (size_t)s.B * s.T * s.NH * s.hs, nk = (size_t)s.B * s.T * s.NKV * s.hs;
  auto Q = tof(q, nq), K = tof(k, nk), Vv = tof(v, nk), D = tof(dout, nq);
  std::vector<float> dQ(nq), dK(nk), dV(nk);
  model::kernels::gqa_attention_backward_reference(dQ.data(), dK.data(), dV.data(), D.data(), Q.data(), K.data(),
                                                   Vv.data(), model::kernels::GqaShape{s.B, s.T, s.NH, s.NKV, s.hs});
  for (size_t i = 0; i < nq; i++) dq[i] = h(dQ[i]);
  for (size_t i = 0; i < nk; i++) {
    dk[i] = h(dK[i]);
    dv[i] = h(dV[i]);
  }
  return Status::ok();
}

Status linear_forward(Blas&, const LinearShape& s, bf16* out, const bf16* inp, const bf16* w, const bf16* bias,
                      const bf16* residual, cudaStream_t) {
  const int ld = s.out_ld();
  for (int n = 0; n < s.N; n++)
    for (int o = 0; o < s.OC; o++) {
      float a = 0;
      for (int c = 0; c < s.C; c++) a += f(inp[(size_t)n * s.C + c]) * f(w[(size_t)o * s.C + c]);
      if (bias) a += f(bias[o]);
      if (residual) a += f(residual[(size_t)n * ld + o]);
      out[(size_t)n * ld + o] = h(a);
    }
  return Status::ok();
}
Status linear_backward_input(Blas&, const LinearShape& s, bf16* dinp, const bf16* dout, const bf16* w,
                             const bf16* gelu_pre, cudaStream_t) {
  if (gelu_pre) return Status::internal("gelu");
  const int ld = s.out_ld();
  std::vector<float> tmp((size_t)s.N * s.C);
  for (int n = 0; n < s.N; n++)
    for (int c = 0; c < s.C; c++) {
      float a = 0;
      for (int o = 0; o < s.OC; o++) a += f(dout[(size_t)n * ld + o]) * f(w[(size_t)o * s.C + c]);
      tmp[(size_t)n * s.C + c] = a;
    }
  for (size_t i = 0; i < tmp.size(); i++) dinp[i] = h(tmp[i]);
  return Status::ok();
}
Status linear_backward_weight(Blas&, const LinearShape& s, float* dw, const bf16* dout, const bf16* inp,
                              cudaStream_t) {
  const int ld = s.out_ld();
  for (int o = 0; o < s.OC; o++)
    for (int c = 0; c < s.C; c++) {
      float a = 0;
      for (int n = 0; n < s.N; n++) a += f(dout[(size_t)n * ld + o]) * f(inp[(size_t)n * s.C + c]);
      dw[(size_t)o * s.C + c] += a;
    }
  return Status::ok();
}

}  // namespace zinf::gpu

extern "C" {
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t count, cudaStream_t) {
  std::memset(p, v, count);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
}
