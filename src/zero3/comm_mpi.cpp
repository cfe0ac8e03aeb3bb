// MPI communicator: non-blocking MPI collectives polled with a deadline; rank-ordered sums.
// Only the C API: the deprecated C++ bindings do not build warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "zero3/rank_order_sum.h"
#include "zinf/zero3/comm_mpi.h"

namespace zinf::zero3 {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(bool owns_mpi, std::chrono::seconds timeout) : owns_mpi_(owns_mpi), timeout_(timeout) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    // The ranks sharing this node's memory are the ranks of this node.
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_size(node, &local_size_);
      MPI_Comm_free(&node);
    }
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && finalized == 0) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "mpi"; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  void abort(int exit_code) noexcept override { MPI_Abort(MPI_COMM_WORLD, exit_code); }

  Status all_gather(std::span<const float> send, std::span<float> recv) override {
    const std::size_t n = send.size();
    ZINF_RETURN_IF_ERROR(check("all_gather", n, recv.size(), n * static_cast<std::size_t>(world_)));
    const bool in_place = send.data() == recv.data() + n * static_cast<std::size_t>(rank_);
    MPI_Request req;
    const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send.data(), static_cast<int>(n), MPI_FLOAT, recv.data(),
                                  static_cast<int>(n), MPI_FLOAT, MPI_COMM_WORLD, &req);
    return finish("all_gather", rc, req);
  }

  // All-to-all of the blocks, then each rank sums its block from every rank in rank order.
  Status reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    const std::size_t n = recv.size();
    ZINF_RETURN_IF_ERROR(check("reduce_scatter", n, send.size(), n * static_cast<std::size_t>(world_)));
    scratch_.resize(send.size());
    MPI_Request req;
    const int rc = MPI_Ialltoall(send.data(), static_cast<int>(n), MPI_FLOAT, scratch_.data(), static_cast<int>(n),
                                 MPI_FLOAT, MPI_COMM_WORLD, &req);
    ZINF_RETURN_IF_ERROR(finish("reduce_scatter", rc, req));
    sum_in_rank_order(scratch_.data(), world_, recv);
    return Status::ok();
  }

  Status all_reduce_sum(std::span<double> data) override {
    const std::size_t n = data.size();
    ZINF_RETURN_IF_ERROR(check("all_reduce_sum", n, n, n));
    gathered_.resize(n * static_cast<std::size_t>(world_));
    MPI_Request req;
    const int rc = MPI_Iallgather(data.data(), static_cast<int>(n), MPI_DOUBLE, gathered_.data(), static_cast<int>(n),
                                  MPI_DOUBLE, MPI_COMM_WORLD, &req);
    ZINF_RETURN_IF_ERROR(finish("all_reduce_sum", rc, req));
    sum_in_rank_order(gathered_.data(), world_, data);
    return Status::ok();
  }

  Status all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    const std::size_t n = send.size();
    ZINF_RETURN_IF_ERROR(check("all_gather_bytes", n, recv.size(), n * static_cast<std::size_t>(world_)));
    MPI_Request req;
    const int rc = MPI_Iallgather(send.data(), static_cast<int>(n), MPI_BYTE, recv.data(), static_cast<int>(n), MPI_BYTE,
                                  MPI_COMM_WORLD, &req);
    return finish("all_gather_bytes", rc, req);
  }

  Status broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= world_) {
      return Status::invalid_argument(fmt::format("broadcast root {} with world size {}", root, world_));
    }
    ZINF_RETURN_IF_ERROR(check("broadcast", data.size(), data.size(), data.size()));
    MPI_Request req;
    const int rc = MPI_Ibcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    return finish("broadcast", rc, req);
  }

  Status barrier() override {
    MPI_Request req;
    const int rc = MPI_Ibarrier(MPI_COMM_WORLD, &req);
    return finish("barrier", rc, req);
  }

 private:
  Status check(const char* op, std::size_t n, std::size_t got, std::size_t want) const {
    if (got != want) {
      return Status::internal(fmt::format("{}: {} elements where {} were expected (world size {})", op, got, want, world_));
    }
    if (n > static_cast<std::size_t>(INT_MAX)) {
      return Status::invalid_argument(fmt::format("{}: {} elements exceed MPI's int count", op, n));
    }
    return Status::ok();
  }

  // Polls the request until it completes or the deadline passes. OpenMPI progresses a
  // non-blocking collective only inside MPI calls, so the first 2 ms spin on MPI_Test (with a
  // yield): a sleeping poller stalls the transfer and notices completion late (figures:
  // docs/benchmarks.md, "Figures behind choices in the code"). After that, short sleeps keep a
  // waiting rank off the CPU.
  Status finish(const char* op, int rc, MPI_Request& req) {
    if (rc != MPI_SUCCESS) return Status(ErrorCode::kIoError, fmt::format("MPI {} failed: {}", op, mpi_error_text(rc)));
    const auto start = std::chrono::steady_clock::now();
    const auto spin_until = start + std::chrono::milliseconds(2);
    const auto deadline = start + timeout_;
    auto pause = std::chrono::microseconds(5);
    for (;;) {
      int done = 0;
      rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return Status(ErrorCode::kIoError, fmt::format("MPI {} failed: {}", op, mpi_error_text(rc)));
      if (done != 0) return Status::ok();
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) {
        return Status::aborted(fmt::format(
            "MPI {} on rank {} of {} did not complete within {} s: another rank has died or is not taking part",
            op, rank_, world_, timeout_.count()));
      }
      if (now < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(100));
      }
    }
  }

  bool owns_mpi_;
  std::chrono::seconds timeout_;
  int rank_ = 0;
  int world_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::vector<float> scratch_;
  std::vector<double> gathered_;
};

}  // namespace

bool mpi_available() { return true; }

Result<std::unique_ptr<Communicator>> make_mpi_communicator(std::chrono::seconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owns = false;
  if (initialized == 0) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return Status(ErrorCode::kIoError, "MPI_Init_thread failed: " + mpi_error_text(rc));
    owns = true;
  }
  // Errors come back as codes, not as aborts, so they can become a Status.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(owns, timeout));
}

}  // namespace zinf::zero3
