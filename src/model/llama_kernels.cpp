// Elementwise, normalisation, rotary and embedding kernels of the Llama model (fp32).
#include "model/llama_kernels.h"

#include <cmath>
#include <vector>

#include "model/fused_kernels.h"
#include "model/parallel.h"

namespace zinf::model::kernels {

using detail::parallel_for;
using detail::row_grain;

void embedding_forward(float* out, const int32_t* tokens, const float* table, size_t N, int C) {
  parallel_for(N, row_grain(C), C, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      const float* row = table + static_cast<size_t>(tokens[n]) * C;
      float* o = out + n * C;  // (C)
      for (int i = 0; i < C; i++) o[i] = row[i];
    }
  });
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, size_t N, int C) {
  for (size_t n = 0; n < N; n++) {
    float* drow = dtable + static_cast<size_t>(tokens[n]) * C;
    const float* d = dout + n * C;
    for (int i = 0; i < C; i++) drow[i] += d[i];
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int N, int C) {
  parallel_for(N, row_grain(3 * C), 3 * C, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      const float* x = inp + n * C;
      float ss = 0.0f;
      for (int i = 0; i < C; i++) ss += x[i] * x[i];
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
      float* o = out + n * C;
      for (int i = 0; i < C; i++) o[i] = weight[i] * (x[i] * s);  // HF's order: weight * normed
      rstd[n] = s;
    }
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, uint16_t* dinp_bf16) {
  // y = w * x * s with s = (mean(x^2) + eps)^(-1/2), so with norm = x * s and dnorm = w * dout:
  // dx = s * (dnorm - norm * mean(dnorm * norm)). Rows in parallel.
  parallel_for(N, row_grain(6 * C), 6 * C, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; n++) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      const float s = rstd[n];
      float dot = 0.0f;
      for (int i = 0; i < C; i++) dot += (weight[i] * dy[i]) * (x[i] * s);
      dot /= static_cast<float>(C);
      for (int i = 0; i < C; i++) dx[i] += (weight[i] * dy[i] - (x[i] * s) * dot) * s;
      if (dinp_bf16 != nullptr) round_block_to_bf16(dinp_bf16 + n * C, dx, 1, C, C);
    }
  });
  // dweight: columns split over threads, each summed in row order (the serial loop's bits).
  parallel_for(C, detail::column_slice_grain(C), 3 * static_cast<size_t>(N), [&](size_t c0, size_t c1) {
    for (int n = 0; n < N; n++) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* dy = dout + static_cast<size_t>(n) * C;
      const float s = rstd[n];
      for (size_t i = c0; i < c1; i++) dweight[i] += (x[i] * s) * dy[i];
    }
  });
}

void rope_tables(float* cos, float* sin, int max_seq, int head_dim, double theta) {
  std::vector<double> inv_freq(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; i++) inv_freq[static_cast<size_t>(i)] = std::pow(theta, -2.0 * i / head_dim);
  rope_tables(cos, sin, max_seq, inv_freq, 1.0);
}

void rope_tables(float* cos, float* sin, int max_seq, std::span<const double> inv_freq, double attention_factor) {
  const size_t half = inv_freq.size();
  for (int t = 0; t < max_seq; t++) {
    for (size_t i = 0; i < half; i++) {
      const double angle = t * inv_freq[i];
      cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle) * attention_factor);
      sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(angle) * attention_factor);
    }
  }
}

namespace {

// Rotates every head of every row by +angle (sign 1) or -angle (sign -1); x_bf16, when not
// nullptr, gets each finished row rounded to bf16.
void rope_rotate(float* x, const float* cos, const float* sin, int B, int T, int n_heads, int head_dim,
                 float sign, uint16_t* x_bf16 = nullptr) {
  const int half = head_dim / 2;
  const size_t width = static_cast<size_t>(n_heads) * head_dim;
  parallel_for(static_cast<size_t>(B) * T, row_grain(3 * width), 3 * width, [&](size_t begin, size_t end) {
    for (size_t bt = begin; bt < end; bt++) {
      const float* c = cos + (bt % T) * half;  // (hd/2) at position t
      const float* s = sin + (bt % T) * half;
      for (int h = 0; h < n_heads; h++) {
        float* lo = x + bt * width + static_cast<size_t>(h) * head_dim;  // (hd/2)
        float* hi = lo + half;                                           // (hd/2)
        for (int i = 0; i < half; i++) {
          const float a = lo[i];
          const float b = hi[i];
          const float si = sign * s[i];
          lo[i] = a * c[i] - b * si;
          hi[i] = b * c[i] + a * si;
        }
      }
      if (x_bf16 != nullptr) round_block_to_bf16(x_bf16 + bt * width, x + bt * width, 1, static_cast<int>(width), 0);
    }
  });
}

}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int n_heads, int head_dim) {
  rope_rotate(x, cos, sin, B, T, n_heads, head_dim, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int n_heads, int head_dim,
                   uint16_t* dx_bf16) {
  rope_rotate(dx, cos, sin, B, T, n_heads, head_dim, -1.0f, dx_bf16);
}

void swiglu_forward(float* out, const float* gate, const float* up, size_t n, uint16_t* out_bf16) {
  parallel_for(n, 1 << 13, 20, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      const float g = gate[i];
      const float sig = 1.0f / (1.0f + std::exp(-g));
      out[i] = (g * sig) * up[i];
    }
    if (out_bf16 != nullptr) {
      round_block_to_bf16(out_bf16 + begin, out + begin, 1, static_cast<int>(end - begin), 0);
    }
  });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n) {
  parallel_for(n, 1 << 13, 25, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      const float g = gate[i];
      const float d = dout[i];
      const float sig = 1.0f / (1.0f + std::exp(-g));
      // silu'(g) = sig + g * sig * (1 - sig)
      dup[i] = d * (g * sig);
      dgate[i] = d * up[i] * (sig * (1.0f + g * (1.0f - sig)));
    }
  });
}

}  // namespace zinf::model::kernels
