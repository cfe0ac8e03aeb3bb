// Built without oneDNN: no bf16 matrix products; Matmul runs fp32 OpenBLAS only.
#include "model/bf16_matmul.h"

namespace zinf::model::detail {

Result<std::unique_ptr<Bf16MatmulBackend>> make_bf16_matmul_backend() {
  return Status::unsupported("bf16 matmul: zinf was built without oneDNN (meson option dnnl; Debian libdnnl-dev)");
}

MatmulSupport probe_matmul_support() { return MatmulSupport{}; }

}  // namespace zinf::model::detail
