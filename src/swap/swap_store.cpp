// SwapStore: striped, aligned tensor extents in per-rank, per-kind data files, with a manifest.
#include "zinf/swap/swap_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "common/file_io.h"
#include "swap/page_sums.h"
#include "swap/store_manifest.h"
#include "swap/swap_store_state.h"
#include "zinf/log.h"

namespace zinf::swap {

namespace {

namespace fs = std::filesystem;
using detail::DataFile;
using detail::Piece;

std::string store_folder(const std::string& nvme_path, int rank, StoreKind kind) {
  return (fs::path(nvme_path) / "zinf_swap" / fmt::format("rank{}", rank) / std::string(store_kind_name(kind)))
      .string();
}

// Data file i of a store folder (one per nvme_path).
std::string data_file_name(std::size_t i) { return fmt::format("stripe{}.swp", i); }

// Opens (creating) a data file, O_DIRECT when asked and allowed.
Result<fileio::UniqueFd> open_data_file(const std::string& path, bool direct, bool truncate) {
  // O_NOFOLLOW: a symbolic link planted at a swap file's name is refused, not written through.
  const int flags = O_RDWR | O_CREAT | O_NOFOLLOW | (truncate ? O_TRUNC : 0);
  ZINF_ASSIGN_OR_RETURN(fileio::OpenedFile file,
                        fileio::open_direct_or_buffered(path, flags, fileio::kPrivateFileMode, direct, "swap data"));
  return std::move(file.fd);
}

// Makes [old_end, new_end) of the file exist, reserving the space where the file system can.
Status grow_file(const DataFile& f, std::uint64_t old_end, std::uint64_t new_end) {
  if (new_end <= old_end) return Status::ok();
  const off_t off = static_cast<off_t>(old_end);
  const off_t len = static_cast<off_t>(new_end - old_end);
  if (::fallocate(f.fd.get(), 0, off, len) == 0) return Status::ok();
  const int err = errno;
  if (err == ENOSPC) {
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("no space left on {} for {} more bytes of swap data", f.path, new_end - old_end),
                  err);
  }
  if (err != EOPNOTSUPP && err != ENOSYS) return Status::io_error("fallocate", f.path, old_end, new_end - old_end, err);
  struct stat st {};
  if (::fstat(f.fd.get(), &st) != 0) return Status::sys_error("fstat " + f.path, errno);
  if (static_cast<std::uint64_t>(st.st_size) >= new_end) return Status::ok();
  if (::ftruncate(f.fd.get(), static_cast<off_t>(new_end)) != 0) {
    return Status::io_error("ftruncate", f.path, 0, new_end, errno);
  }
  return Status::ok();
}

}  // namespace

namespace detail {

Result<std::uint64_t> take_space(DataFile& f, std::uint64_t length) {
  if (std::optional<std::uint64_t> offset = f.free.take(length)) return *offset;
  const std::uint64_t start = f.free.take_tail(f.end).value_or(f.end);
  const std::uint64_t new_end = start + length;
  const Status st = grow_file(f, f.end, new_end);
  if (!st.is_ok()) {
    if (start < f.end) f.free.add(start, f.end - start);
    return st;
  }
  f.end = new_end;
  return start;
}

std::vector<Piece> map_range(const TensorRecord& r, std::uint64_t offset, std::uint64_t length,
                             std::uint64_t files, std::uint64_t unit) {
  std::vector<Piece> pieces;
  const std::uint64_t end = offset + length;
  for (std::uint64_t pos = offset; pos < end;) {
    const std::uint64_t u = pos / unit;
    const std::uint64_t unit_end = std::min(end, (u + 1) * unit);
    const Extent& e = r.extents[u % files];
    const std::uint64_t file_offset = e.offset + (u / files) * unit + (pos - u * unit);
    const std::uint64_t buffer_offset = pos - offset;
    if (!pieces.empty() && pieces.back().file == e.file &&
        pieces.back().file_offset + pieces.back().length == file_offset &&
        pieces.back().buffer_offset + pieces.back().length == buffer_offset) {
      pieces.back().length += unit_end - pos;
    } else {
      pieces.push_back(Piece{e.file, file_offset, buffer_offset, unit_end - pos});
    }
    pos = unit_end;
  }
  return pieces;
}

}  // namespace detail

