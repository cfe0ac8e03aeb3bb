// The swap store's page checksums: computing and checking pages, and the SwapStore members that
// load them with a store, store them at commit, and record and check them around each transfer.
#include "swap/page_sums.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/checksum.h"
#include "swap/host_buffer.h"
#include "swap/swap_store_state.h"
#include "zinf/swap/types.h"

namespace zinf::swap {
namespace detail {

static_assert(std::endian::native == std::endian::little, "checksum extents are stored little-endian");

std::uint64_t page_sum(const std::byte* page) {
  const std::uint64_t h = checksum64(page, kSwapAlignment);
  return h == kUnwrittenPage ? 1 : h;
}

std::vector<std::uint64_t> page_sums_of(const std::byte* bytes, std::uint64_t length) {
  std::vector<std::uint64_t> sums(length / kSwapAlignment);
  for (std::size_t i = 0; i < sums.size(); ++i) sums[i] = page_sum(bytes + i * kSwapAlignment);
  return sums;
}

std::uint64_t page_count(std::uint64_t nbytes) { return align_up(nbytes, kSwapAlignment) / kSwapAlignment; }

std::uint64_t sums_half_bytes(std::uint64_t nbytes) { return align_up(page_count(nbytes) * 8, kSwapAlignment); }

void check_pages(const std::byte* buffer, const std::vector<std::uint64_t>& expected, std::uint64_t begin,
                 std::uint64_t end, PageCheck& found) {
  for (std::uint64_t i = begin / kSwapAlignment; i < end / kSwapAlignment; ++i) {
    if (expected[i] == kUnwrittenPage) continue;
    const std::uint64_t sum = page_sum(buffer + i * kSwapAlignment);
    if (sum != expected[i] && found.bad++ == 0) {
      found.first_bad = i;
      found.got = sum;
    }
  }
}

}  // namespace detail

using detail::DataFile;
using detail::kUnwrittenPage;
using detail::page_count;
using detail::PageSums;
using detail::sums_half_bytes;

Status SwapStore::load_sums(const std::map<std::string, std::uint64_t>& sums_check) {
  State& s = *state_;
  for (auto& [key, r] : s.tensors) {
    PageSums& ps = s.sums[key];
    ps.pages.assign(page_count(r.nbytes), kUnwrittenPage);
    auto check = sums_check.find(key);
    if (r.sums.length == 0 || check == sums_check.end()) {
      // Written before checksums or without them: nothing to check until rewritten.
      if (r.nbytes == 0) continue;
      ZINF_ASSIGN_OR_RETURN(std::uint64_t offset, detail::take_space(s.files[0], 2 * sums_half_bytes(r.nbytes)));
      r.sums = Extent{0, offset, 2 * sums_half_bytes(r.nbytes)};
      r.sums_half = 0;
      ps.dirty = true;
      continue;
    }
    const DataFile& f = s.files[r.sums.file];
    const std::uint64_t half = r.sums.length / 2;
    const std::uint64_t at = r.sums.offset + r.sums_half * half;
    ZINF_ASSIGN_OR_RETURN(detail::HostBuffer buf, detail::HostBuffer::allocate(half, false));
    ZINF_ASSIGN_OR_RETURN(aio::RequestId id, handle_->async_pread(buf.data(), half, f.fd.get(), at));
    ZINF_RETURN_IF_ERROR(handle_->wait(id).with_context(fmt::format("reading the page checksums of '{}'", key)));
    const std::size_t bytes = ps.pages.size() * 8;
    if (checksum64(buf.data(), bytes) != check->second) {
      return Status::corruption(fmt::format(
          "{}: the page checksums of '{}' ({} offset {}) do not match the manifest: the swap data was damaged or "
          "changed outside zinf",
          manifest_path(), key, f.path, at));
    }
    std::memcpy(ps.pages.data(), buf.data(), bytes);
    ps.stored_check = check->second;
  }
  return Status::ok();
}

Status SwapStore::store_sums(std::vector<StoredSums>* stored) {
  State& s = *state_;
  struct Pending {
    StoredSums what;
    std::uint64_t file_offset = 0;
    std::uint32_t file = 0;
    detail::HostBuffer buf;
    std::size_t bytes = 0;
  };
  std::vector<Pending> pending;
  Status first;
  {
    std::lock_guard lock(s.mutex);
    for (auto& [key, ps] : s.sums) {
      auto r = s.tensors.find(key);
      if (!ps.dirty || r == s.tensors.end() || r->second.sums.length == 0) continue;
      const Extent& e = r->second.sums;
      const std::uint32_t spare = 1 - r->second.sums_half;  // the committed half stays intact
      Pending p{StoredSums{key, e.offset, spare, 0}, e.offset + spare * (e.length / 2), e.file, {}, ps.pages.size() * 8};
      Result<detail::HostBuffer> buf = detail::HostBuffer::allocate(e.length / 2, false);
      if (!buf.is_ok()) {
        first = buf.status();
        break;
      }
      p.buf = std::move(buf).value();
      std::memcpy(p.buf.data(), ps.pages.data(), p.bytes);
      ps.dirty = false;
      pending.push_back(std::move(p));
    }
  }
  std::vector<aio::RequestId> ids;
  for (Pending& p : pending) {
    if (!first.is_ok()) break;
    p.what.check = checksum64(p.buf.data(), p.bytes);
    Result<aio::RequestId> id = handle_->async_pwrite(p.buf.data(), p.buf.size(), s.files[p.file].fd.get(), p.file_offset);
    if (!id.is_ok()) {
      first = id.status();
      break;
    }
    ids.push_back(*id);
  }
  for (aio::RequestId id : ids) {
    Status st = handle_->wait(id);
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
  }
  for (Pending& p : pending) stored->push_back(std::move(p.what));
  if (!first.is_ok()) {
    sums_not_committed(*stored);
    return first.with_context("storing the page checksums");
  }
  return Status::ok();
}

void SwapStore::sums_not_committed(const std::vector<StoredSums>& stored) {
  std::lock_guard lock(state_->mutex);
  for (const StoredSums& st : stored) {
    auto it = state_->sums.find(st.key);
    if (it != state_->sums.end()) it->second.dirty = true;  // stored again by the next commit
  }
}

void SwapStore::record_sums(const IoBatch& batch) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->sums.find(batch.sums_key_);
  const std::uint64_t first = batch.offset_ / kSwapAlignment;
  // Gone or reallocated meanwhile (I/O racing erase/allocate is a caller error): nothing to record.
  if (it == state_->sums.end() || first + batch.page_sums_.size() > it->second.pages.size()) return;
  std::copy(batch.page_sums_.begin(), batch.page_sums_.end(),
            it->second.pages.begin() + static_cast<std::ptrdiff_t>(first));
  it->second.dirty = true;
}

