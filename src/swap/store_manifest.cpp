// The swap store's manifest: JSON (de)serialisation and atomic file replacement.
#include "swap/store_manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace zinf::swap::detail {

namespace {

using nlohmann::json;

// Writes all of `text` to fd, handling short writes and EINTR.
Status write_all(int fd, const std::string& text, const std::string& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::io_error("write", path, done, text.size() - done, errno);
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

Status fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::sys_error("open " + path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::sys_error("fsync " + path, err);
  return Status::ok();
}

TensorRecord record_from_json(const std::string& key, const json& j) {
  TensorRecord r;
  r.key = key;
  r.numel = j.at("numel").get<std::uint64_t>();
  r.nbytes = j.at("nbytes").get<std::uint64_t>();
  for (const json& e : j.at("extents")) {
    r.extents.push_back(Extent{e.at(0).get<std::uint32_t>(), e.at(1).get<std::uint64_t>(),
                               e.at(2).get<std::uint64_t>()});
  }
  return r;
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  json j;
  j["format"] = kManifestFormat;
  j["version"] = kManifestVersion;
  j["rank"] = m.rank;
  j["kind"] = m.kind;
  j["alignment"] = kSwapAlignment;
  j["stripe_unit"] = m.stripe_unit;
  j["generation"] = m.generation;
  json files = json::array();
  for (const ManifestFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = std::move(files);
  json tensors = json::object();
  for (const auto& [key, r] : m.tensors) {
    json extents = json::array();
    for (const Extent& e : r.extents) extents.push_back({e.file, e.offset, e.length});
    tensors[key] = {{"dtype", std::string(dtype_name(r.dtype))},
                    {"numel", r.numel},
                    {"nbytes", r.nbytes},
                    {"extents", std::move(extents)}};
  }
  j["tensors"] = std::move(tensors);
  j["metadata"] = m.metadata;
  return j.dump(1) + "\n";
}

Result<Manifest> manifest_from_json(const std::string& text, const std::string& path) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::corruption(fmt::format("swap store manifest {}: not valid JSON", path));
  try {
    if (j.at("format").get<std::string>() != kManifestFormat) {
      return Status::corruption(fmt::format("{}: not a zinf swap store manifest", path));
    }
    const int version = j.at("version").get<int>();
    if (version != kManifestVersion) {
      return Status::corruption(
          fmt::format("{}: manifest version {} (this build reads {})", path, version, kManifestVersion));
    }
    Manifest m;
    m.rank = j.at("rank").get<int>();
    m.kind = j.at("kind").get<std::string>();
    m.stripe_unit = j.at("stripe_unit").get<std::uint64_t>();
    m.generation = j.at("generation").get<std::uint64_t>();
    for (const json& f : j.at("files")) {
      m.files.push_back(ManifestFile{f.at("name").get<std::string>(), f.at("bytes").get<std::uint64_t>()});
    }
    for (const auto& [key, t] : j.at("tensors").items()) {
      TensorRecord r = record_from_json(key, t);
      ZINF_ASSIGN_OR_RETURN(r.dtype, parse_dtype(t.at("dtype").get<std::string>()));
      m.tensors.emplace(key, std::move(r));
    }
    m.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    return m;
  } catch (const json::exception& e) {
    return Status::corruption(fmt::format("swap store manifest {}: {}", path, e.what()));
  }
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::sys_error("open " + tmp, errno);
  Status st = write_all(fd, text, tmp);
  if (st.is_ok() && ::fsync(fd) != 0) st = Status::sys_error("fsync " + tmp, errno);
  ::close(fd);
  if (!st.is_ok()) return st;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::sys_error("rename " + tmp + " to " + path, errno);
  const std::string folder = std::filesystem::path(path).parent_path().string();
  return fsync_path(folder.empty() ? "." : folder, O_RDONLY | O_DIRECTORY);
}

Result<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::sys_error("open " + path, errno);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::sys_error("read " + path, errno);
  return text.str();
}

}  // namespace zinf::swap::detail
