// Machine topology (via hwloc when built with it) and pinning of worker threads to cores.
#pragma once

#include <cstddef>
#include <string>

namespace zinf {

struct Topology {
  bool from_hwloc = false;
  int packages = 1;
  int numa_nodes = 1;
  int cores = 1;       // physical cores
  int pus = 1;         // hardware threads (processing units)
  std::string cpu_model;  // e.g. "Intel(R) Xeon(R) ..." when known
  // One line for tool headers: "hwloc: 1 package, 1 NUMA node, 2 cores, 2 PUs (Intel ...)".
  std::string summary() const;
};

// Discovered once per process.
const Topology& topology();

// Pins the calling thread to core (index mod cores). With hwloc this binds to that
// core's cpuset; without hwloc it does nothing and returns false. Never fails hard:
// a refused binding returns false.
bool pin_current_thread(std::size_t index);

}  // namespace zinf
