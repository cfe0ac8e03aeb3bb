// Chooses the kernel table for one call.
#include "optim/exec.h"

#include <fmt/format.h>

namespace zinf::optim::detail {

Result<const KernelTable*> resolve_kernels(const ExecOptions& exec) {
  const KernelIsa isa = exec.isa.value_or(active_isa());
  const KernelTable* table = kernels_for(isa);
  if (table == nullptr) {
    return Status::unsupported(fmt::format("optimizer kernels: ISA {} is not available in this build or on this CPU",
                                           isa_name(isa)));
  }
  return table;
}

}  // namespace zinf::optim::detail
