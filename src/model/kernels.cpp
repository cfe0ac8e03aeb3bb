// Elementwise, normalisation, embedding, matmul and loss kernels of the GPT-2 model (fp32).
#include "model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/fused_kernels.h"
#include "model/parallel.h"

namespace zinf::model::kernels {

using detail::parallel_for;
using detail::row_grain;

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
  parallel_for(static_cast<size_t>(B) * T, row_grain(C), C, [&](size_t begin, size_t end) {
    for (size_t bt = begin; bt < end; bt++) {
      float* out_bt = out + bt * C;  // (C)
      const float* wte_ix = wte + static_cast<size_t>(inp[bt]) * C;
      const float* wpe_t = wpe + (bt % T) * C;
      for (int i = 0; i < C; i++) out_bt[i] = wte_ix[i] + wpe_t[i];
    }
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const float* dout_bt = dout + (static_cast<size_t>(b) * T + t) * C;
      float* dwte_ix = dwte + static_cast<size_t>(inp[b * T + t]) * C;
      float* dwpe_t = dwpe + static_cast<size_t>(t) * C;
      for (int i = 0; i < C; i++) {
        dwte_ix[i] += dout_bt[i];
        dwpe_t[i] += dout_bt[i];
      }
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  const float eps = 1e-5f;
  parallel_for(N, row_grain(4 * C), 4 * C, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      const float* x = inp + n * C;
      float m = 0.0f;
      for (int i = 0; i < C; i++) m += x[i];
      m /= static_cast<float>(C);
      float v = 0.0f;
      for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
      }
      v /= static_cast<float>(C);
      float s = 1.0f / std::sqrt(v + eps);
      float* o = out + n * C;
      for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, uint16_t* dinp_bf16) {
  // dinp row by row in parallel; dweight and dbias below.
  parallel_for(N, row_grain(8 * C), 8 * C, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      const float* dout_n = dout + n * C;
      const float* inp_n = inp + n * C;
      float* dinp_n = dinp + n * C;
      const float m = mean[n];
      const float s = rstd[n];
      // Two reductions over the row: mean of dnorm and of dnorm * norm.
      float dnorm_mean = 0.0f;
      float dnorm_norm_mean = 0.0f;
      for (int i = 0; i < C; i++) {
        float norm = (inp_n[i] - m) * s;
        float dnorm = weight[i] * dout_n[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      for (int i = 0; i < C; i++) {
        float norm = (inp_n[i] - m) * s;
        float dnorm = weight[i] * dout_n[i];
        dinp_n[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
      if (dinp_bf16 != nullptr) round_block_to_bf16(dinp_bf16 + n * C, dinp_n, 1, C, C);
    }
  });
  // Columns split over threads, each column summed in row order: the serial loop's bits.
  parallel_for(C, detail::column_slice_grain(C), 4 * static_cast<size_t>(N), [&](size_t c0, size_t c1) {
    for (int n = 0; n < N; n++) {
      const float* dout_n = dout + static_cast<size_t>(n) * C;
      const float* inp_n = inp + static_cast<size_t>(n) * C;
      const float m = mean[n];
      const float s = rstd[n];
      for (size_t i = c0; i < c1; i++) {
        dbias[i] += dout_n[i];
        dweight[i] += ((inp_n[i] - m) * s) * dout_n[i];
      }
    }
  });
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int n = 0; n < N; n++) {
      std::memcpy(out + static_cast<size_t>(n) * OC, bias, sizeof(float) * OC);
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
              OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  // dinp (N,C) = dout (N,OC) @ weight (OC,C)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f,
              dinp, C);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias != nullptr) bias_grad(dbias, dout, N, OC);  // the row-order column sums
}

void matmul_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    for (int o = 0; o < OC; o++) {
      const float* w = weight + static_cast<size_t>(o) * C;
      float acc = bias != nullptr ? bias[o] : 0.0f;
      for (int i = 0; i < C; i++) acc += x[i] * w[i];
      out[static_cast<size_t>(n) * OC + o] = acc;
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// tanh through one expf: 1 - 2 / (e^(2u) + 1), cheaper than tanhf (which goes through expm1f;
// figures: docs/benchmarks.md, "Figures behind choices in the code"); absolute error ~1e-7, and
// tanh only enters GELU as 1 + tanh. Saturates to +-1.
inline float tanh_via_exp(float u) { return 1.0f - 2.0f / (std::exp(2.0f * u) + 1.0f); }
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  parallel_for(n, 1 << 13, 20, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      float x = inp[i];
      float cube = kGeluCubic * x * x * x;
      out[i] = 0.5f * x * (1.0f + tanh_via_exp(kGeluScale * (x + cube)));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  parallel_for(n, 1 << 13, 30, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      float x = inp[i];
      float cube = kGeluCubic * x * x * x;
      float t = tanh_via_exp(kGeluScale * (x + cube));
      float sech2 = 1.0f - t * t;  // 1 / cosh^2
      float local_grad =
          0.5f * (1.0f + t) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
      dinp[i] = local_grad * dout[i];
    }
  });
}

void residual_add(float* out, const float* inp, size_t n) {
  parallel_for(n, 1 << 15, 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) out[i] += inp[i];
  });
}

void softmax_xent_forward(float* logits_to_probs, float* losses, const int32_t* targets, int N,
                          int V) {
  parallel_for(N, row_grain(20 * V), 20 * V, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      float* row = logits_to_probs + n * V;
      float maxv = row[0];
      for (int v = 1; v < V; v++) maxv = std::max(maxv, row[v]);
      const float target_logit = row[targets[n]];
      double sum = 0.0;  // up to 50257 terms: accumulate in double for an accurate log-sum-exp
      for (int v = 0; v < V; v++) {
        row[v] = std::exp(row[v] - maxv);
        sum += row[v];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int v = 0; v < V; v++) row[v] *= inv;
      losses[n] = static_cast<float>(static_cast<double>(maxv) + std::log(sum) - target_logit);
    }
  });
}

void softmax_xent_backward(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                           int V) {
  parallel_for(N, row_grain(V), V, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      float* row = probs_to_dlogits + n * V;
      const float p_target = row[targets[n]];
      for (int v = 0; v < V; v++) row[v] *= dloss;
      row[targets[n]] = (p_target - 1.0f) * dloss;
    }
  });
}

}  // namespace zinf::model::kernels
