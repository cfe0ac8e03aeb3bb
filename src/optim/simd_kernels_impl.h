// Internal: the vector kernels, written once over a vector-traits struct `V`.
//
// Included by kernels_avx2.cpp and kernels_avx512.cpp inside an anonymous namespace, after
// they define `V`, so each ISA gets its own internal copy (see the note in kernels.h). It
// includes nothing itself. V provides: kWidth (floats per vector, 8 or 16), F (the vector
// type), set1 / load / store / add / mul / div / sqrt, load_bf16 / load_f16 / store_bf16 /
// store_f16 (kWidth elements at any alignment), sign (as LionScalars defines it), and Acc /
// acc_zero / acc_add (adds the squares of 16 elements, as doubles, to 16 lanes) / acc_store.
//
// Each kernel applies the operations of kernels.h in the same order as kernels_scalar.cpp.
// The last partial vector is staged through zero-padded local buffers and run through the
// same vector code, so tails need no separate scalar arithmetic.

static_assert(16 % V::kWidth == 0, "the norm lanes assume 8 or 16 floats per vector");
constexpr std::size_t kW = V::kWidth;
using F = typename V::F;

template <DType T>
F load_any(const void* base, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return V::load(static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::kBF16) {
    return V::load_bf16(static_cast<const std::uint16_t*>(base) + i);
  } else {
    return V::load_f16(static_cast<const std::uint16_t*>(base) + i);
  }
}

template <DType T>
void store_any(void* base, std::size_t i, F x) {
  if constexpr (T == DType::kF32) {
    V::store(static_cast<float*>(base) + i, x);
  } else if constexpr (T == DType::kBF16) {
    V::store_bf16(static_cast<std::uint16_t*>(base) + i, x);
  } else {
    V::store_f16(static_cast<std::uint16_t*>(base) + i, x);
  }
}

std::size_t bytes_of(DType t) { return t == DType::kF32 ? 4 : 2; }

// Runs body(arrays, 0) on copies of elements [i, i + n) (n < kW) padded with zeros, then
// copies the n updated elements back. Padding lanes compute on zeros and are discarded.
template <typename Body>
void run_tail(const StepArrays& a, std::size_t i, std::size_t n, Body&& body) {
  alignas(64) float p[kW] = {};
  alignas(64) float s1[kW] = {};
  alignas(64) float s2[kW] = {};
  alignas(64) unsigned char g[4 * kW] = {};
  alignas(64) unsigned char c[2 * kW] = {};
  const std::size_t gb = bytes_of(a.grad_dtype);
  const std::size_t cb = bytes_of(a.copy_dtype);
  std::memcpy(p, a.param + i, n * 4);
  std::memcpy(s1, a.state1 + i, n * 4);
  if (a.state2 != nullptr) std::memcpy(s2, a.state2 + i, n * 4);
  std::memcpy(g, static_cast<const unsigned char*>(a.grad) + i * gb, n * gb);
  const StepArrays local{p, s1, s2, g, a.grad_dtype, a.copy == nullptr ? nullptr : c, a.copy_dtype};
  body(local, 0);
  std::memcpy(a.param + i, p, n * 4);
  std::memcpy(a.state1 + i, s1, n * 4);
  if (a.state2 != nullptr) std::memcpy(a.state2 + i, s2, n * 4);
  if (a.copy != nullptr) std::memcpy(static_cast<unsigned char*>(a.copy) + i * cb, c, n * cb);
}

// Streams are prefetched this far ahead: with 4-5 streams the hardware prefetcher alone leaves
// the kernels short of memory bandwidth (figures: docs/benchmarks.md, "Figures behind choices in
// the code"). Prefetching changes no result.
constexpr std::size_t kPrefetchBytes = 1024;
constexpr std::size_t kAhead = kPrefetchBytes / 4;  // in fp32 elements

void prefetch(const void* base, std::size_t byte_offset) {
  _mm_prefetch(static_cast<const char*>(base) + byte_offset, _MM_HINT_T0);
}

