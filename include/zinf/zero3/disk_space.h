// Disk, like memory: what a run will write, checked against its file systems' free space before
// any work, so that a run that cannot fit is refused at once instead of filling the disk.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "zinf/status.h"

namespace zinf::zero3 {

// A file system as the free-space check sees it.
struct DiskSpace {
  std::uint64_t device = 0;      // identifies the file system (st_dev): uses on one add up
  std::uint64_t free_bytes = 0;  // what an unprivileged writer may still take (statvfs f_bavail)
};

// Asks about the file system a path is (or would be created) on. The default, probe_free_space,
// uses statvfs; tests give their own to model a small or full disk.
using FreeSpaceProbe = std::function<Result<DiskSpace>(const std::string& path)>;

// statvfs and stat of `path`, or of its nearest existing parent when it does not exist yet.
Result<DiskSpace> probe_free_space(const std::string& path);

// One thing a run writes.
struct DiskUse {
  std::string path;               // where (a folder, which may not exist yet)
  std::string what;               // for the message: "offload_optimizer swap files"
  std::uint64_t bytes = 0;        // at most this many bytes on disk at once
  std::uint64_t reclaimable = 0;  // of which already on disk and replaced (an earlier run's files)
};

// Adds the uses up per file system and refuses (ResourceExhausted) the first whose need exceeds
// its free space, naming every use on it, the need and the free space. Nothing is written.
Status check_disk_space(std::span<const DiskUse> uses, const FreeSpaceProbe& probe);

// "1.5 GiB", "12.0 MiB", "512 bytes": sizes in messages.
std::string format_bytes(std::uint64_t bytes);

}  // namespace zinf::zero3