SwapStore::SwapStore() : state_(std::make_unique<State>()) {}

SwapStore::~SwapStore() {
  if (!config_.remove_at_close) return;
  // Files of the folders whose lock this store holds (open() stops at the first refused one).
  const std::size_t held = state_->locks.size();
  std::error_code ec;
  for (std::size_t i = 0; i < held && i < state_->files.size(); ++i) fs::remove(state_->files[i].path, ec);
  if (held > 0) fs::remove(manifest_path(), ec);
}

std::uint64_t tensor_footprint(const StoreConfig& config, DType dtype, std::uint64_t numel) {
  const std::uint64_t nbytes = numel * dtype_size(dtype);
  if (nbytes == 0) return 0;
  return align_up(nbytes, kSwapAlignment) + (config.checksums ? 2 * detail::sums_half_bytes(nbytes) : 0);
}

std::uint64_t store_disk_bytes(const StoreConfig& config) {
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < config.nvme_paths.size(); ++i) {
    const fs::path file = fs::path(store_folder(config.nvme_paths[i], config.rank, config.kind)) /
                          data_file_name(i);
    struct stat st {};
    // lstat: a link at a data file's name is refused by open(), so it frees nothing.
    if (::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

std::string SwapStore::manifest_path() const { return (fs::path(folder_) / "manifest.json").string(); }

std::vector<std::string> SwapStore::data_files() const {
  std::vector<std::string> out;
  for (const DataFile& f : state_->files) out.push_back(f.path);
  return out;
}

std::uint64_t SwapStore::generation() const {
  std::lock_guard lock(state_->mutex);
  return state_->generation;
}

Result<std::unique_ptr<SwapStore>> SwapStore::open(const StoreConfig& config, OpenMode mode,
                                                   aio::Handle& handle) {
  if (config.nvme_paths.empty()) {
    return Status::invalid_argument("swap store: nvme_path is required (no folder given)");
  }
  if (config.stripe_unit == 0 || config.stripe_unit % kSwapAlignment != 0) {
    return Status::invalid_argument(
        fmt::format("swap store: stripe unit {} must be a positive multiple of {}", config.stripe_unit,
                    kSwapAlignment));
  }
  std::unique_ptr<SwapStore> store(new SwapStore());
  store->config_ = config;
  store->handle_ = &handle;
  store->folder_ = store_folder(config.nvme_paths[0], config.rank, config.kind);
  for (std::size_t i = 0; i < config.nvme_paths.size(); ++i) {
    const std::string folder = store_folder(config.nvme_paths[i], config.rank, config.kind);
    // Folders zinf creates are 0700 and must be real folders of this user (no planted links).
    ZINF_RETURN_IF_ERROR(fileio::make_private_dirs(
        config.nvme_paths[i], {"zinf_swap", fmt::format("rank{}", config.rank), std::string(store_kind_name(config.kind))}));
    // One owner per folder for the store's life: a second run on it is refused at once,
    // before anything in it is truncated or read.
    ZINF_ASSIGN_OR_RETURN(fileio::FileLock lock,
                          fileio::FileLock::acquire((fs::path(folder) / "zinf.lock").string(),
                                                    fmt::format("swap folder {}", folder)));
    store->state_->locks.push_back(std::move(lock));
    DataFile f;
    f.name = data_file_name(i);
    f.path = (fs::path(folder) / f.name).string();
    store->state_->files.push_back(std::move(f));
  }
  std::error_code ec;
  const bool have_manifest = fs::exists(store->manifest_path(), ec);
  if (mode == OpenMode::kOpen && !have_manifest) {
    return Status::not_found(fmt::format("no swap store manifest at {}", store->manifest_path()));
  }
  const bool existing = have_manifest && mode != OpenMode::kCreate;
  ZINF_RETURN_IF_ERROR(store->open_files(mode, existing));
  if (existing) ZINF_RETURN_IF_ERROR(store->load_manifest());
  return store;
}

Status SwapStore::open_files(OpenMode mode, bool existing) {
  if (mode == OpenMode::kCreate) {
    std::error_code ec;
    fs::remove(manifest_path(), ec);
    if (ec) return Status::sys_error("remove " + manifest_path(), ec.value());
  }
  for (DataFile& f : state_->files) {
    ZINF_ASSIGN_OR_RETURN(f.fd, open_data_file(f.path, config_.direct_io, !existing));
  }
  return Status::ok();
}

Status SwapStore::load_manifest() {
  const std::string path = manifest_path();
  ZINF_ASSIGN_OR_RETURN(std::string text, fileio::read_small_file(path));
  ZINF_ASSIGN_OR_RETURN(detail::Manifest m, detail::manifest_from_json(text, path));
  if (!config_.checksums) {
    for (auto& [key, r] : m.tensors) r.sums = Extent{};  // dropped: their space becomes free
  }
  State& s = *state_;
  if (m.rank != config_.rank || m.kind != store_kind_name(config_.kind)) {
    return Status::corruption(fmt::format("{}: manifest is for rank {} kind {}, expected rank {} kind {}", path,
                                          m.rank, m.kind, config_.rank, store_kind_name(config_.kind)));
  }
  if (m.files.size() != s.files.size()) {
    return Status::invalid_argument(fmt::format(
        "{}: the store was written striped over {} nvme_paths but {} were given; give the same folders",
        path, m.files.size(), s.files.size()));
  }
  if (m.stripe_unit != config_.stripe_unit) {
    log(LogLevel::kNotice, fmt::format("{}: using the stored stripe unit {} (config asked {})", path,
                                       m.stripe_unit, config_.stripe_unit));
    config_.stripe_unit = m.stripe_unit;
  }
  for (std::size_t i = 0; i < s.files.size(); ++i) {
    DataFile& f = s.files[i];
    ZINF_ASSIGN_OR_RETURN(std::uint64_t size, fileio::file_size(f.fd.get(), f.path));
    if (size < m.files[i].bytes) {
      return Status::corruption(fmt::format("{} has {} bytes but the manifest {} records {}", f.path, size, path,
                                            m.files[i].bytes));
    }
    f.end = m.files[i].bytes;
  }
  // Free space is every gap between the extents in use.
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> used(s.files.size());
  for (const auto& [key, r] : m.tensors) {
    std::vector<Extent> all = r.extents;
    if (r.sums.length != 0) all.push_back(r.sums);
    for (const Extent& e : all) {
      if (e.file >= s.files.size() || e.offset + e.length > s.files[e.file].end) {
        return Status::corruption(fmt::format("{}: extent of {} lies outside its data file", path, key));
      }
      used[e.file].emplace_back(e.offset, e.length);
    }
  }
  for (std::size_t i = 0; i < used.size(); ++i) {
    std::sort(used[i].begin(), used[i].end());
    std::uint64_t pos = 0;
    for (const auto& [offset, length] : used[i]) {
      if (offset < pos) return Status::corruption(fmt::format("{}: overlapping extents in {}", path, s.files[i].name));
      s.files[i].free.add(pos, offset - pos);
      pos = offset + length;
    }
    s.files[i].free.add(pos, s.files[i].end - pos);
  }
  s.tensors = std::move(m.tensors);
  s.metadata = std::move(m.metadata);
  s.generation = m.generation;
  return config_.checksums ? load_sums(m.sums_check) : Status::ok();
}

bool SwapStore::contains(const std::string& key) const {
  std::lock_guard lock(state_->mutex);
  return state_->tensors.count(key) != 0;
}

Result<TensorRecord> SwapStore::find(const std::string& key) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->tensors.find(key);
  if (it == state_->tensors.end()) {
    return Status::not_found(fmt::format("swap store {}: no tensor '{}'", folder_, key));
  }
  return it->second;
}

std::vector<std::string> SwapStore::keys() const {
  std::lock_guard lock(state_->mutex);
  std::vector<std::string> out;
  for (const auto& [key, r] : state_->tensors) out.push_back(key);
  return out;
}

Result<TensorRecord> SwapStore::allocate(const std::string& key, DType dtype, std::uint64_t numel) {
  State& s = *state_;
  const std::uint64_t nbytes = numel * dtype_size(dtype);
  const std::uint64_t padded = align_up(nbytes, kSwapAlignment);
  std::lock_guard lock(s.mutex);
  auto it = s.tensors.find(key);
  if (it != s.tensors.end()) {
    if (align_up(it->second.nbytes, kSwapAlignment) == padded) {
      it->second.dtype = dtype;
      it->second.numel = numel;
      it->second.nbytes = nbytes;
      return it->second;
    }
    s.free_extents(it->second);
    s.tensors.erase(it);
    s.sums.erase(key);
  }
  const std::uint64_t files = s.files.size();
  const std::uint64_t unit = config_.stripe_unit;
  const std::uint64_t units = (padded + unit - 1) / unit;
  std::vector<std::uint64_t> lengths(std::min(files, units), 0);
  for (std::uint64_t u = 0; u < units; ++u) lengths[u % files] += std::min(unit, padded - u * unit);
  TensorRecord r{key, dtype, numel, nbytes, {}, {}, 0};
  for (std::uint32_t i = 0; i <= lengths.size(); ++i) {
    const bool sums = i == lengths.size();  // last: the checksum extent, in file 0
    if (sums && (!config_.checksums || padded == 0)) break;
    const std::uint64_t length = sums ? 2 * detail::sums_half_bytes(nbytes) : lengths[i];
    Result<std::uint64_t> offset = detail::take_space(s.files[sums ? 0 : i], length);
    if (!offset.is_ok()) {
      s.free_extents(r);
      return offset.status().with_context(fmt::format("allocating swap space for '{}'", key));
    }
    (sums ? r.sums : r.extents.emplace_back()) = Extent{sums ? 0 : i, *offset, length};
  }
  s.tensors.emplace(key, r);
  if (config_.checksums) {
    s.sums[key] = detail::PageSums{std::vector<std::uint64_t>(detail::page_count(nbytes), detail::kUnwrittenPage), true, 0};
  }
  return r;
}

Status SwapStore::erase(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->tensors.find(key);
  if (it == state_->tensors.end()) {
    return Status::not_found(fmt::format("swap store {}: no tensor '{}' to erase", folder_, key));
  }
  state_->free_extents(it->second);
  state_->tensors.erase(it);
  state_->sums.erase(key);
  return Status::ok();
}

Result<IoBatch> SwapStore::submit(const std::string& key, std::uint64_t offset, void* buffer,
                                  std::size_t nbytes, bool write) {
  ZINF_ASSIGN_OR_RETURN(TensorRecord r, find(key));
  const char* op = write ? "write" : "read";
  if (offset % kSwapAlignment != 0 || offset + nbytes > r.nbytes ||
      (nbytes % kSwapAlignment != 0 && offset + nbytes != r.nbytes)) {
    return Status::invalid_argument(fmt::format(
        "swap store: {} of '{}' bytes [{}, {}) of {}: offsets must be multiples of {} and lengths too, "
        "unless the range ends the tensor", op, key, offset, offset + nbytes, r.nbytes, kSwapAlignment));
  }
  IoBatch batch;
  batch.what = fmt::format("{} '{}' bytes [{}, {}) in {}", op, key, offset, offset + nbytes, folder_);
  batch.write = write;
  if (nbytes == 0) return batch;
  const std::uint64_t length = align_up(nbytes, kSwapAlignment);
  auto* bytes = static_cast<std::byte*>(buffer);
  if (config_.checksums) {
    batch.sums_key_ = key;
    batch.buffer_ = bytes;
    batch.offset_ = offset;
  }
  // With checksums, reads go in pieces of at most kCheckedPiece bytes (see page_sums.h).
  const std::uint64_t most = config_.checksums && !write ? detail::kCheckedPiece : length;
  for (const Piece& whole : detail::map_range(r, offset, length, state_->files.size(), config_.stripe_unit)) {
    for (std::uint64_t done = 0; done < whole.length; done += most) {
      const Piece p{whole.file, whole.file_offset + done, whole.buffer_offset + done,
                    std::min(most, whole.length - done)};
      const int fd = state_->files[p.file].fd.get();
      Result<aio::RequestId> id =
          write ? handle_->async_pwrite(bytes + p.buffer_offset, p.length, fd, p.file_offset)
                : handle_->async_pread(bytes + p.buffer_offset, p.length, fd, p.file_offset);
      if (!id.is_ok()) {
        const Status failed = id.status().with_context(batch.what);
        batch.sums_key_.clear();  // a part was never transferred: record and check no checksums
        (void)wait(batch);  // the pieces already submitted must finish before the buffer is released
        return failed;
      }
      batch.ids.push_back(*id);
      batch.piece_ends_.push_back(p.buffer_offset + p.length);
      batch.bytes += p.length;
    }
  }
  // Checksums of what the caller handed over, taken while the write is in flight (the buffer
  // must not change until wait(), so this is what the write stores).
  if (config_.checksums && write) batch.page_sums_ = detail::page_sums_of(bytes, length);
  return batch;
}

Result<std::vector<FileSpan>> SwapStore::locate(const std::string& key, std::uint64_t offset,
                                                std::uint64_t nbytes) const {
  ZINF_ASSIGN_OR_RETURN(TensorRecord r, find(key));
  if (offset > r.nbytes || nbytes > r.nbytes - offset) {
    return Status::invalid_argument(fmt::format("swap store: bytes [{}, {}) of '{}' in {}: the tensor has {} bytes",
                                                offset, offset + nbytes, key, folder_, r.nbytes));
  }
  std::vector<FileSpan> spans;
  for (const Piece& p : detail::map_range(r, offset, nbytes, state_->files.size(), config_.stripe_unit)) {
    spans.push_back(FileSpan{p.file, p.file_offset, offset + p.buffer_offset, p.length});
  }
  return spans;
}

Result<IoBatch> SwapStore::read_async(const std::string& key, std::uint64_t offset, void* buffer,
                                      std::size_t nbytes) {
  return submit(key, offset, buffer, nbytes, false);
}

Result<IoBatch> SwapStore::write_async(const std::string& key, std::uint64_t offset, const void* buffer,
                                       std::size_t nbytes) {
  return submit(key, offset, const_cast<void*>(buffer), nbytes, true);
}

Status SwapStore::wait(IoBatch& batch) {
  const bool check = !batch.sums_key_.empty() && !batch.write;
  std::vector<std::uint64_t> expected;
  if (check) expected = expected_sums(batch);
  detail::PageCheck found;
  Status first;
  std::uint64_t piece_begin = 0;
  for (std::size_t i = 0; i < batch.ids.size(); ++i) {
    Status st = handle_->wait(batch.ids[i]);
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
    // Each piece is checked as soon as it is in, while the later ones are still being read.
    if (first.is_ok() && !expected.empty()) {
      detail::check_pages(batch.buffer_, expected, piece_begin, batch.piece_ends_[i], found);
    }
    piece_begin = batch.piece_ends_[i];
  }
  if (first.is_ok() && !batch.ids.empty()) {
    (batch.write ? state_->bytes_written : state_->bytes_read).fetch_add(batch.bytes);
    if (!batch.sums_key_.empty() && batch.write) record_sums(batch);
    if (found.bad > 0) first = checksum_error(batch, expected, found);
  }
  batch.ids.clear();
  batch.piece_ends_.clear();
  batch.bytes = 0;
  batch.sums_key_.clear();
  batch.page_sums_.clear();
  return first.with_context(batch.what);
}

Status SwapStore::read(const std::string& key, std::uint64_t offset, void* buffer, std::size_t nbytes) {
  ZINF_ASSIGN_OR_RETURN(IoBatch batch, read_async(key, offset, buffer, nbytes));
  return wait(batch);
}

Status SwapStore::write(const std::string& key, std::uint64_t offset, const void* buffer, std::size_t nbytes) {
  ZINF_ASSIGN_OR_RETURN(IoBatch batch, write_async(key, offset, buffer, nbytes));
  return wait(batch);
}

void SwapStore::set_metadata(const std::string& name, const std::string& value) {
  std::lock_guard lock(state_->mutex);
  state_->metadata[name] = value;
}

std::string SwapStore::metadata(const std::string& name) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->metadata.find(name);
  return it == state_->metadata.end() ? std::string() : it->second;
}

