// Rotary frequencies of the Llama family with RoPE scaling (linear, dynamic NTK, YaRN, Llama 3),
// as transformers' modeling_rope_utils computes them, in double.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "zinf/model/llama.h"

namespace zinf::model {

namespace {

// theta^(-2i/dim), i < dim/2: the unscaled frequencies.
std::vector<double> default_inv_freq(double theta, int dim) {
  std::vector<double> f(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; i++) f[static_cast<size_t>(i)] = std::pow(theta, -2.0 * i / dim);
  return f;
}

// Llama 3.1: wavelengths longer than original/low_freq_factor are divided by factor, shorter
// than original/high_freq_factor kept, and the band between interpolated smoothly.
void apply_llama3(std::vector<double>& f, const RopeScaling& s) {
  const double old_len = s.original_max_position_embeddings;
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (double& inv : f) {
    const double wavelen = 2.0 * std::numbers::pi / inv;
    if (wavelen > low_wavelen) {
      inv /= s.factor;
    } else if (!(wavelen < high_wavelen)) {  // HF: neither < high nor > low
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      inv = (1.0 - smooth) * inv / s.factor + smooth * inv;
    }
  }
}

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN (transformers' _compute_yarn_parameters): extrapolated (unscaled) frequencies for the
// dimensions that rotate more than beta_fast times over the original context, interpolated
// (divided by factor) for those below beta_slow, a linear ramp between; cos and sin are
// multiplied by the attention factor.
double apply_yarn(std::vector<double>& f, const RopeScaling& s, double theta, int dim, int max_positions) {
  // transformers 5: `factor` as given; the pre-training length is original_max_position_embeddings
  // or, absent, max_position_embeddings. (transformers 4 took max/original as the factor when the
  // original length was given; folders written for it carry a factor equal to that ratio.)
  const double factor = s.factor;
  const double original =
      s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : static_cast<double>(max_positions);
  double attention = s.attention_factor;
  if (attention <= 0.0) {
    attention = s.mscale > 0.0 && s.mscale_all_dim > 0.0
                    ? yarn_mscale(factor, s.mscale) / yarn_mscale(factor, s.mscale_all_dim)
                    : yarn_mscale(factor, 1.0);
  }
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevent a singular ramp
  for (size_t i = 0; i < f.size(); i++) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // the share of the unscaled frequency
    const double base = f[i];
    f[i] = base / factor * (1.0 - extrapolation) + base * extrapolation;
  }
  return attention;
}

}  // namespace

RopeFrequencies rope_frequencies(const LlamaConfig& c, int seq_len) {
  const RopeScaling& s = c.rope_scaling;
  const int dim = c.head_size();
  RopeFrequencies r;
  if (s.type == RopeType::kDynamic) {
    // NTK-aware: the base grows once the sequence passes the trained length; below it (every
    // window zinf trains, T <= max_seq) the frequencies are the default ones.
    const double len = std::max(seq_len, c.max_seq);
    const double base =
        c.rope_theta * std::pow(s.factor * len / c.max_seq - (s.factor - 1.0), static_cast<double>(dim) / (dim - 2));
    r.inv_freq = default_inv_freq(base, dim);
    return r;
  }
  r.inv_freq = default_inv_freq(c.rope_theta, dim);
  if (s.type == RopeType::kLinear) {
    for (double& inv : r.inv_freq) inv /= s.factor;
  } else if (s.type == RopeType::kLlama3) {
    apply_llama3(r.inv_freq, s);
  } else if (s.type == RopeType::kYarn) {
    r.attention_factor = apply_yarn(r.inv_freq, s, c.rope_theta, dim, c.max_seq);
  }
  return r;
}

}  // namespace zinf::model
