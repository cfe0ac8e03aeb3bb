// Internal: the swap store's page checksums (StoreConfig::checksums): one XXH3-64 per 4 KiB
// page, computed when a write is submitted, recorded when it succeeds, checked on every read.
// The SwapStore members that keep them (load, store, record, check) are in page_sums.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zinf::swap::detail {

inline constexpr std::uint64_t kUnwrittenPage = 0;  // a page checksum never computed
// Reads with checksums go in requests of at most this many bytes, so that wait() checks each
// piece while the later ones are still being read.
inline constexpr std::uint64_t kCheckedPiece = std::uint64_t{8} << 20;

// The checksum of one 4 KiB page; kUnwrittenPage is kept for "never written", so a real 0 is 1.
std::uint64_t page_sum(const std::byte* page);
// The checksums of the `length / 4096` pages at `bytes` (length a multiple of 4 KiB).
std::vector<std::uint64_t> page_sums_of(const std::byte* bytes, std::uint64_t length);
// 4 KiB pages of a tensor of nbytes bytes.
std::uint64_t page_count(std::uint64_t nbytes);
// Bytes of one half of a tensor's checksum extent: 8 per page, padded to 4 KiB.
std::uint64_t sums_half_bytes(std::uint64_t nbytes);

// A tensor's page checksums in memory.
struct PageSums {
  std::vector<std::uint64_t> pages;  // per 4 KiB page; kUnwrittenPage until written
  bool dirty = false;                // changed since stored in the checksum extent
  std::uint64_t stored_check = 0;    // XXH3 of the array as last stored (for the manifest)
};

// What a read's pages gave against the checksums expected of them.
struct PageCheck {
  std::size_t bad = 0;          // pages that differ
  std::uint64_t first_bad = 0;  // index of the first, in the batch
  std::uint64_t got = 0;        // its checksum as read
};

// Checks the pages of buffer bytes [begin, end) (multiples of 4 KiB) against expected[page]
// (indexed from the buffer's start; unwritten pages are skipped), adding to `found`.
void check_pages(const std::byte* buffer, const std::vector<std::uint64_t>& expected, std::uint64_t begin,
                 std::uint64_t end, PageCheck& found);

}  // namespace zinf::swap::detail