template <typename Body>
void for_each_vector(const StepArrays& a, std::size_t begin, std::size_t end, Body&& body) {
  const StepArrays x = a;  // a local copy: the stores below cannot alias it, so pointers stay in registers
  const std::size_t gb = bytes_of(x.grad_dtype);
  std::size_t i = begin;
  for (; i + kW <= end; i += kW) {
    if (i % 16 == 0) {  // once per 64 bytes of fp32
      prefetch(x.param, 4 * (i + kAhead));
      prefetch(x.state1, 4 * (i + kAhead));
      if (x.state2 != nullptr) prefetch(x.state2, 4 * (i + kAhead));
      prefetch(x.grad, gb * (i + kAhead));
    }
    body(x, i);
  }
  if (i < end) run_tail(x, i, end - i, body);
}

template <DType G, DType C, Decay D>
void adam_range(const AdamScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  const F beta1 = V::set1(s.beta1), one_minus_beta1 = V::set1(s.one_minus_beta1);
  const F beta2 = V::set1(s.beta2), one_minus_beta2 = V::set1(s.one_minus_beta2);
  const F eps = V::set1(s.eps), rsqrt_bc2 = V::set1(s.rsqrt_bc2), neg_step = V::set1(s.neg_step_size);
  const F l2 = V::set1(s.l2_decay), decoupled = V::set1(s.decoupled_decay), gs = V::set1(s.grad_scale);
  for_each_vector(a, begin, end, [&](const StepArrays& x, std::size_t i) {
    F g = V::mul(load_any<G>(x.grad, i), gs);
    F p = V::load(x.param + i);
    if constexpr (D == Decay::kL2) g = V::add(g, V::mul(l2, p));
    const F m = V::add(V::mul(beta1, V::load(x.state1 + i)), V::mul(one_minus_beta1, g));
    const F v = V::add(V::mul(beta2, V::load(x.state2 + i)), V::mul(one_minus_beta2, V::mul(g, g)));
    const F denom = V::add(V::mul(V::sqrt(v), rsqrt_bc2), eps);
    if constexpr (D == Decay::kDecoupled) p = V::add(p, V::mul(decoupled, p));
    p = V::add(p, V::mul(neg_step, V::div(m, denom)));
    V::store(x.param + i, p);
    V::store(x.state1 + i, m);
    V::store(x.state2 + i, v);
    if constexpr (C != DType::kF32) store_any<C>(x.copy, i, p);
  });
}

template <DType G, DType C, bool kDecay>
void adagrad_range(const AdagradScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  const F eps = V::set1(s.eps), neg_lr = V::set1(s.neg_lr), wd = V::set1(s.weight_decay);
  const F gs = V::set1(s.grad_scale);
  for_each_vector(a, begin, end, [&](const StepArrays& x, std::size_t i) {
    F g = V::mul(load_any<G>(x.grad, i), gs);
    F p = V::load(x.param + i);
    if constexpr (kDecay) g = V::add(g, V::mul(wd, p));
    const F v = V::add(V::load(x.state1 + i), V::mul(g, g));
    const F denom = V::add(V::sqrt(v), eps);
    p = V::add(p, V::mul(neg_lr, V::div(g, denom)));
    V::store(x.param + i, p);
    V::store(x.state1 + i, v);
    if constexpr (C != DType::kF32) store_any<C>(x.copy, i, p);
  });
}

template <DType G, DType C>
void lion_range(const LionScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  const F beta1 = V::set1(s.beta1), one_minus_beta1 = V::set1(s.one_minus_beta1);
  const F beta2 = V::set1(s.beta2), one_minus_beta2 = V::set1(s.one_minus_beta2);
  const F neg_lr = V::set1(s.neg_lr), decay = V::set1(s.decay_factor), gs = V::set1(s.grad_scale);
  for_each_vector(a, begin, end, [&](const StepArrays& x, std::size_t i) {
    const F g = V::mul(load_any<G>(x.grad, i), gs);
    const F m = V::load(x.state1 + i);
    const F c = V::add(V::mul(beta1, m), V::mul(one_minus_beta1, g));
    const F p = V::add(V::mul(V::load(x.param + i), decay), V::mul(neg_lr, V::sign(c)));
    V::store(x.param + i, p);
    V::store(x.state1 + i, V::add(V::mul(beta2, m), V::mul(one_minus_beta2, g)));
    if constexpr (C != DType::kF32) store_any<C>(x.copy, i, p);
  });
}

