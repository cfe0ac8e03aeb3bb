// Internal: the one checksum of zinf (XXH3, 64-bit): swap pages, checkpoint files, layout and trace fingerprints.
//
// Fast enough to run on every swap transfer (the x86 build picks SSE2, AVX2 or AVX-512 at run
// time) and strong enough to catch bit rot, torn or misdirected writes. Not a cryptographic
// hash: it detects accidents, not an attacker who can also rewrite the manifest.
// The value for given bytes is the same on every machine and build (XXH3 is specified
// byte-exact), so ranks and later runs can compare checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace zinf {

// One-shot XXH3-64 (seed 0) of `bytes` bytes.
std::uint64_t checksum64(const void* data, std::size_t bytes);
inline std::uint64_t checksum64(std::string_view text) { return checksum64(text.data(), text.size()); }

// Streaming XXH3-64: add() pieces in order; value() equals checksum64 of their concatenation,
// however the bytes were cut. Move-only; one thread at a time.
class Checksum64 {
 public:
  Checksum64();
  ~Checksum64();
  Checksum64(Checksum64&&) noexcept;
  Checksum64& operator=(Checksum64&&) noexcept;
  Checksum64(const Checksum64&) = delete;
  Checksum64& operator=(const Checksum64&) = delete;

  void add(const void* data, std::size_t bytes);
  void add(std::string_view text) { add(text.data(), text.size()); }
  // Mixes in a value's bytes (little-endian hosts: its in-memory bytes).
  template <typename T>
  void add_value(const T& v) {
    add(&v, sizeof(v));
  }
  std::uint64_t value() const;
  void reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zinf
