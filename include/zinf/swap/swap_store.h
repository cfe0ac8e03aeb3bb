// Swap store: named tensors in files under one or more nvme_paths, with a manifest to reopen them.
//
// Layout (stable; docs/swap.md describes it in full). For rank r, kind k ("parameters",
// "optimizer", "gradients") and nvme_paths p0..pF-1:
//   <p_i>/zinf_swap/rank<r>/<k>/stripe<i>.swp     one data file per path
//   <p0>/zinf_swap/rank<r>/<k>/manifest.json       tensor key -> dtype, numel, extents
// A tensor's bytes (padded to 4 KiB) are cut into stripe units of `stripe_unit` bytes dealt
// round-robin over the files: unit u lives in file u mod F, at byte (u div F) * stripe_unit of
// that tensor's extent in the file. So a tensor has one contiguous, 4 KiB-aligned extent per file
// it touches, and large transfers go to all drives at once. Space freed by erase() or by a
// resize is reused; rewriting a tensor of the same size rewrites it in place.
//
// The manifest is written by commit() atomically (temporary file, fsync, rename, fsync of the
// folder), after the data files are fdatasync'ed when `durable` is set. A store reopened with
// OpenMode::kOpen sees exactly the tensors and metadata of the last commit.
//
// Checksums: with StoreConfig::checksums (the default) every 4 KiB page written gets an XXH3-64
// checksum, recorded when its write succeeds and checked by wait() on every read of the page, so
// damaged swap data is a Corruption error, never a NaN later. commit() stores each changed
// tensor's checksums in the spare half of its checksum extent in stripe file 0
// (TensorRecord::sums) before the data files are synced; the new manifest names that half and
// the checksum of the checksums, so a crash before the manifest leaves the old half intact.
//
// I/O contract: offsets into a tensor must be multiples of 4 KiB; lengths must be multiples of
// 4 KiB unless the range ends at the tensor's end, in which case the transfer is padded to
// 4 KiB, so the buffer needs align_up(nbytes, 4096) bytes of room. Buffers should be 4 KiB
// aligned (pinned pool blocks are). Every batch returned by read_async/write_async must be
// passed to wait() before its buffer is reused or freed.
//
// Threading: all members are thread-safe. I/O on one tensor while it is erased or reallocated
// is a caller error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zinf/aio/handle.h"
#include "zinf/status.h"
#include "zinf/swap/types.h"

namespace zinf::swap {
namespace detail {
struct PageCheck;
}  // namespace detail

struct StoreConfig {
  std::vector<std::string> nvme_paths;  // one data file per path; at least one
  int rank = 0;
  StoreKind kind = StoreKind::kParameters;
  std::size_t stripe_unit = std::size_t{4} << 20;  // bytes; a multiple of 4 KiB
  bool direct_io = true;  // O_DIRECT data files (buffered, with a notice, where refused)
  bool durable = true;    // fdatasync the data files before each manifest commit
  // An XXH3-64 checksum of every 4 KiB page written, kept in memory and with the store (see
  // above) and verified on every read: a mismatch is a Corruption error naming the tensor, the
  // data file and the offset. Pages never written with checksums on are not checked. Off:
  // nothing is computed, and a reopened store's checksums are dropped.
  bool checksums = true;
  // Scratch space: when the store is destroyed, its data files and manifest are removed (the
  // lock files and folders stay: removing a lock file another process may be opening would let
  // two owners in). Only the folders this store holds the lock of are touched, so a store refused
  // because another run owns the folder removes nothing of that run's.
  bool remove_at_close = false;
};

// Bytes a store with `config` takes on disk for one tensor of numel elements of dtype: its
// padded extents plus, with checksums, its two checksum halves. The space a tier needs is the
// sum over its tensors (the manifest aside, a few KiB); a free-space check made before any
// store exists adds them up.
std::uint64_t tensor_footprint(const StoreConfig& config, DType dtype, std::uint64_t numel);
// Bytes the data files of the store `config` names (its kind's folder) take on disk now, from an
// earlier run: space an OpenMode::kCreate open gives back when it truncates them. 0 when none.
std::uint64_t store_disk_bytes(const StoreConfig& config);

enum class OpenMode {
  kCreate,        // start empty; files and manifest of an earlier store are discarded
  kOpen,          // the manifest must exist; NotFound otherwise
  kOpenOrCreate,  // open when a manifest exists, else create
};

// A contiguous byte range of one data file.
struct Extent {
  std::uint32_t file = 0;
  std::uint64_t offset = 0;  // multiple of 4 KiB
  std::uint64_t length = 0;  // multiple of 4 KiB
};

struct TensorRecord {
  std::string key;
  DType dtype = DType::kF32;
  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;     // numel * dtype_size
  std::vector<Extent> extents;  // extent i holds the stripe units u with u mod F == extents[i].file
  // With checksums: two halves in file 0, each room for the pages' checksums (8 bytes each);
  // half `sums_half` holds the committed ones, the other takes the next commit's (length 0: none).
  Extent sums;
  std::uint32_t sums_half = 0;
};

// Requests of one read or write; wait for it with SwapStore::wait().
class IoBatch {
 public:
  std::vector<aio::RequestId> ids;
  std::string what;  // "read 'sg0/master.s1' bytes [0, 65536) in <folder>", for error context
  std::uint64_t bytes = 0;  // bytes transferred when it succeeds (padding included)
  bool write = false;
  bool empty() const { return ids.empty(); }

