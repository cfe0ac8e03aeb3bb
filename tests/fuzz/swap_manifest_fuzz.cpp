// libFuzzer target: the swap_manifest reader (see readers.h).
#include <cstddef>
#include <cstdint>

#include "readers.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zinf::fuzz::swap_manifest(data, size);
  return 0;
}
