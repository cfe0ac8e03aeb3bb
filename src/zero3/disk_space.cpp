// The free-space check made before any work (disk_space.h).
#include "zinf/zero3/disk_space.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>

namespace zinf::zero3 {

std::string format_bytes(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

Result<DiskSpace> probe_free_space(const std::string& path) {
  // The folder may be created by the run: its nearest existing parent holds it.
  std::filesystem::path p = std::filesystem::absolute(path.empty() ? "." : path);
  struct stat st {};
  while (::stat(p.c_str(), &st) != 0) {
    if (errno != ENOENT || !p.has_parent_path() || p.parent_path() == p) {
      return Status::sys_error(fmt::format("free space of {}: stat {}", path, p.string()), errno);
    }
    p = p.parent_path();
  }
  struct statvfs vfs {};
  if (::statvfs(p.c_str(), &vfs) != 0) return Status::sys_error(fmt::format("free space of {}: statvfs", path), errno);
  return DiskSpace{static_cast<std::uint64_t>(st.st_dev),
                   static_cast<std::uint64_t>(vfs.f_bavail) * static_cast<std::uint64_t>(vfs.f_frsize)};
}

Status check_disk_space(std::span<const DiskUse> uses, const FreeSpaceProbe& probe) {
  struct FileSystem {
    DiskSpace space;
    std::uint64_t need = 0;
    std::vector<const DiskUse*> uses;
  };
  std::map<std::uint64_t, FileSystem> systems;
  std::vector<std::uint64_t> order;  // first seen first, for a stable message
  for (const DiskUse& u : uses) {
    if (u.bytes == 0) continue;
    ZINF_ASSIGN_OR_RETURN(DiskSpace space, probe ? probe(u.path) : probe_free_space(u.path));
    auto [it, added] = systems.try_emplace(space.device, FileSystem{space, 0, {}});
    if (added) order.push_back(space.device);
    it->second.need += u.bytes - std::min(u.bytes, u.reclaimable);
    it->second.uses.push_back(&u);
  }
  for (std::uint64_t device : order) {
    const FileSystem& fs = systems.at(device);
    if (fs.need <= fs.space.free_bytes) continue;
    std::string list;
    for (const DiskUse* u : fs.uses) {
      list += fmt::format("{}{} in {}: {}", list.empty() ? "" : "; ", u->what, u->path, format_bytes(u->bytes));
      if (u->reclaimable > 0) list += fmt::format(" ({} of it already there, from an earlier run)", format_bytes(std::min(u->bytes, u->reclaimable)));
    }
    return Status::resource_exhausted(fmt::format(
        "not enough free disk space: this run writes {} more on the file system of {} ({}), which has {} free; "
        "nothing was written. Free space there, or give nvme_path (or --save) a folder on a larger disk",
        format_bytes(fs.need), fs.uses.front()->path, list, format_bytes(fs.space.free_bytes)));
  }
  return Status::ok();
}

}  // namespace zinf::zero3
