// GPUDirect Storage behind the device layer's DirectStorage interface.
#include "gpu/gds_storage.h"

#include <utility>

#include <fmt/format.h>

namespace zinf::gpu {
namespace {

class GdsDirectFile final : public device::DirectFile {
 public:
  explicit GdsDirectFile(GdsFile file) : file_(std::move(file)) {}
  Status read(void* device_dst, std::size_t bytes, std::uint64_t file_offset) override {
    return file_.read(device_dst, bytes, file_offset);
  }
  Status write(const void* device_src, std::size_t bytes, std::uint64_t file_offset) override {
    return file_.write(device_src, bytes, file_offset);
  }
  const std::string& path() const override { return file_.path(); }

 private:
  GdsFile file_;
};

class GdsStorage final : public device::DirectStorage {
 public:
  GdsStorage(std::shared_ptr<CuFileDriver> driver, GdsStorageOptions options)
      : driver_(std::move(driver)), options_(std::move(options)) {}

  std::string describe() const override { return fmt::format("GPUDirect Storage ({})", driver_->library()); }
  bool addresses_host_memory() const override { return options_.host_memory; }

  Result<std::unique_ptr<device::DirectFile>> open(const std::string& path, bool write) override {
    ZINF_ASSIGN_OR_RETURN(GdsFile file,
                          GdsFile::open(driver_, path, GdsFileOptions{.write = write, .direct = options_.direct}));
    return std::unique_ptr<device::DirectFile>(std::make_unique<GdsDirectFile>(std::move(file)));
  }

 private:
  std::shared_ptr<CuFileDriver> driver_;
  GdsStorageOptions options_;
};

}  // namespace

Result<std::shared_ptr<device::DirectStorage>> open_gds_storage(const GdsStorageOptions& options) {
  ZINF_ASSIGN_OR_RETURN(std::shared_ptr<CuFileDriver> driver, CuFileDriver::open(options.library));
  return std::shared_ptr<device::DirectStorage>(std::make_shared<GdsStorage>(std::move(driver), options));
}

}  // namespace zinf::gpu
