// Internal: free ranges of an address space (a pinned arena or a swap file), best fit, coalesced.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace zinf::swap::detail {

// Not thread-safe; the owner locks. Ranges are [offset, offset + length), length > 0.
class FreeList {
 public:
  // Returns a range to the list, merging it with free neighbours. It must not overlap a free range.
  void add(std::uint64_t offset, std::uint64_t length);
  // Takes `length` bytes from the smallest free range that holds them (lowest offset among
  // equals) and returns their offset; nullopt when no range is large enough.
  std::optional<std::uint64_t> take(std::uint64_t length);
  // When a free range ends exactly at `end`, removes it and returns its offset (a file that
  // grows can then start the new extent there instead of leaving a hole).
  std::optional<std::uint64_t> take_tail(std::uint64_t end);
  std::uint64_t largest() const;
  std::uint64_t total() const { return total_; }
  std::size_t ranges() const { return by_offset_.size(); }
  const std::map<std::uint64_t, std::uint64_t>& by_offset() const { return by_offset_; }

 private:
  void insert(std::uint64_t offset, std::uint64_t length);
  void erase(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::map<std::uint64_t, std::uint64_t> by_offset_;        // offset -> length
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (length, offset)
  std::uint64_t total_ = 0;
};

}  // namespace zinf::swap::detail