void adam(const AdamScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  with_dtypes(a, [&]<DType G, DType C>() {
    with_decay(s.decay, [&]<Decay D>() { adam_range<G, C, D>(s, a, begin, end); });
  });
}

void adagrad(const AdagradScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  with_dtypes(a, [&]<DType G, DType C>() {
    if (s.decay) {
      adagrad_range<G, C, true>(s, a, begin, end);
    } else {
      adagrad_range<G, C, false>(s, a, begin, end);
    }
  });
}

void lion(const LionScalars& s, const StepArrays& a, std::size_t begin, std::size_t end) {
  with_dtypes(a, [&]<DType G, DType C>() { lion_range<G, C>(s, a, begin, end); });
}

// Squares of 16 elements starting at x[i] into the 16 lanes.
template <DType T>
void accumulate16(typename V::Acc& acc, const void* x, std::size_t i) {
  F v[16 / kW];
  for (std::size_t k = 0; k < 16 / kW; ++k) v[k] = load_any<T>(x, i + k * kW);
  V::acc_add(acc, v);
}

template <DType T>
void sq_norm_range(const void* x, std::size_t begin, std::size_t end, double* block_sums) {
  const std::size_t eb = bytes_of(T);
  for (std::size_t b = begin, j = 0; b < end; b += kNormBlock, ++j) {
    const std::size_t stop = end - b < kNormBlock ? end : b + kNormBlock;
    typename V::Acc acc = V::acc_zero();
    std::size_t i = b;
    for (; i + 16 <= stop; i += 16) accumulate16<T>(acc, x, i);
    if (i < stop) {  // zero padding adds +0 to lanes that are >= +0: no change
      alignas(64) unsigned char pad[4 * 16] = {};
      std::memcpy(pad, static_cast<const unsigned char*>(x) + i * eb, (stop - i) * eb);
      accumulate16<T>(acc, pad, 0);
    }
    double lanes[kNormLanes];
    V::acc_store(acc, lanes);
    double sum = 0.0;
    for (std::size_t l = 0; l < kNormLanes; ++l) sum += lanes[l];
    block_sums[j] = sum;
  }
}

void sq_norm_blocks(const void* x, DType dtype, std::size_t begin, std::size_t end, double* block_sums) {
  switch (dtype) {
    case DType::kF32: sq_norm_range<DType::kF32>(x, begin, end, block_sums); break;
    case DType::kBF16: sq_norm_range<DType::kBF16>(x, begin, end, block_sums); break;
    case DType::kF16: sq_norm_range<DType::kF16>(x, begin, end, block_sums); break;
  }
}

template <DType S, DType D>
void convert_range(const void* src, void* dst, std::size_t begin, std::size_t end) {
  std::size_t i = begin;
  for (; i + kW <= end; i += kW) store_any<D>(dst, i, load_any<S>(src, i));
  if (i < end) {
    alignas(64) unsigned char in[4 * kW] = {};
    alignas(64) unsigned char out[4 * kW];
    const std::size_t n = end - i;
    std::memcpy(in, static_cast<const unsigned char*>(src) + i * bytes_of(S), n * bytes_of(S));
    store_any<D>(out, 0, load_any<S>(in, 0));
    std::memcpy(static_cast<unsigned char*>(dst) + i * bytes_of(D), out, n * bytes_of(D));
  }
}

void to_f32(const void* src, DType src_dtype, float* dst, std::size_t begin, std::size_t end) {
  switch (src_dtype) {
    case DType::kF32: convert_range<DType::kF32, DType::kF32>(src, dst, begin, end); break;
    case DType::kBF16: convert_range<DType::kBF16, DType::kF32>(src, dst, begin, end); break;
    case DType::kF16: convert_range<DType::kF16, DType::kF32>(src, dst, begin, end); break;
  }
}

void from_f32(const float* src, void* dst, DType dst_dtype, std::size_t begin, std::size_t end) {
  switch (dst_dtype) {
    case DType::kF32: convert_range<DType::kF32, DType::kF32>(src, dst, begin, end); break;
    case DType::kBF16: convert_range<DType::kF32, DType::kBF16>(src, dst, begin, end); break;
    case DType::kF16: convert_range<DType::kF32, DType::kF16>(src, dst, begin, end); break;
  }
}

const KernelTable kTable{adam, adagrad, lion, sq_norm_blocks, to_f32, from_f32};
