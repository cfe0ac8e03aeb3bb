// Internal: the tensor swapper's entries, tickets, and the per-key ordered operation scheduler.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "swap/host_buffer.h"
#include "zinf/status.h"
#include "zinf/swap/pinned_pool.h"
#include "zinf/swap/types.h"

namespace zinf::swap::detail {

struct TicketState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Status status;

  void complete(Status st);
};

std::shared_ptr<TicketState> make_ready_ticket(Status st);

class Scheduler;
struct TensorEntry;

// Drops one view (or operation) pin of the entry's staged copy; the copy is given back to the
// pool when a release is pending and this was the last pin. Takes the scheduler's mutex.
void unpin_staged(Scheduler& sch, TensorEntry& entry);

struct Op;

// One tensor. The bulk data (cpu, staged) is touched only by the entry's running operation
// and by views; the fields marked "guarded" are protected by Scheduler::mutex.
struct TensorEntry {
  std::string key;
  DType dtype = DType::kF32;
  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;
  Tier home = Tier::kNvme;
  HostBuffer cpu;             // the CPU-tier copy when home == kCpu
  PinnedBlock staged;         // guarded: the prefetched copy
  bool staged_valid = false;  // guarded
  int views = 0;              // guarded
  bool release_pending = false;        // guarded: give `staged` back when views reach 0
  // guarded: why the last prefetch's read failed, until acquire() reports it (a read that
  // failed is an I/O error to report, not one to hide behind the next read's success)
  Status prefetch_failed;
  std::deque<std::unique_ptr<Op>> ops;  // guarded: queued operations, the head one runs
};

struct Op {
  std::string what;  // "swap_in 'key'"
  // Runs on a worker thread with the entry's previous operations finished.
  std::function<Status(TensorEntry&, Op&)> run;
  // Called (without the lock) before run: bytes of pool memory the op needs, 0 for none.
  std::function<std::size_t(TensorEntry&)> resident_bytes;
  PinnedBlock block;  // the memory, once obtained
  Status aborted;     // set when the memory could not be obtained (shutdown)
  std::shared_ptr<TicketState> ticket;
};

// Runs each entry's operations in order, entries concurrently on `threads` workers. An op that
// needs pool memory it cannot get at once is parked; one memory thread waits for the pool on
// behalf of parked ops in turn, so workers never block on memory.
class Scheduler {
 public:
  Scheduler(PinnedPool& pool, std::size_t threads);
  ~Scheduler();  // fails parked ops with Aborted, finishes every queued op, joins the threads

  std::mutex mutex;
  std::map<std::string, std::unique_ptr<TensorEntry>> entries;  // guarded
  std::uint64_t cpu_elements = 0;                                // guarded: in the CPU tier

  // Queues `op` after the key's earlier operations. The caller holds `lock` on mutex.
  void enqueue(std::unique_lock<std::mutex>& lock, TensorEntry& entry, std::unique_ptr<Op> op);
  // Waits until no operation is queued or running.
  void wait_idle();

 private:
  void worker_main();
  void memory_main();
  void finish(TensorEntry& entry, Status st);

  PinnedPool& pool_;
  std::condition_variable work_cv_, memory_cv_, idle_cv_;
  std::deque<TensorEntry*> ready_;        // guarded: entries whose head op may run
  std::deque<TensorEntry*> memory_wait_;  // guarded: entries whose head op waits for memory
  std::size_t outstanding_ = 0;           // guarded: ops queued or running
  bool stop_ = false;                     // guarded
  std::vector<std::thread> workers_;
  std::thread memory_thread_;
};

}  // namespace zinf::swap::detail
