// Internal: turns the run-time dtypes and decay mode of an optimizer step into template
// arguments, once for every kernel path (scalar, AVX2, AVX-512, the GPU's Adam).
//
// Safe for the translation units built with their own -m flags (see kernels.h): every call
// passes a lambda defined in the caller's translation unit, whose closure type belongs to that
// unit alone, so no two units share an instantiation the linker could merge.
#pragma once

#include "optim/kernels.h"
#include "zinf/optim/dtype.h"

namespace zinf::optim::detail {

// Calls body.template operator()<G, C>() with the gradient dtype G and the copy dtype C:
// copy_dtype, or kF32 (no 16-bit copy) when copy is nullptr.
template <typename Body>
void with_dtypes(DType grad_dtype, const void* copy, DType copy_dtype, Body&& body) {
  const DType c = copy == nullptr ? DType::kF32 : copy_dtype;
  auto with_copy = [&]<DType G>() {
    switch (c) {
      case DType::kF32: body.template operator()<G, DType::kF32>(); break;
      case DType::kBF16: body.template operator()<G, DType::kBF16>(); break;
      case DType::kF16: body.template operator()<G, DType::kF16>(); break;
    }
  };
  switch (grad_dtype) {
    case DType::kF32: with_copy.template operator()<DType::kF32>(); break;
    case DType::kBF16: with_copy.template operator()<DType::kBF16>(); break;
    case DType::kF16: with_copy.template operator()<DType::kF16>(); break;
  }
}

// The same for a step's arrays (StepArrays, or any struct with grad_dtype, copy and copy_dtype).
template <typename Arrays, typename Body>
void with_dtypes(const Arrays& a, Body&& body) {
  with_dtypes(a.grad_dtype, a.copy, a.copy_dtype, static_cast<Body&&>(body));
}

// Calls body.template operator()<D>() with the decay mode D.
template <typename Body>
void with_decay(Decay decay, Body&& body) {
  switch (decay) {
    case Decay::kNone: body.template operator()<Decay::kNone>(); break;
    case Decay::kL2: body.template operator()<Decay::kL2>(); break;
    case Decay::kDecoupled: body.template operator()<Decay::kDecoupled>(); break;
  }
}

}  // namespace zinf::optim::detail
