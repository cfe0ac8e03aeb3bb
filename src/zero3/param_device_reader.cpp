// Partitions of the NVMe parameter tier into device memory: GPUDirect Storage or the bounce path.
#include "zero3/param_device_reader.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "zinf/log.h"
#include "zinf/swap/param_swapper.h"

namespace zinf::zero3 {
namespace {

std::string no_gpu_reason(const device::Device& device) {
  return fmt::format("there is no GPU (the engine's device is the {})", device.describe());
}

void notice_bounce(const std::string& why) {
  // One notice per reason and process: every rank and every engine of a run would say the same.
  log_once(LogLevel::kNotice, "aio.use_gds: " + why,
           fmt::format("aio.use_gds is true, but {}: parameter partitions move through pinned host memory", why));
}

}  // namespace

Result<std::unique_ptr<ParamDeviceReader>> ParamDeviceReader::create(const swap::PartitionLayout& layout,
                                                                     ParamTier& tier, device::Device& device,
                                                                     const DirectPathRequest& request) {
  swap::ParamSwapper* swapper = tier.nvme_swapper();
  if (swapper == nullptr) {
    return Status::invalid_argument(fmt::format(
        "the device reader reads an nvme parameter tier (offload_param.device nvme); this one is {}", tier.describe()));
  }
  std::unique_ptr<ParamDeviceReader> reader(new ParamDeviceReader(layout, *swapper, device));
  ZINF_RETURN_IF_ERROR(reader->allocate_staging().with_context("the device reader's pinned staging"));
  if (!request.use_gds) return reader;
  reader->why_bounce_ = reader->open_direct(request);
  if (reader->direct()) {
    log(LogLevel::kInfo, fmt::format("aio.use_gds: parameter partitions move between {} and device memory through {}",
                                     swapper->store().folder(), reader->storage_->describe()));
  } else {
    notice_bounce(reader->why_bounce_);
  }
  return reader;
}

Status ParamDeviceReader::allocate_staging() {
  const std::size_t bytes = std::min(swapper_.swapper().chunk_bytes(), kStagingBytes);
  for (Staging& st : staging_) {
    ZINF_ASSIGN_OR_RETURN(st.buffer, aio::PinnedBuffer::allocate(bytes, 4096));
  }
  return Status::ok();
}

std::string ParamDeviceReader::open_direct(const DirectPathRequest& request) {
  if (!request.open_storage) return "this build has no GPU layer (no CUDA toolkit when it was built)";
  Result<std::shared_ptr<device::DirectStorage>> storage = request.open_storage();
  // On the host device, "no GPU" is the reason whatever the library says; only a library that
  // addresses host memory (the tests' fake libcufile) can serve it.
  if (device_.host_addressable() && (!storage.is_ok() || !storage.value()->addresses_host_memory())) {
    return no_gpu_reason(device_);
  }
  if (!storage.is_ok()) return storage.status().message();
  if (!device_.host_addressable() && storage.value()->addresses_host_memory()) {
    return fmt::format("{} addresses host memory, not the memory of {}", storage.value()->describe(),
                       device_.describe());
  }
  std::vector<std::unique_ptr<device::DirectFile>> files;
  for (const std::string& path : swapper_.store().data_files()) {
    Result<std::unique_ptr<device::DirectFile>> f = storage.value()->open(path, /*write=*/false);
    if (!f.is_ok()) return fmt::format("{} refused the swap file: {}", storage.value()->describe(), f.status().message());
    files.push_back(std::move(f).value());
  }
  storage_ = std::move(storage).value();
  files_ = std::move(files);
  return "";
}

std::string ParamDeviceReader::describe() const {
  return direct() ? storage_->describe() : std::string("pinned host memory and H2D copies");
}

std::uint64_t ParamDeviceReader::partition_bytes(std::size_t p) const {
  return layout_.params[p].numel * swap::dtype_size(swapper_.config().dtype);
}

Status ParamDeviceReader::read(std::size_t p, void* device_dst) {
  if (p >= layout_.params.size()) {
    return Status::invalid_argument(
        fmt::format("parameter partition {} into device memory: the layout has {}", p, layout_.params.size()));
  }
  const std::string& key = layout_.params[p].key;
  const std::uint64_t nbytes = partition_bytes(p);
  if (nbytes == 0) return Status::ok();
  if (device_dst == nullptr) {
    return Status::invalid_argument(fmt::format("parameter partition '{}' into device memory: a null pointer", key));
  }
  auto* dst = static_cast<std::byte*>(device_dst);
  ZINF_ASSIGN_OR_RETURN(swap::TensorInfo info, swapper_.info(key));
  // The CPU tier holds the authoritative copy in host memory: one H2D copy beats any file read.
  const bool from_files = direct() && info.home == swap::Tier::kNvme;
  std::lock_guard lock(mutex_);
  Status s = from_files ? read_direct(key, nbytes, dst) : read_bounced(key, dst);
  if (!s.is_ok()) {
    return s.with_context(fmt::format("parameter partition '{}' ({} bytes) into device memory via {}", key, nbytes,
                                      from_files ? storage_->describe() : "pinned host memory"));
  }
  (from_files ? bytes_direct_ : bytes_bounced_).fetch_add(nbytes, std::memory_order_relaxed);
  return Status::ok();
}

Status ParamDeviceReader::read_direct(const std::string& key, std::uint64_t nbytes, std::byte* dst) {
  ZINF_ASSIGN_OR_RETURN(std::vector<swap::FileSpan> spans, swapper_.store().locate(key, 0, nbytes));
  for (const swap::FileSpan& s : spans) {
    ZINF_RETURN_IF_ERROR(files_[s.file]->read(dst + s.tensor_offset, s.length, s.file_offset));
  }
  return Status::ok();
}

Status ParamDeviceReader::read_bounced(const std::string& key, std::byte* dst) {
  // The swapper's chunk is valid only during the sink's call and its pool may be pageable
  // (offload_param.pin_memory false), which a GPU's copy engine refuses: each piece is copied into
  // one of two pinned staging buffers and uploaded from there, so the H2D copy of one piece runs
  // while the next is read and copied.
  Status s = swapper_
                 .fetch_into(key,
                             [&](std::uint64_t offset, std::span<const std::byte> bytes) -> Status {
                               for (std::size_t done = 0; done < bytes.size();) {
                                 Staging& st = staging_[next_staging_];
                                 next_staging_ ^= 1;
                                 ZINF_RETURN_IF_ERROR(device_.synchronize(st.uploaded));
                                 const std::size_t n = std::min(bytes.size() - done, st.buffer.size());
                                 std::memcpy(st.buffer.data(), bytes.data() + done, n);
                                 ZINF_RETURN_IF_ERROR(
                                     device_.copy_h2d(dst + offset + done, st.buffer.data(), n, key));
                                 ZINF_ASSIGN_OR_RETURN(st.uploaded, device_.record(device::StreamRole::kH2D));
                                 done += n;
                               }
                               return Status::ok();
                             })
                 .wait();
  // Whatever happened, no copy may still read the staging buffers, nor write dst, after the return.
  for (Staging& st : staging_) {
    Status w = device_.synchronize(st.uploaded);
    st.uploaded = device::Event();
    if (s.is_ok()) s = w;
  }
  return s;
}

void note_use_gds_not_served(const config::DsConfig& ds, const device::Device* device) {
  if (!ds.aio.use_gds || ds.zero.offload_param.device != config::OffloadDevice::kNvme) return;
  if (device == nullptr) {
    notice_bounce("this engine gathers parameters in host memory, where GPUDirect Storage has nothing to fill");
  } else if (device->host_addressable()) {
    notice_bounce(no_gpu_reason(*device));
  } else {
    notice_bounce("the device gather target stages NVMe parameter reads in host memory (it does not use the "
                  "GPUDirect Storage reader yet)");
  }
}

}  // namespace zinf::zero3
