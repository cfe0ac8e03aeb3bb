// Built without oneDNN: no bf16 matrix products; Matmul runs fp32 OpenBLAS only.
#include "model/bf16_matmul.h"

namespace zinf::model::detail {

Result<std::unique_ptr<Bf16MatmulBackend>> make_bf16_matmul_backend() {
  return Status::unsupported("bf16 matmul: zinf was built without oneDNN (meson option dnnl; Debian libdnnl-dev)");
}

MatmulSupport probe_matmul_support() { return MatmulSupport{}; }

void set_check_bf16_copies(bool) {}  // no bf16 backend: nothing reads a copy
uint64_t bf16_copy_mismatches() { return 0; }

}  // namespace zinf::model::detail
