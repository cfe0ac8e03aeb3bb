// Internal: the arithmetic of the attention core's block products, which the models choose from
// their matmul kind and pass down explicitly.
#pragma once

#include "zinf/model/matmul.h"

namespace zinf::model::kernels {

enum class AttentionProducts {
  kFp32,  // block_gemm: fp32 products (the bits zinf's attention always had)
  kBf16,  // block_gemm_bf16: operands rounded to bf16, fp32 accumulation (block_gemm.h)
};

// kBf16 exactly when `matmul` is MatmulKind::kBf16 (the linear layers already take bf16 inputs)
// and the CPU has AVX512-BF16 (detail::block_gemm_bf16_supported()); kFp32 otherwise, so fp32
// runs, and 16-bit runs on CPUs without AVX512-BF16, keep the fp32 products' bits.
AttentionProducts attention_products_for(MatmulKind matmul);

}  // namespace zinf::model::kernels
