// XXH3-64 through Debian's libxxhash; on x86 its dispatcher picks the widest vector unit at run time.
#include "common/checksum.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>  // redirects XXH3_64bits* to the run-time dispatched versions
#endif
#include <xxhash.h>

#include <new>

namespace zinf {

struct Checksum64::State {
  XXH3_state_t* s = nullptr;
  State() : s(XXH3_createState()) {
    if (s == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(s);
  }
  ~State() { XXH3_freeState(s); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

std::uint64_t checksum64(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

Checksum64::Checksum64() : state_(std::make_unique<State>()) {}
Checksum64::~Checksum64() = default;
Checksum64::Checksum64(Checksum64&&) noexcept = default;
Checksum64& Checksum64::operator=(Checksum64&&) noexcept = default;

void Checksum64::add(const void* data, std::size_t bytes) { XXH3_64bits_update(state_->s, data, bytes); }

std::uint64_t Checksum64::value() const { return XXH3_64bits_digest(state_->s); }

void Checksum64::reset() { XXH3_64bits_reset(state_->s); }

}  // namespace zinf
