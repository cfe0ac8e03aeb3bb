// zinf's MPI collectives (all-gather, reduce-scatter) against raw MPI on the same buffers.
//
// Run under mpirun (2 or 3 ranks; this is what `meson test --benchmark comm` does with 2):
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 build/bench/comm_bench
// For each message size (fp32 elements per rank, default 256K 1M 4M 16M) it times, interleaved
// (order A B C, then C B A, ...) over --reps rounds, with a barrier before every timed op and
// the time of an op = the maximum over ranks (MPI_Reduce MPI_MAX):
//   all-gather, in place as the engine uses it (send = recv's rank block):
//     zinf    Communicator::all_gather (MPI_Iallgather polled with MPI_Test and a sleep)
//     raw     MPI_Allgather(MPI_IN_PLACE)
//     iwait   MPI_Iallgather + MPI_Wait: zinf's collective without the sleep-polling
//   reduce-scatter, W * n elements in, n out:
//     zinf    Communicator::reduce_scatter (MPI_Ialltoall polled, then a rank-ordered sum)
//     raw     MPI_Reduce_scatter_block(MPI_SUM, MPI_FLOAT)
//     raw_rs  MPI_Reduce_scatter with W equal counts (OpenMPI picks its algorithms per call)
//     a2a     MPI_Ialltoall + MPI_Wait: zinf's communication without the sum
//     sum     the rank-ordered sum of W blocks alone (local, no communication)
// Bandwidths follow nccl-tests: algbw = W * n * 4 bytes / time, busbw = algbw * (W - 1) / W.
// Medians over the rounds give a table and the last line:
//   allgather_ratio=X reduce_scatter_ratio=Y (median over sizes >= 1M)
// where a ratio is zinf's busbw / raw's busbw (>= 0.9 is the goal); the line also gives
// reduce-scatter against MPI_Reduce_scatter. Every buffer is written
// before timing, and one untimed call of every variant warms up each size (and checks results).
// MPI's own temporaries are kept in glibc's heap (no mmap, no trim) so that raw MPI does not pay
// a page fault per page per call either; --glibc-malloc-default shows what it costs otherwise.
// Not a test: these machines are shared and noisy; the ratios are what carry information.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_timing.h"
#include "zinf/zero3/comm_mpi.h"

