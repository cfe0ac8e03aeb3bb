// NCCL communicator: host buffers staged through device scratch on one stream, device buffers on the
// caller's stream, waits polled with a deadline.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "common/cuda_last_error.h"
#include "device/device.h"
#include "zero3/comm_nccl_device.h"
#include "zero3/device_collectives.h"
#include "zero3/rank_order_sum.h"
#include "zinf/zero3/comm_nccl.h"

namespace zinf::zero3 {
namespace {

Status cuda_check(std::string_view what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok();
  const ErrorCode code = e == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kIoError;
  return Status(code, fmt::format("NCCL communicator: {} failed: {}", what, cudaGetErrorString(e)));
}

Status nccl_check(std::string_view what, ncclResult_t r) {
  if (r == ncclSuccess) return Status::ok();
  return Status(ErrorCode::kIoError, fmt::format("NCCL communicator: {} failed: {}", what, ncclGetErrorString(r)));
}

// Owners. The comm is destroyed (ncclCommDestroy) unless it was aborted: abort releases it.
struct CommDestroy {
  void operator()(ncclComm_t c) const { ncclCommDestroy(c); }
};
using CommOwner = std::unique_ptr<std::remove_pointer_t<ncclComm_t>, CommDestroy>;
struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
using StreamOwner = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

// cudaMalloc'ed scratch, grown on demand (never shrunk).
class DeviceBuffer {
 public:
  Status reserve(std::size_t bytes) {
    if (bytes <= capacity_) return Status::ok();
    mem_.reset();
    capacity_ = 0;
    void* p = nullptr;
    ZINF_RETURN_IF_ERROR(cuda_check(fmt::format("cudaMalloc of {} bytes", bytes), cudaMalloc(&p, bytes)));
    mem_.reset(p);
    capacity_ = bytes;
    return Status::ok();
  }
  template <typename T>
  T* as() const { return static_cast<T*>(mem_.get()); }

 private:
  std::unique_ptr<void, CudaFree> mem_;
  std::size_t capacity_ = 0;
};

class NcclCommunicator final : public Communicator, public NcclDeviceCollectives {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, std::chrono::seconds timeout, int device,
                   StreamOwner stream, CommOwner comm)
      : bootstrap_(std::move(bootstrap)), timeout_(timeout), device_(device), rank_(bootstrap_->rank()),
        world_(bootstrap_->world_size()), stream_(std::move(stream)), comm_(std::move(comm)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }
  int local_rank() const override { return bootstrap_->local_rank(); }
  int local_size() const override { return bootstrap_->local_size(); }
  void abort(int exit_code) noexcept override {
    abort_comm();
    bootstrap_->abort(exit_code);
  }

  // This rank's block goes to its place in device scratch and is gathered in place there.
  Status all_gather(std::span<const float> send, std::span<float> recv) override {
    const std::size_t n = send.size();
    ZINF_RETURN_IF_ERROR(check("all_gather", n, recv.size(), n * world(), sizeof(float)));
    if (n == 0) return Status::ok();
    ZINF_RETURN_IF_ERROR(begin("all_gather", recv.size_bytes(), 0));
    float* dev = a_.as<float>();
    float* mine = dev + n * static_cast<std::size_t>(rank_);
    ZINF_RETURN_IF_ERROR(to_device("all_gather", mine, send.data(), send.size_bytes()));
    ZINF_RETURN_IF_ERROR(nccl_check("ncclAllGather", ncclAllGather(mine, dev, n, ncclFloat, comm_.get(), stream_.get())));
    return to_host("all_gather", recv.data(), dev, recv.size_bytes());
  }