std::vector<std::uint64_t> SwapStore::expected_sums(const IoBatch& batch) const {
  const std::uint64_t first = batch.offset_ / kSwapAlignment;
  const std::uint64_t pages = batch.bytes / kSwapAlignment;
  std::lock_guard lock(state_->mutex);
  auto it = state_->sums.find(batch.sums_key_);
  if (it == state_->sums.end() || first + pages > it->second.pages.size()) return {};
  return std::vector<std::uint64_t>(it->second.pages.begin() + static_cast<std::ptrdiff_t>(first),
                                    it->second.pages.begin() + static_cast<std::ptrdiff_t>(first + pages));
}

Status SwapStore::checksum_error(const IoBatch& batch, const std::vector<std::uint64_t>& expected,
                                 const detail::PageCheck& found) const {
  const std::uint64_t at = batch.offset_ + found.first_bad * kSwapAlignment;
  std::string where = "its data file";
  if (Result<TensorRecord> r = find(batch.sums_key_); r.is_ok()) {
    const detail::Piece p = detail::map_range(*r, at, kSwapAlignment, state_->files.size(), config_.stripe_unit).front();
    where = fmt::format("{} offset {}", state_->files[p.file].path, p.file_offset);
  }
  return Status::corruption(fmt::format(
      "checksum mismatch in tensor '{}' bytes [{}, {}) read from {} (xxh3 {:016x}, written as {:016x}; {} of {} "
      "pages differ): the swap data was damaged or changed outside zinf",
      batch.sums_key_, at, at + kSwapAlignment, where, found.got, expected[found.first_bad], found.bad, expected.size()));
}

}  // namespace zinf::swap