namespace {

using namespace zinf;
using Clock = std::chrono::steady_clock;

struct Variant {
  const char* name;
  std::function<Status()> run;
  std::vector<double> seconds;  // max over ranks, one per round (rank 0 only)
};

using zinf::bench::median;

Status mpi_status(const char* op, int rc) {
  return rc == MPI_SUCCESS ? Status::ok() : Status(ErrorCode::kIoError, fmt::format("{} failed ({})", op, rc));
}

// One op on every rank, after a barrier; the slowest rank's time reaches rank 0.
Status time_once(Variant& v, int rank) {
  ZINF_RETURN_IF_ERROR(mpi_status("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD)));
  const auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(v.run());
  const double mine = std::chrono::duration<double>(Clock::now() - t0).count();
  double slowest = 0.0;
  ZINF_RETURN_IF_ERROR(mpi_status("MPI_Reduce", MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD)));
  if (rank == 0) v.seconds.push_back(slowest);
  return Status::ok();
}

// Rounds of every variant, the order reversed every other round (A B C, C B A, ...).
Status run_rounds(std::vector<Variant>& vs, int reps, int rank) {
  for (Variant& v : vs) ZINF_RETURN_IF_ERROR(v.run());  // warm-up: scratch buffers, MPI's own
  for (int round = 0; round < reps; ++round) {
    for (std::size_t k = 0; k < vs.size(); ++k) {
      const std::size_t which = round % 2 == 0 ? k : vs.size() - 1 - k;
      ZINF_RETURN_IF_ERROR(time_once(vs[which], rank));
    }
  }
  return Status::ok();
}

// The sum zinf's reduce_scatter does after its all-to-all: recv = block 0 + block 1 + ... in order.
void rank_ordered_sum(const std::vector<float>& blocks, std::vector<float>& recv, int world) {
  const std::size_t n = recv.size();
  std::copy(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(n), recv.begin());
  for (int r = 1; r < world; ++r) {
    const float* block = blocks.data() + n * static_cast<std::size_t>(r);
    for (std::size_t i = 0; i < n; ++i) recv[i] += block[i];
  }
}

struct Row {
  std::size_t n;
  std::vector<double> ms;  // median per variant
};

double busbw_gbs(std::size_t n, int world, double s) {
  const double bytes = static_cast<double>(n) * world * sizeof(float);
  return s > 0 ? bytes / s * (world - 1) / world / 1e9 : 0.0;
}

void print_table(const char* op, const std::vector<Row>& rows, const std::vector<Variant>& vs, int world) {
  std::printf("\n%s, %d ranks (median ms, max over ranks; busbw GB/s = W*n*4/t*(W-1)/W)\n", op, world);
  std::printf("%12s %9s", "elems/rank", "MiB/rank");
  for (const Variant& v : vs) std::printf(" %9s", (std::string(v.name) + "_ms").c_str());
  std::printf(" %11s %10s", "zinf_busbw", "raw_busbw");
  for (const Variant& v : vs) {
    if (std::string(v.name).starts_with("raw")) std::printf(" %11s", ("zinf/" + std::string(v.name)).c_str());
  }
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf("%12zu %9.2f", r.n, r.n * sizeof(float) / 1048576.0);
    for (double ms : r.ms) std::printf(" %9.3f", ms);
    std::printf(" %11.2f %10.2f", busbw_gbs(r.n, world, r.ms[0] / 1e3), busbw_gbs(r.n, world, r.ms[1] / 1e3));
    for (std::size_t k = 0; k < vs.size(); ++k) {  // busbw ratio = time ratio
      if (std::string(vs[k].name).starts_with("raw")) std::printf(" %11.3f", r.ms[0] > 0 ? r.ms[k] / r.ms[0] : 0.0);
    }
    std::printf("\n");
  }
}

// zinf / reference busbw (= reference time / zinf time) per size, median over sizes >= 1M elements.
double summary_ratio(const std::vector<Row>& rows, std::size_t reference = 1) {
  std::vector<double> ratios;
  for (const Row& r : rows) {
    if (r.n >= (1u << 20) && r.ms[0] > 0) ratios.push_back(r.ms[reference] / r.ms[0]);
  }
  return median(ratios);
}

Status check(bool ok, const char* what, std::size_t n) {
  return ok ? Status::ok() : Status::internal(fmt::format("{}: wrong result at {} elements per rank", what, n));
}

Status bench_all_gather(zero3::Communicator& comm, std::size_t n, int reps, std::vector<Row>& rows,
                        std::vector<Variant>& out) {
  const int rank = comm.rank(), world = comm.world_size();
  const auto W = static_cast<std::size_t>(world);
  std::vector<float> recv(n * W);  // (W, n); zero-filled: pre-faulted
  float* mine = recv.data() + n * static_cast<std::size_t>(rank);
  auto fill = [&] {  // small integers: exact in fp32
    for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(rank * 1000 + static_cast<int>(i % 1000));
  };
  auto correct = [&] {
    for (std::size_t r = 0; r < W; ++r) {
      for (std::size_t i = 0; i < n; i += 997) {
        if (recv[r * n + i] != static_cast<float>(static_cast<int>(r) * 1000 + static_cast<int>(i % 1000))) return false;
      }
    }
    return true;
  };
  const int count = static_cast<int>(n);
  std::vector<Variant> vs = {
      {"zinf", [&] { return comm.all_gather(std::span<const float>(mine, n), recv); }, {}},
      {"raw",
       [&] {
         return mpi_status("MPI_Allgather", MPI_Allgather(MPI_IN_PLACE, count, MPI_FLOAT, recv.data(), count,
                                                          MPI_FLOAT, MPI_COMM_WORLD));
       },
       {}},
      {"iwait",
       [&] {
         MPI_Request req;
         ZINF_RETURN_IF_ERROR(mpi_status("MPI_Iallgather", MPI_Iallgather(MPI_IN_PLACE, count, MPI_FLOAT, recv.data(),
                                                                          count, MPI_FLOAT, MPI_COMM_WORLD, &req)));
         return mpi_status("MPI_Wait", MPI_Wait(&req, MPI_STATUS_IGNORE));
       },
       {}},
  };
  for (Variant& v : vs) {  // each variant gives the right answer from a cleared buffer
    std::fill(recv.begin(), recv.end(), -1.0f);
    fill();
    ZINF_RETURN_IF_ERROR(v.run());
    ZINF_RETURN_IF_ERROR(check(correct(), v.name, n));
  }
  ZINF_RETURN_IF_ERROR(run_rounds(vs, reps, rank));
  Row row{n, {}};
  for (const Variant& v : vs) row.ms.push_back(median(v.seconds) * 1e3);
  rows.push_back(row);
  out = std::move(vs);
  return Status::ok();
}

Status bench_reduce_scatter(zero3::Communicator& comm, std::size_t n, int reps, std::vector<Row>& rows,
                            std::vector<Variant>& out) {
  const int rank = comm.rank(), world = comm.world_size();
  const auto W = static_cast<std::size_t>(world);
  std::vector<float> send(n * W), recv(n), scratch(n * W);  // (W, n), (n), (W, n): pre-faulted
  for (std::size_t b = 0; b < W; ++b) {  // send block b, rank r: (r + 1) * (i % 7 + b), exact sums
    for (std::size_t i = 0; i < n; ++i) send[b * n + i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + b));
  }
  auto correct = [&] {
    const int ranks_sum = world * (world + 1) / 2;
    for (std::size_t i = 0; i < n; i += 997) {
      if (recv[i] != static_cast<float>(ranks_sum * static_cast<int>(i % 7 + static_cast<std::size_t>(rank)))) {
        return false;
      }
    }
    return true;
  };
  const int count = static_cast<int>(n);
  const std::vector<int> counts(W, count);
  std::vector<Variant> vs = {
      {"zinf", [&] { return comm.reduce_scatter(send, recv); }, {}},
      {"raw",
       [&] {
         return mpi_status("MPI_Reduce_scatter_block", MPI_Reduce_scatter_block(send.data(), recv.data(), count,
                                                                                MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
       },
       {}},
      {"raw_rs",
       [&] {
         return mpi_status("MPI_Reduce_scatter", MPI_Reduce_scatter(send.data(), recv.data(), counts.data(), MPI_FLOAT,
                                                                    MPI_SUM, MPI_COMM_WORLD));
       },
       {}},
      {"a2a",
       [&] {
         MPI_Request req;
         ZINF_RETURN_IF_ERROR(mpi_status("MPI_Ialltoall", MPI_Ialltoall(send.data(), count, MPI_FLOAT, scratch.data(),
                                                                        count, MPI_FLOAT, MPI_COMM_WORLD, &req)));
         return mpi_status("MPI_Wait", MPI_Wait(&req, MPI_STATUS_IGNORE));
       },
       {}},
      {"sum",
       [&] {
         rank_ordered_sum(scratch, recv, world);
         return Status::ok();
       },
       {}},
  };
  for (std::size_t k = 0; k < 3; ++k) {
    std::fill(recv.begin(), recv.end(), -1.0f);
    ZINF_RETURN_IF_ERROR(vs[k].run());
    ZINF_RETURN_IF_ERROR(check(correct(), vs[k].name, n));
  }
  std::fill(recv.begin(), recv.end(), -1.0f);
  ZINF_RETURN_IF_ERROR(vs[3].run());
  ZINF_RETURN_IF_ERROR(vs[4].run());
  ZINF_RETURN_IF_ERROR(check(correct(), "a2a + sum", n));
  ZINF_RETURN_IF_ERROR(run_rounds(vs, reps, rank));
  Row row{n, {}};
  for (const Variant& v : vs) row.ms.push_back(median(v.seconds) * 1e3);
  rows.push_back(row);
  out = std::move(vs);
  return Status::ok();
}

Status run(zero3::Communicator& comm, const std::vector<std::size_t>& sizes, int reps, bool glibc_default) {
  const int world = comm.world_size();
  std::vector<Row> ag_rows, rs_rows;
  std::vector<Variant> ag_vs, rs_vs;  // the last size's, for the column names
  for (std::size_t n : sizes) {
    if (n == 0 || n > static_cast<std::size_t>(INT_MAX) / static_cast<std::size_t>(world)) {
      return Status::invalid_argument(fmt::format("size {} elements per rank is out of range", n));
    }
    ZINF_RETURN_IF_ERROR(bench_all_gather(comm, n, reps, ag_rows, ag_vs));
    ZINF_RETURN_IF_ERROR(bench_reduce_scatter(comm, n, reps, rs_rows, rs_vs));
    if (comm.rank() == 0) std::fprintf(stderr, "comm_bench: %zu elements per rank done\n", n);
  }
  if (comm.rank() != 0) return Status::ok();
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("comm_bench: %d ranks on %u cores%s, %d rounds per size, malloc %s\n", world, cores,
              world > static_cast<int>(cores) ? " (oversubscribed: ranks share cores)" : "", reps,
              glibc_default ? "glibc default (large blocks mmapped per call)" : "heap kept (no mmap, no trim)");
  print_table("all_gather (in place)", ag_rows, ag_vs, world);
  print_table("reduce_scatter", rs_rows, rs_vs, world);
  std::printf("\nallgather_ratio=%.3f reduce_scatter_ratio=%.3f (median over sizes >= 1M; vs MPI_Reduce_scatter: %.3f)\n",
              summary_ratio(ag_rows), summary_ratio(rs_rows), summary_ratio(rs_rows, 2));
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comm_bench: zinf's MPI all-gather and reduce-scatter vs raw MPI (run under mpirun)"};
  std::vector<std::size_t> sizes = {256u << 10, 1u << 20, 4u << 20, 16u << 20};
  int reps = 10;
  app.add_option("--sizes", sizes, "fp32 elements per rank, one run each");
  app.add_option("--reps", reps, "timed rounds per size (each times every variant once)")->check(CLI::PositiveNumber);
  bool glibc_default = false;
  app.add_flag("--glibc-malloc-default", glibc_default,
               "leave glibc's malloc as it is: MPI's per-call temporaries are then fresh pages every call");
  CLI11_PARSE(app, argc, argv);
  if (!glibc_default) {
    // OpenMPI's reductions malloc and free a message-sized temporary on every call; by default
    // glibc mmaps such blocks and unmaps them at free, so every call faults fresh pages (slow on
    // these VMs, see docs/measuring.md). Kept in the heap, they are pre-faulted after the warm-up,
    // as zinf's own scratch buffer is.
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
  }
  auto comm = zero3::make_mpi_communicator(std::chrono::seconds(120));
  if (!comm.is_ok()) {
    std::fprintf(stderr, "comm_bench: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  const Status s = run(**comm, sizes, reps, glibc_default);
  if (!s.is_ok()) {
    std::fprintf(stderr, "comm_bench: rank %d: %s\n", (*comm)->rank(), s.to_string().c_str());
    (*comm)->abort(1);
    return 1;
  }
  return 0;
}
