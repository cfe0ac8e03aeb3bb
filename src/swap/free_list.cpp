// Best-fit free list with coalescing, used by the pinned pool and the swap store's files.
#include "swap/free_list.h"

#include <cassert>
#include <iterator>

namespace zinf::swap::detail {

void FreeList::insert(std::uint64_t offset, std::uint64_t length) {
  by_offset_.emplace(offset, length);
  by_size_.emplace(length, offset);
  total_ += length;
}

void FreeList::erase(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  total_ -= it->second;
  by_offset_.erase(it);
}

void FreeList::add(std::uint64_t offset, std::uint64_t length) {
  if (length == 0) return;
  auto next = by_offset_.lower_bound(offset);
  assert(next == by_offset_.end() || next->first >= offset + length);
  if (next != by_offset_.end() && next->first == offset + length) {
    length += next->second;
    auto after = std::next(next);
    erase(next);
    next = after;
  }
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      erase(prev);
    }
  }
  insert(offset, length);
}

std::optional<std::uint64_t> FreeList::take(std::uint64_t length) {
  if (length == 0) return std::nullopt;
  auto fit = by_size_.lower_bound({length, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const std::uint64_t offset = fit->second;
  const std::uint64_t have = fit->first;
  erase(by_offset_.find(offset));
  if (have > length) insert(offset + length, have - length);
  return offset;
}

std::optional<std::uint64_t> FreeList::take_tail(std::uint64_t end) {
  if (by_offset_.empty()) return std::nullopt;
  auto last = std::prev(by_offset_.end());
  if (last->first + last->second != end) return std::nullopt;
  const std::uint64_t offset = last->first;
  erase(last);
  return offset;
}

std::uint64_t FreeList::largest() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

}  // namespace zinf::swap::detail