 private:
  friend class SwapStore;
  // Set by read_async/write_async for wait(): where each request's bytes end in the buffer and,
  // with the page checksums (StoreConfig::checksums), what wait() checks or records.
  std::vector<std::uint64_t> piece_ends_;  // per request in ids
  std::string sums_key_;                   // the tensor; empty: no checksums for this batch
  std::byte* buffer_ = nullptr;
  std::uint64_t offset_ = 0;               // byte of the tensor at buffer_[0] (a multiple of 4 KiB)
  std::vector<std::uint64_t> page_sums_;   // writes: the checksums of the pages being written
};

// Where a range of a tensor lies: `length` bytes at `file_offset` of data_files()[file] are bytes
// [tensor_offset, tensor_offset + length) of the tensor.
struct FileSpan {
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t tensor_offset = 0;
  std::uint64_t length = 0;
};

struct StoreStats {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t file_bytes = 0;  // sum of the data files' sizes
};

class SwapStore {
 public:
  // `handle` must outlive the store.
  static Result<std::unique_ptr<SwapStore>> open(const StoreConfig& config, OpenMode mode,
                                                 aio::Handle& handle);
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  const StoreConfig& config() const { return config_; }
  // The folder of this rank and kind under nvme_paths[0], which holds the manifest.
  const std::string& folder() const { return folder_; }
  std::string manifest_path() const;
  std::vector<std::string> data_files() const;
  // Commits so far (0 for a new store); read back from the manifest on open.
  std::uint64_t generation() const;

  bool contains(const std::string& key) const;
  // NotFound when the key is unknown.
  Result<TensorRecord> find(const std::string& key) const;
  std::vector<std::string> keys() const;

  // Gives `key` space for numel elements of dtype. An existing tensor of the same byte size
  // keeps its extents (its bytes are rewritten in place); another size is moved to new space.
  // New space reads as zeros until written.
  Result<TensorRecord> allocate(const std::string& key, DType dtype, std::uint64_t numel);
  Status erase(const std::string& key);

  // Asynchronous transfer of bytes [offset, offset + nbytes) of a tensor (see the I/O contract).
  Result<IoBatch> read_async(const std::string& key, std::uint64_t offset, void* buffer,
                             std::size_t nbytes);
  Result<IoBatch> write_async(const std::string& key, std::uint64_t offset, const void* buffer,
                              std::size_t nbytes);
  // Waits for every request of the batch (all of them, even after a failure) and returns the
  // first failure, prefixed with batch.what. The batch is emptied.
  Status wait(IoBatch& batch);
  Status read(const std::string& key, std::uint64_t offset, void* buffer, std::size_t nbytes);
  Status write(const std::string& key, std::uint64_t offset, const void* buffer, std::size_t nbytes);

  // Where bytes [offset, offset + nbytes) of a tensor lie in the data files, for a reader that moves
  // them itself (GPUDirect Storage into device memory). Any offset and length within the tensor.
  // Such a transfer bypasses the page checksums: nothing is checked or recorded, so a writer
  // that went this way would make later checked reads fail. NotFound for an unknown key,
  // InvalidArgument for a range past the tensor's end.
  Result<std::vector<FileSpan>> locate(const std::string& key, std::uint64_t offset, std::uint64_t nbytes) const;

  // Free-form string metadata saved with the manifest (e.g. the optimizer's step and slot).
  void set_metadata(const std::string& name, const std::string& value);
  // Empty string when unset.
  std::string metadata(const std::string& name) const;

  // Makes the current tensors and metadata durable: data files synced (if durable), then the
  // manifest replaced atomically. Bumps generation().
  Status commit();

  StoreStats stats() const;

 private:
  struct State;
  SwapStore();
  Status open_files(OpenMode mode, bool existing);
  Status load_manifest();
  Result<IoBatch> submit(const std::string& key, std::uint64_t offset, void* buffer,
                         std::size_t nbytes, bool write);
  // Page checksums (see StoreConfig::checksums); defined in page_sums.cpp.
  struct StoredSums {
    std::string key;
    std::uint64_t extent_offset = 0;  // identifies the extent the half belongs to
    std::uint32_t half = 0;
    std::uint64_t check = 0;
  };
  Status load_sums(const std::map<std::string, std::uint64_t>& sums_check);
  Status store_sums(std::vector<StoredSums>* stored);
  void sums_not_committed(const std::vector<StoredSums>& stored);
  void record_sums(const IoBatch& batch);
  std::vector<std::uint64_t> expected_sums(const IoBatch& batch) const;
  Status checksum_error(const IoBatch& batch, const std::vector<std::uint64_t>& expected,
                        const detail::PageCheck& found) const;

  StoreConfig config_;
  aio::Handle* handle_ = nullptr;
  std::string folder_;
  std::unique_ptr<State> state_;
};

}  // namespace zinf::swap