  // All-to-all of the blocks, then each rank sums its block from every rank in rank order.
  Status reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    const std::size_t n = recv.size();
    ZINF_RETURN_IF_ERROR(check("reduce_scatter", n, send.size(), n * world(), sizeof(float)));
    if (n == 0) return Status::ok();
    ZINF_RETURN_IF_ERROR(begin("reduce_scatter", send.size_bytes(), send.size_bytes()));
    const float* out = a_.as<float>();
    float* in = b_.as<float>();
    ZINF_RETURN_IF_ERROR(to_device("reduce_scatter", a_.as<float>(), send.data(), send.size_bytes()));
    ZINF_RETURN_IF_ERROR(nccl_check("ncclGroupStart", ncclGroupStart()));
    ncclResult_t r = ncclSuccess;
    for (int p = 0; p < world_ && r == ncclSuccess; ++p) {
      const std::size_t at = n * static_cast<std::size_t>(p);
      r = ncclSend(out + at, n, ncclFloat, p, comm_.get(), stream_.get());
      if (r == ncclSuccess) r = ncclRecv(in + at, n, ncclFloat, p, comm_.get(), stream_.get());
    }
    const ncclResult_t end = ncclGroupEnd();  // closes the group even when a call in it failed
    ZINF_RETURN_IF_ERROR(nccl_check("ncclSend/ncclRecv (reduce_scatter)", r));
    ZINF_RETURN_IF_ERROR(nccl_check("ncclGroupEnd (reduce_scatter)", end));
    host_floats_.resize(send.size());
    ZINF_RETURN_IF_ERROR(to_host("reduce_scatter", host_floats_.data(), in, send.size_bytes()));
    sum_in_rank_order(host_floats_.data(), world_, recv);
    return Status::ok();
  }

  // All-gather of every rank's data, then an elementwise sum in rank order.
  Status all_reduce_sum(std::span<double> data) override {
    const std::size_t n = data.size();
    ZINF_RETURN_IF_ERROR(check("all_reduce_sum", n, n, n, sizeof(double)));
    if (n == 0) return Status::ok();
    const std::size_t all_bytes = data.size_bytes() * world();
    ZINF_RETURN_IF_ERROR(begin("all_reduce_sum", all_bytes, 0));
    double* dev = a_.as<double>();
    double* mine = dev + n * static_cast<std::size_t>(rank_);
    ZINF_RETURN_IF_ERROR(to_device("all_reduce_sum", mine, data.data(), data.size_bytes()));
    ZINF_RETURN_IF_ERROR(nccl_check("ncclAllGather (all_reduce_sum)",
                                    ncclAllGather(mine, dev, n, ncclDouble, comm_.get(), stream_.get())));
    host_doubles_.resize(n * world());
    ZINF_RETURN_IF_ERROR(to_host("all_reduce_sum", host_doubles_.data(), dev, all_bytes));
    sum_in_rank_order(host_doubles_.data(), world_, data);
    return Status::ok();
  }

