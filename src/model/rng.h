// Counter-based random numbers (splitmix64 hashing) for initialisation and data shuffling:
// the same counters give the same bits on every machine, with no library RNG involved.
#pragma once

#include <cstdint>

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

}  // namespace zinf::model::detail
