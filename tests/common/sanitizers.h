// Whether this test binary runs under AddressSanitizer: its shadow memory, quarantine and address
// space reservations change what tests that measure memory or limit address space may expect.
#pragma once

namespace zinf::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

}  // namespace zinf::testing
