// GPUDirect Storage through a run-time loaded libcufile: the driver, registered files and buffers.
#include "gpu/gds.h"

#include <dlfcn.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "common/file_io.h"

namespace zinf::gpu {

namespace {

// One transfer's size cap: cuFile takes size_t but returns ssize_t, and off_t offsets.
constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;

template <typename Fn>
bool resolve(void* dl, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(dl, name));
  return fn != nullptr;
}

}  // namespace

std::string cufile_error_text(const cufile::Error& err) {
  if (err.cu_err != 0) {
    return fmt::format("cuFile error {} {} (CUDA driver error {})", err.err, cufile::op_error_name(err.err), err.cu_err);
  }
  return fmt::format("cuFile error {} {}", err.err, cufile::op_error_name(err.err));
}

Result<std::shared_ptr<CuFileDriver>> CuFileDriver::open(std::string_view library) {
  const std::string name(library);
  std::shared_ptr<CuFileDriver> driver(new CuFileDriver());
  driver->library_ = name;
  dlerror();
  driver->dl_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (driver->dl_ == nullptr) {
    const char* why = dlerror();
    return Status::unsupported(fmt::format("GPUDirect Storage unavailable: cannot load {}: {}", name,
                                           why != nullptr ? why : "dlopen failed"));
  }
  cufile::Api& a = driver->api_;
  const char* missing = nullptr;
  if (!resolve(driver->dl_, "cuFileDriverOpen", a.driver_open)) missing = "cuFileDriverOpen";
  // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2; the library exports both.
  if (!resolve(driver->dl_, "cuFileDriverClose_v2", a.driver_close) &&
      !resolve(driver->dl_, "cuFileDriverClose", a.driver_close)) {
    missing = "cuFileDriverClose";
  }
  if (!resolve(driver->dl_, "cuFileHandleRegister", a.handle_register)) missing = "cuFileHandleRegister";
  if (!resolve(driver->dl_, "cuFileHandleDeregister", a.handle_deregister)) missing = "cuFileHandleDeregister";
  if (!resolve(driver->dl_, "cuFileBufRegister", a.buf_register)) missing = "cuFileBufRegister";
  if (!resolve(driver->dl_, "cuFileBufDeregister", a.buf_deregister)) missing = "cuFileBufDeregister";
  if (!resolve(driver->dl_, "cuFileRead", a.read)) missing = "cuFileRead";
  if (!resolve(driver->dl_, "cuFileWrite", a.write)) missing = "cuFileWrite";
  if (missing != nullptr) {
    a.driver_close = nullptr;  // nothing was opened
    return Status::unsupported(
        fmt::format("GPUDirect Storage unavailable: {} has no {} (not a cuFile library?)", name, missing));
  }
  const cufile::Error opened = a.driver_open();
  if (opened.err != cufile::kSuccess) {
    a.driver_close = nullptr;
    return Status::unsupported(fmt::format(
        "GPUDirect Storage unavailable: cuFileDriverOpen ({}) failed: {} (is the nvidia-fs driver loaded, or "
        "compatibility mode allowed in cufile.json?)",
        name, cufile_error_text(opened)));
  }
  return driver;
}

CuFileDriver::~CuFileDriver() {
  if (api_.driver_close != nullptr) (void)api_.driver_close();
  if (dl_ != nullptr) dlclose(dl_);
}

Result<GdsFile> GdsFile::open(std::shared_ptr<CuFileDriver> driver, const std::string& path,
                              GdsFileOptions options) {
  if (!driver) return Status::invalid_argument(fmt::format("GPUDirect Storage open of {}: no cuFile driver", path));
  int flags = options.write ? O_RDWR : O_RDONLY;
  if (options.write && options.create) flags |= O_CREAT;
  ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile opened,
                        fileio::open_direct_or_buffered(path, flags, fileio::kPrivateFileMode, options.direct,
                                                        "GPUDirect Storage"));
  cufile::Descr descr{};
  descr.type = cufile::kHandleTypeOpaqueFd;
  descr.handle.fd = opened.fd.get();
  descr.fs_ops = nullptr;
  cufile::Handle handle = nullptr;
  const cufile::Error reg = driver->api().handle_register(&handle, &descr);
  if (reg.err != cufile::kSuccess) {
    return Status(ErrorCode::kIoError,
                  fmt::format("cuFileHandleRegister {}{}: {}", path, opened.direct ? " (O_DIRECT)" : "",
                              cufile_error_text(reg)));
  }
  GdsFile file;
  file.driver_ = std::move(driver);
  file.handle_ = handle;
  file.fd_ = opened.fd.release();
  file.direct_ = opened.direct;
  file.path_ = path;
  return file;
}

GdsFile::~GdsFile() { reset(); }

GdsFile::GdsFile(GdsFile&& other) noexcept
    : driver_(std::move(other.driver_)),
      handle_(std::exchange(other.handle_, nullptr)),
      fd_(std::exchange(other.fd_, -1)),
      direct_(other.direct_),
      path_(std::move(other.path_)) {}

