// The world-size-1 communicator: collectives reduce to copies.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "zinf/zero3/comm.h"

namespace zinf::zero3 {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "local"; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }

  Status all_gather(std::span<const float> send, std::span<float> recv) override {
    if (recv.size() != send.size()) return size_error("all_gather", send.size(), recv.size());
    if (send.data() != recv.data()) std::copy(send.begin(), send.end(), recv.begin());
    return Status::ok();
  }
  Status reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    if (recv.size() != send.size()) return size_error("reduce_scatter", send.size(), recv.size());
    if (send.data() != recv.data()) std::copy(send.begin(), send.end(), recv.begin());
    return Status::ok();
  }
  Status all_reduce_sum(std::span<double>) override { return Status::ok(); }
  Status all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (recv.size() != send.size()) return size_error("all_gather_bytes", send.size(), recv.size());
    std::copy(send.begin(), send.end(), recv.begin());
    return Status::ok();
  }
  Status broadcast(std::span<std::byte>, int root) override {
    if (root != 0) return Status::invalid_argument(fmt::format("broadcast root {} with world size 1", root));
    return Status::ok();
  }
  Status barrier() override { return Status::ok(); }
  void abort(int) noexcept override {}

 private:
  static Status size_error(const char* op, std::size_t send, std::size_t recv) {
    return Status::internal(fmt::format("{}: send has {} elements, recv {} (world size 1)", op, send, recv));
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace zinf::zero3
