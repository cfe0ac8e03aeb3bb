// libFuzzer target: the token_file reader (see readers.h).
#include <cstddef>
#include <cstdint>

#include "readers.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zinf::fuzz::token_file(data, size);
  return 0;
}
