// Builds for CPUs other than x86-64: only the scalar kernels exist.
#include "optim/kernels.h"
#include "zinf/optim/isa.h"

namespace zinf::optim::detail {

const KernelTable* kernels_for(KernelIsa isa) {
  return isa == KernelIsa::kScalar ? &scalar_kernels() : nullptr;
}

}  // namespace zinf::optim::detail