GdsFile& GdsFile::operator=(GdsFile&& other) noexcept {
  if (this != &other) {
    reset();
    driver_ = std::move(other.driver_);
    handle_ = std::exchange(other.handle_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
    direct_ = other.direct_;
    path_ = std::move(other.path_);
  }
  return *this;
}

void GdsFile::reset() noexcept {
  // Deregister before closing: cuFile holds the descriptor until then.
  if (handle_ != nullptr && driver_) driver_->api().handle_deregister(handle_);
  handle_ = nullptr;
  fileio::UniqueFd close_it(std::exchange(fd_, -1));
  driver_.reset();
}

namespace {

// The Status of a failed cuFileRead/cuFileWrite return value.
Status transfer_error(const char* op, const std::string& path, std::uint64_t offset, std::size_t length,
                      ssize_t rc, int saved_errno) {
  if (rc == -1) return Status::io_error(op, path, offset, length, saved_errno);
  const auto code = static_cast<cufile::OpError>(-rc);
  return Status(ErrorCode::kIoError, fmt::format("{} {} offset {} length {}: cuFile error {} {}", op, path, offset,
                                                 length, code, cufile::op_error_name(code)));
}

}  // namespace

Status GdsFile::read(void* dev, std::size_t bytes, std::uint64_t file_offset) {
  if (handle_ == nullptr) return Status::invalid_argument("GdsFile::read on a closed file");
  if (bytes == 0) return Status::ok();
  if (dev == nullptr) return Status::invalid_argument(fmt::format("cuFileRead {}: a null device pointer", path_));
  std::size_t done = 0;
  while (done < bytes) {
    const std::size_t chunk = std::min(bytes - done, kMaxTransfer);
    const std::uint64_t at = file_offset + done;
    if (at > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
      return Status::invalid_argument(fmt::format("cuFileRead {}: offset {} is too large", path_, at));
    }
    errno = 0;
    const ssize_t rc = driver_->api().read(handle_, dev, chunk, static_cast<off_t>(at), static_cast<off_t>(done));
    const int saved = errno;
    if (rc < 0) return transfer_error("cuFileRead", path_, at, chunk, rc, saved);
    if (rc == 0) {
      return Status::out_of_range(fmt::format("cuFileRead {} offset {} length {}: the file ends at {}", path_,
                                              file_offset, bytes, at));
    }
    done += static_cast<std::size_t>(rc);
  }
  return Status::ok();
}

Status GdsFile::write(const void* dev, std::size_t bytes, std::uint64_t file_offset) {
  if (handle_ == nullptr) return Status::invalid_argument("GdsFile::write on a closed file");
  if (bytes == 0) return Status::ok();
  if (dev == nullptr) return Status::invalid_argument(fmt::format("cuFileWrite {}: a null device pointer", path_));
  std::size_t done = 0;
  while (done < bytes) {
    const std::size_t chunk = std::min(bytes - done, kMaxTransfer);
    const std::uint64_t at = file_offset + done;
    if (at > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
      return Status::invalid_argument(fmt::format("cuFileWrite {}: offset {} is too large", path_, at));
    }
    errno = 0;
    const ssize_t rc = driver_->api().write(handle_, dev, chunk, static_cast<off_t>(at), static_cast<off_t>(done));
    const int saved = errno;
    if (rc < 0) return transfer_error("cuFileWrite", path_, at, chunk, rc, saved);
    if (rc == 0) {
      return Status(ErrorCode::kIoError, fmt::format("cuFileWrite {} offset {} length {}: no progress after {} bytes",
                                                     path_, file_offset, bytes, done));
    }
    done += static_cast<std::size_t>(rc);
  }
  return Status::ok();
}

Result<GdsBufferRegistration> GdsBufferRegistration::create(std::shared_ptr<CuFileDriver> driver, const void* dev,
                                                            std::size_t bytes) {
  if (!driver) return Status::invalid_argument("cuFileBufRegister: no cuFile driver");
  const cufile::Error err = driver->api().buf_register(dev, bytes, 0);
  if (err.err != cufile::kSuccess) {
    return Status(ErrorCode::kIoError,
                  fmt::format("cuFileBufRegister of {} bytes at {}: {}", bytes, dev, cufile_error_text(err)));
  }
  GdsBufferRegistration reg;
  reg.driver_ = std::move(driver);
  reg.dev_ = dev;
  return reg;
}

GdsBufferRegistration::~GdsBufferRegistration() { reset(); }

GdsBufferRegistration::GdsBufferRegistration(GdsBufferRegistration&& other) noexcept
    : driver_(std::move(other.driver_)), dev_(std::exchange(other.dev_, nullptr)) {}

GdsBufferRegistration& GdsBufferRegistration::operator=(GdsBufferRegistration&& other) noexcept {
  if (this != &other) {
    reset();
    driver_ = std::move(other.driver_);
    dev_ = std::exchange(other.dev_, nullptr);
  }
  return *this;
}

void GdsBufferRegistration::reset() noexcept {
  if (dev_ != nullptr && driver_) (void)driver_->api().buf_deregister(dev_);
  dev_ = nullptr;
  driver_.reset();
}

}  // namespace zinf::gpu
