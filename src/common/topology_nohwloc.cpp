// Topology without hwloc: PU count from the C++ runtime; threads are not pinned.
#include <thread>

#include "zinf/topology.h"

namespace zinf {

const Topology& topology() {
  static const Topology topo = [] {
    Topology result;
    const unsigned n = std::thread::hardware_concurrency();
    result.cores = result.pus = n == 0 ? 1 : static_cast<int>(n);
    return result;
  }();
  return topo;
}

bool pin_current_thread(std::size_t) { return false; }

}  // namespace zinf
