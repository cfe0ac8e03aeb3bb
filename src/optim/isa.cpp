// Kernel path names and the run-time choice of path (the CPU probe is in isa_x86.cpp / isa_generic.cpp).
#include "zinf/optim/isa.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "optim/kernels.h"
#include "zinf/log.h"

namespace zinf::optim {

std::string_view isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar: return "scalar";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512: return "avx512";
  }
  return "?";
}

Result<KernelIsa> parse_isa(std::string_view name) {
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (name == isa_name(isa)) return isa;
  }
  return Status::invalid_argument(fmt::format("unknown kernel ISA '{}' (known: scalar, avx2, avx512)", name));
}

bool isa_supported(KernelIsa isa) { return detail::kernels_for(isa) != nullptr; }

KernelIsa best_isa() {
  if (isa_supported(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  if (isa_supported(KernelIsa::kAvx2)) return KernelIsa::kAvx2;
  return KernelIsa::kScalar;
}

namespace {

KernelIsa isa_from_environment() {
  const char* env = std::getenv("ZINF_OPTIM_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  Result<KernelIsa> wanted = parse_isa(env);
  if (!wanted.is_ok()) {
    log_once(LogLevel::kWarning, "ZINF_OPTIM_ISA",
             fmt::format("ZINF_OPTIM_ISA: {}; using {}", wanted.status().message(), isa_name(best_isa())));
    return best_isa();
  }
  if (!isa_supported(*wanted)) {
    log_once(LogLevel::kWarning, "ZINF_OPTIM_ISA",
             fmt::format("ZINF_OPTIM_ISA={}: this build or CPU cannot run it; using {}", env,
                         isa_name(best_isa())));
    return best_isa();
  }
  return *wanted;
}

}  // namespace

KernelIsa active_isa() {
  static const KernelIsa isa = isa_from_environment();
  return isa;
}

}  // namespace zinf::optim
