// FloatBuffer: a move-only owner of one 64-byte aligned, uninitialised float array.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <span>

namespace zinf::model {

// Parameter, gradient and activation storage: one allocation with views into it (llm.c
// malloc_and_point). Contents start uninitialised. Not thread-safe; the owner decides.
class FloatBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  FloatBuffer() = default;
  // An empty buffer when n == 0; a buffer with data() == nullptr when the allocation failed
  // (callers turn that into a resource_exhausted Status).
  static FloatBuffer allocate(size_t n) {
    FloatBuffer b;
    if (n == 0) return b;
    size_t bytes = (n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
    b.data_.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
    if (b.data_) b.size_ = n;
    return b;
  }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<float> span() { return {data_.get(), size_}; }
  std::span<const float> span() const { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t size_ = 0;
};

}  // namespace zinf::model
