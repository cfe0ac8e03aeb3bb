// Topology through hwloc: counts packages, NUMA nodes, cores and PUs; binds threads to cores.
#include <hwloc.h>

#include <algorithm>
#include <mutex>

#include "zinf/topology.h"

namespace zinf {
namespace {

// One hwloc topology for the process, loaded on first use and never freed (it is read-only).
hwloc_topology_t shared_topology() {
  static hwloc_topology_t topo = [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) return static_cast<hwloc_topology_t>(nullptr);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      return static_cast<hwloc_topology_t>(nullptr);
    }
    return t;
  }();
  return topo;
}

int count(hwloc_topology_t t, hwloc_obj_type_t type) {
  const int n = hwloc_get_nbobjs_by_type(t, type);
  return std::max(n, 1);
}

}  // namespace

const Topology& topology() {
  static const Topology topo = [] {
    Topology result;
    hwloc_topology_t t = shared_topology();
    if (t == nullptr) return result;
    result.from_hwloc = true;
    result.packages = count(t, HWLOC_OBJ_PACKAGE);
    result.numa_nodes = count(t, HWLOC_OBJ_NUMANODE);
    result.cores = count(t, HWLOC_OBJ_CORE);
    result.pus = count(t, HWLOC_OBJ_PU);
    hwloc_obj_t pkg = hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, 0);
    if (pkg != nullptr) {
      const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel");
      if (model != nullptr) result.cpu_model = model;
    }
    return result;
  }();
  return topo;
}

bool pin_current_thread(std::size_t index) {
  hwloc_topology_t t = shared_topology();
  if (t == nullptr) return false;
  const int cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  if (cores <= 0) return false;
  hwloc_obj_t core = hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, static_cast<unsigned>(index % cores));
  if (core == nullptr || core->cpuset == nullptr) return false;
  return hwloc_set_cpubind(t, core->cpuset, HWLOC_CPUBIND_THREAD) == 0;
}

}  // namespace zinf
