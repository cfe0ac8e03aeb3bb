// Topology summary line, shared by the hwloc and non-hwloc builds.
#include <fmt/format.h>

#include "zinf/topology.h"

namespace zinf {

std::string Topology::summary() const {
  std::string line = fmt::format("{}: {} package{}, {} NUMA node{}, {} core{}, {} PU{}",
                                 from_hwloc ? "hwloc" : "no hwloc", packages, packages == 1 ? "" : "s",
                                 numa_nodes, numa_nodes == 1 ? "" : "s", cores, cores == 1 ? "" : "s",
                                 pus, pus == 1 ? "" : "s");
  if (!cpu_model.empty()) line += fmt::format(" ({})", cpu_model);
  return line;
}

}  // namespace zinf
