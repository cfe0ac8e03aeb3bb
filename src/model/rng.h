// Counter-based random numbers (splitmix64 hashing) for initialisation and data shuffling:
// the same counters give the same bits on every machine, with no library RNG involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace zinf::model::detail {

// One step of splitmix64: a bijective mix of x. Consecutive x give independent-looking outputs.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A key for the tuple (a, b, c).
constexpr uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}

// Uniform double in [0, 1) with 53 random bits.
constexpr double unit_double(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

// Uniform integer in [0, n) by multiply-shift (bias below 2^-32 for n < 2^32; deterministic).
constexpr uint64_t below(uint64_t x, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

// Natural log for x > 0 using only +, -, *, / on doubles (IEEE-exact, so identical everywhere,
// unlike libm's log whose last bit may differ between versions). Relative error ~1e-16.
double portable_log(double x);

// A standard normal sample determined by `key` (Marsaglia's polar method on a counter stream).
double normal_from_key(uint64_t key);

// out[i] = float(std_dev * normal_from_key(splitmix64(param_key ^ (first_index + i)))): init_param's
// normal weights. With `vector` and AVX2, four at a time with the same operations in the same
// order (the same bits; tests compare both ways); else one at a time.
void fill_normal(uint64_t param_key, double std_dev, size_t first_index, std::span<float> out, bool vector);
#if defined(__x86_64__)
// The AVX2 part of fill_normal: the first multiple of 4 elements; returns how many it wrote.
size_t fill_normal_avx2(uint64_t param_key, double std_dev, size_t first_index, std::span<float> out);
// Its parts, for the bit-exact tests (callers check AVX2): portable_log of four normal x in
// (0, 1); and normal_from_key of four keys from each one's first candidate pair, returning the
// mask of lanes whose pair was rejected (their outputs are meaningless).
void portable_log_avx2(const double* x4, double* out4);
int normals_avx2(const uint64_t* keys4, double* out4);
#endif

}  // namespace zinf::model::detail