  // As all_gather, in bytes.
  Status all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    const std::size_t n = send.size();
    ZINF_RETURN_IF_ERROR(check("all_gather_bytes", n, recv.size(), n * world(), 1));
    if (n == 0) return Status::ok();
    ZINF_RETURN_IF_ERROR(begin("all_gather_bytes", recv.size(), 0));
    std::uint8_t* dev = a_.as<std::uint8_t>();
    std::uint8_t* mine = dev + n * static_cast<std::size_t>(rank_);
    ZINF_RETURN_IF_ERROR(to_device("all_gather_bytes", mine, send.data(), n));
    ZINF_RETURN_IF_ERROR(nccl_check("ncclAllGather (all_gather_bytes)",
                                    ncclAllGather(mine, dev, n, ncclUint8, comm_.get(), stream_.get())));
    return to_host("all_gather_bytes", recv.data(), dev, recv.size());
  }

  Status broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= world_) {
      return Status::invalid_argument(fmt::format("broadcast root {} with world size {}", root, world_));
    }
    if (data.empty()) return Status::ok();
    ZINF_RETURN_IF_ERROR(begin("broadcast", data.size(), 0));
    std::uint8_t* dev = a_.as<std::uint8_t>();
    if (rank_ == root) ZINF_RETURN_IF_ERROR(to_device("broadcast", dev, data.data(), data.size()));
    ZINF_RETURN_IF_ERROR(
        nccl_check("ncclBroadcast", ncclBroadcast(dev, dev, data.size(), ncclUint8, root, comm_.get(), stream_.get())));
    return to_host("broadcast", data.data(), dev, data.size());
  }

  Status barrier() override { return bootstrap_->barrier(); }

  int device() const override { return device_; }

  Status all_gather_device(const float* send, float* recv, std::size_t n, cudaStream_t stream) override {
    if (n == 0) return Status::ok();
    ZINF_RETURN_IF_ERROR(check_device_args("all_gather_device", send, recv, n));
    ZINF_RETURN_IF_ERROR(ready("all_gather_device"));
    return nccl_check(fmt::format("ncclAllGather of {} floats per rank on device buffers", n),
                      ncclAllGather(send, recv, n, ncclFloat, comm_.get(), stream));
  }

  Status all_gather_device16(const std::uint16_t* send, std::uint16_t* recv, std::size_t n,
                             cudaStream_t stream) override {
    if (n == 0) return Status::ok();
    ZINF_RETURN_IF_ERROR(check_device_args("all_gather_device16", send, recv, n, sizeof(std::uint16_t)));
    ZINF_RETURN_IF_ERROR(ready("all_gather_device16"));
    return nccl_check(fmt::format("ncclAllGather of {} 16-bit values per rank on device buffers", n),
                      ncclAllGather(send, recv, n, ncclFloat16, comm_.get(), stream));
  }

  Status reduce_scatter_device(const float* send, float* recv, std::size_t n, cudaStream_t stream) override {
    if (n == 0) return Status::ok();
    ZINF_RETURN_IF_ERROR(check_device_args("reduce_scatter_device", send, recv, n));
    ZINF_RETURN_IF_ERROR(ready("reduce_scatter_device"));
    return nccl_check(fmt::format("ncclReduceScatter of {} floats per rank on device buffers", n),
                      ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, comm_.get(), stream));
  }

  Status wait_device(cudaStream_t stream, std::string_view op) override {
    const std::string name(op);
    ZINF_RETURN_IF_ERROR(ready(name.c_str()));
    return wait(name.c_str(), stream);
  }

 private:
  std::size_t world() const { return static_cast<std::size_t>(world_); }

  // got == want, and the largest staged buffer (n * world * elem bytes) fits in a size_t.
  Status check(const char* op, std::size_t n, std::size_t got, std::size_t want, std::size_t elem) const {
    if (got != want) {
      return Status::internal(fmt::format("{}: {} elements where {} were expected (world size {})", op, got, want, world_));
    }
    if (n > SIZE_MAX / world() / elem) {
      return Status::invalid_argument(fmt::format("{}: {} elements are too many to stage on the GPU", op, n));
    }
    return Status::ok();
  }

  // Every collective starts here: the comm must be alive and this thread on our GPU.
  Status ready(const char* op) {
    if (!comm_) {
      return Status::aborted(fmt::format("NCCL {} on rank {} of {}: the NCCL communicator was aborted by an earlier failure",
                                         op, rank_, world_));
    }
    return cuda_check(fmt::format("cudaSetDevice({}) for {}", device_, op), cudaSetDevice(device_));
  }

  // A host-buffer collective: ready(), and scratch large enough.
  Status begin(const char* op, std::size_t a_bytes, std::size_t b_bytes) {
    ZINF_RETURN_IF_ERROR(ready(op));
    ZINF_RETURN_IF_ERROR(a_.reserve(a_bytes).with_context(op));
    return b_.reserve(b_bytes).with_context(op);
  }

  Status to_device(const char* op, void* dev, const void* host, std::size_t bytes) {
    return cuda_check(fmt::format("cudaMemcpyAsync host->device ({} bytes, {})", bytes, op),
                      cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_.get()));
  }

  // Waits for the collective before copying back: a device->host copy into pageable memory blocks
  // the host until the stream reaches it, which would not be bounded by the deadline.
  Status to_host(const char* op, void* host, const void* dev, std::size_t bytes) {
    ZINF_RETURN_IF_ERROR(wait(op));
    ZINF_RETURN_IF_ERROR(cuda_check(fmt::format("cudaMemcpyAsync device->host ({} bytes, {})", bytes, op),
                                    cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_.get())));
    return wait(op);
  }

  // The sizes of a device collective fit the staged byte counts NCCL computes.
  // `elem`: the bytes of one value (4: floats, 2: 16-bit values).
  Status check_device_args(const char* op, const void* send, const void* recv, std::size_t n,
                           std::size_t elem = sizeof(float)) const {
    const char* unit = elem == sizeof(float) ? "floats" : "values";
    if (send == nullptr || recv == nullptr) {
      return Status::invalid_argument(fmt::format("NCCL {}: a null device buffer ({} {} per rank)", op, n, unit));
    }
    if (n > SIZE_MAX / world() / elem) {
      return Status::invalid_argument(fmt::format("NCCL {}: {} {} per rank are too many", op, n, unit));
    }
    return Status::ok();
  }

  Status wait(const char* op) { return wait(op, stream_.get()); }

  // Polls `stream` and NCCL's asynchronous error until the stream is idle or the deadline passes.
  Status wait(const char* op, cudaStream_t stream) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return Status::ok();
      forget_cuda_error(q);
      if (q != cudaErrorNotReady) {
        abort_comm();
        return cuda_check(fmt::format("cudaStreamQuery ({} on rank {} of {})", op, rank_, world_), q);
      }
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_.get(), &async);
      if (r == ncclSuccess && async != ncclInProgress) r = async;
      if (r != ncclSuccess) {
        abort_comm();
        return nccl_check(fmt::format("{} on rank {} of {} (ncclCommGetAsyncError)", op, rank_, world_), r);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort_comm();
        return Status::aborted(fmt::format(
            "NCCL {} on rank {} of {} did not complete within {} s: another rank has died or is not taking part",
            op, rank_, world_, timeout_.count()));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // Ends the NCCL communicator's work (its kernels return); later collectives fail with Aborted.
  void abort_comm() noexcept {
    if (comm_) ncclCommAbort(comm_.release());
  }

  // Declaration order is destruction order in reverse: comm, then scratch, then stream, then bootstrap.
  std::unique_ptr<Communicator> bootstrap_;
  std::chrono::seconds timeout_;
  int device_;
  int rank_;
  int world_;
  StreamOwner stream_;
  DeviceBuffer a_;
  DeviceBuffer b_;
  std::vector<float> host_floats_;
  std::vector<double> host_doubles_;
  CommOwner comm_;
};