Status SwapStore::commit() {
  State& s = *state_;
  std::lock_guard commit_lock(s.commit_mutex);
  // Changed checksums go to the spare halves of their extents first, so the sync below makes
  // them durable with the data; only the new manifest makes those halves current.
  std::vector<StoredSums> stored;
  if (config_.checksums) ZINF_RETURN_IF_ERROR(store_sums(&stored));
  if (config_.durable) {
    for (const DataFile& f : s.files) {
      if (::fdatasync(f.fd.get()) != 0) {
        const int err = errno;
        sums_not_committed(stored);
        return Status::sys_error("fdatasync " + f.path, err);
      }
    }
  }
  detail::Manifest m;
  {
    std::lock_guard lock(s.mutex);
    m.rank = config_.rank;
    m.kind = std::string(store_kind_name(config_.kind));
    m.stripe_unit = config_.stripe_unit;
    m.generation = s.generation + 1;
    for (const DataFile& f : s.files) m.files.push_back(detail::ManifestFile{f.name, f.end});
    m.tensors = s.tensors;
    m.metadata = s.metadata;
    for (const auto& [key, ps] : s.sums) m.sums_check[key] = ps.stored_check;
  }
  for (const StoredSums& st : stored) {
    auto it = m.tensors.find(st.key);
    if (it == m.tensors.end() || it->second.sums.offset != st.extent_offset) continue;  // erased meanwhile
    it->second.sums_half = st.half;
    m.sums_check[st.key] = st.check;
  }
  const Status written = fileio::write_file_atomic(manifest_path(), detail::manifest_to_json(m));
  if (!written.is_ok()) {
    sums_not_committed(stored);
    return written;
  }
  std::lock_guard lock(s.mutex);
  s.generation = m.generation;
  for (const StoredSums& st : stored) {
    auto r = s.tensors.find(st.key);
    auto ps = s.sums.find(st.key);
    if (r == s.tensors.end() || ps == s.sums.end() || r->second.sums.offset != st.extent_offset) continue;
    r->second.sums_half = st.half;
    ps->second.stored_check = st.check;
  }
  return Status::ok();
}

StoreStats SwapStore::stats() const {
  StoreStats out;
  out.bytes_read = state_->bytes_read.load();
  out.bytes_written = state_->bytes_written.load();
  std::lock_guard lock(state_->mutex);
  for (const DataFile& f : state_->files) out.file_bytes += f.end;
  return out;
}

}  // namespace zinf::swap
