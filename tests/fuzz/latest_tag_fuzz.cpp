// libFuzzer target: the latest_tag reader (see readers.h).
#include <cstddef>
#include <cstdint>

#include "readers.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zinf::fuzz::latest_tag(data, size);
  return 0;
}