// This rank's GPU and stream; the caller makes every rank agree before going on.
Status set_up_device(int rank, int local_rank, int& device, StreamOwner& stream) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    forget_cuda_error(e);
    return Status::unsupported(fmt::format("NCCL communicator: no CUDA device visible on rank {} (cudaGetDeviceCount: {})",
                                           rank, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
  }
  device = local_rank % count;
  ZINF_RETURN_IF_ERROR(cuda_check(fmt::format("cudaSetDevice({}) on rank {}", device, rank), cudaSetDevice(device)));
  cudaStream_t s = nullptr;
  ZINF_RETURN_IF_ERROR(cuda_check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  stream.reset(s);
  return Status::ok();
}

// device_collectives.h on a GPU: the NCCL communicator's device collectives, enqueued through
// the device's work items (which a GPU runs at enqueue time, with the role's native stream).
class NcclOnDevice final : public DeviceCollectives {
 public:
  NcclOnDevice(device::Device& device, NcclDeviceCollectives& nccl, int rank)
      : device_(device), nccl_(nccl), rank_(static_cast<std::size_t>(rank)) {}

  std::string describe() const override { return fmt::format("NCCL on GPU {}", nccl_.device()); }

  Status all_gather(device::StreamRole role, float* block, std::size_t n) override {
    used_[static_cast<std::size_t>(role)] = true;
    const float* mine = block + n * rank_;
    return device_.enqueue(role, [this, mine, block, n](const device::StreamContext& ctx) {
      return nccl_.all_gather_device(mine, block, n, static_cast<cudaStream_t>(ctx.native_stream));
    }, "NCCL all-gather");
  }

  Status all_gather16(device::StreamRole role, std::uint16_t* block, std::size_t n) override {
    used_[static_cast<std::size_t>(role)] = true;
    const std::uint16_t* mine = block + n * rank_;
    return device_.enqueue(role, [this, mine, block, n](const device::StreamContext& ctx) {
      return nccl_.all_gather_device16(mine, block, n, static_cast<cudaStream_t>(ctx.native_stream));
    }, "NCCL all-gather (16-bit)");
  }

  Status reduce_scatter(device::StreamRole role, float* block, std::size_t n) override {
    used_[static_cast<std::size_t>(role)] = true;
    float* mine = block + n * rank_;
    return device_.enqueue(role, [this, mine, block, n](const device::StreamContext& ctx) {
      return nccl_.reduce_scatter_device(block, mine, n, static_cast<cudaStream_t>(ctx.native_stream));
    }, "NCCL reduce-scatter");
  }

  // Each stream a collective went on, drained while watching NCCL's errors (wait_device).
  Status finish() override {
    for (int r = 0; r < device::kStreamRoles; ++r) {
      if (!used_[static_cast<std::size_t>(r)]) continue;
      cudaStream_t stream = nullptr;
      ZINF_RETURN_IF_ERROR(device_.enqueue(static_cast<device::StreamRole>(r), [&stream](const device::StreamContext& ctx) {
        stream = static_cast<cudaStream_t>(ctx.native_stream);
        return Status::ok();
      }, "the stream of the device collectives"));
      ZINF_RETURN_IF_ERROR(nccl_.wait_device(stream, "device collectives"));
      used_[static_cast<std::size_t>(r)] = false;
    }
    return Status::ok();
  }

 private:
  device::Device& device_;
  NcclDeviceCollectives& nccl_;
  std::size_t rank_;
  std::array<bool, device::kStreamRoles> used_{};
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<DeviceCollectives> make_nccl_device_collectives(device::Device& device, Communicator& comm) {
  NcclDeviceCollectives* nccl = nccl_device_collectives(comm);
  if (nccl == nullptr || device.host_addressable()) return nullptr;
  // The device's work runs with its GPU current: it must be the one the communicator was made on.
  int current = -1;
  const Status probed = device.enqueue(device::StreamRole::kCompute, [&current](const device::StreamContext&) {
    return cuda_check("cudaGetDevice", cudaGetDevice(&current));
  }, "which GPU");
  if (!probed.is_ok() || current != nccl->device()) return nullptr;
  return std::make_unique<NcclOnDevice>(device, *nccl, comm.rank());
}

NcclDeviceCollectives* nccl_device_collectives(Communicator& comm) {
  return dynamic_cast<NcclCommunicator*>(&comm);
}

Result<std::unique_ptr<Communicator>> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                             std::chrono::seconds timeout) {
  if (!bootstrap) return Status::invalid_argument("make_nccl_communicator: no bootstrap communicator");
  const int rank = bootstrap->rank(), world = bootstrap->world_size();
  int device = 0;
  StreamOwner stream;
  const Status local = set_up_device(rank, bootstrap->local_rank(), device, stream);
  // Every rank learns whether every rank has a GPU, so that a rank without one is an error everywhere.
  std::array<double, 1> ready = {local.is_ok() ? 1.0 : 0.0};
  const Status agreed = bootstrap->all_reduce_sum(ready).with_context("NCCL communicator setup");
  if (!local.is_ok()) return local;
  ZINF_RETURN_IF_ERROR(agreed);
  if (ready[0] != static_cast<double>(world)) {
    return Status::aborted(fmt::format("NCCL communicator: {} of {} ranks could not set up a CUDA device",
                                       world - static_cast<int>(ready[0]), world));
  }
  // Rank 0's unique id, and a last byte saying whether rank 0 got one.
  std::array<std::byte, sizeof(ncclUniqueId) + 1> id_bytes{};
  Status id_status = Status::ok();
  if (rank == 0) {
    ncclUniqueId id;
    id_status = nccl_check("ncclGetUniqueId", ncclGetUniqueId(&id));
    if (id_status.is_ok()) std::memcpy(id_bytes.data(), &id, sizeof(id));
    id_bytes.back() = std::byte{id_status.is_ok() ? std::uint8_t{1} : std::uint8_t{0}};
  }
  ZINF_RETURN_IF_ERROR(bootstrap->broadcast(id_bytes, 0).with_context("NCCL communicator: broadcast of the unique id"));
  if (!id_status.is_ok()) return id_status;
  if (id_bytes.back() != std::byte{1}) return Status::aborted("NCCL communicator: rank 0 could not create the NCCL unique id");
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  ncclComm_t raw = nullptr;
  ZINF_RETURN_IF_ERROR(nccl_check(fmt::format("ncclCommInitRank (rank {} of {}, device {})", rank, world, device),
                                  ncclCommInitRank(&raw, world, id, rank)));
  CommOwner comm(raw);
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(bootstrap), timeout, device,
                                                                          std::move(stream), std::move(comm)));
}

}  // namespace zinf::zero3
