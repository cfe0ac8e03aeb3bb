// libFuzzer target: the safetensors reader (see readers.h).
#include <cstddef>
#include <cstdint>

#include "readers.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zinf::fuzz::safetensors(data, size);
  return 0;
}
