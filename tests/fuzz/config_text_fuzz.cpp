// libFuzzer target: the config_text reader (see readers.h).
#include <cstddef>
#include <cstdint>

#include "readers.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zinf::fuzz::config_text(data, size);
  return 0;
}
