// The tensor-core attention's host side: what it supports (sizes, alignment, the device's
// compute capability) and which attention path a call takes (ZINF_ATTENTION).
#include "gpu/tc_attention.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/cuda_last_error.h"
#include "gpu/tc_attention_tiles.h"
#include "zinf/log.h"

namespace zinf::gpu {

TcAttentionTensors tc_packed_qkv(const bf16* qkv, int B, int T, int C, int NH) {
  const std::size_t c = static_cast<std::size_t>(C);
  const int hs = NH > 0 ? C / NH : 0;
  return TcAttentionTensors{qkv, qkv + c, qkv + 2 * c, 3 * c, 3 * c, c, B, T, NH, NH, hs};
}

TcAttentionTensors tc_separate_qkv(const bf16* q, const bf16* k, const bf16* v, const GqaShape& s) {
  const std::size_t qw = static_cast<std::size_t>(s.NH) * static_cast<std::size_t>(s.hs);
  const std::size_t kvw = static_cast<std::size_t>(s.NKV) * static_cast<std::size_t>(s.hs);
  return TcAttentionTensors{q, k, v, qw, kvw, qw, s.B, s.T, s.NH, s.NKV, s.hs};
}

namespace {

std::string describe_shape(const TcAttentionTensors& a) {
  return "tc_attention B=" + std::to_string(a.B) + " T=" + std::to_string(a.T) + " NH=" + std::to_string(a.NH) +
         " NKV=" + std::to_string(a.NKV) + " hs=" + std::to_string(a.hs);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The current device's major compute capability plus one, cached per device (0: not asked yet).
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_major_plus_one{};

Result<int> device_major() {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    forget_cuda_error(err);
    return Status::unsupported(std::string("tc_attention: no current device: ") + cudaGetErrorName(err));
  }
  const bool cached = dev >= 0 && dev < kMaxDevices;
  if (cached && g_major_plus_one[static_cast<std::size_t>(dev)].load() > 0) {
    return g_major_plus_one[static_cast<std::size_t>(dev)].load() - 1;
  }
  int major = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err != cudaSuccess) {
    forget_cuda_error(err);
    return Status::unsupported(std::string("tc_attention: compute capability unknown: ") + cudaGetErrorName(err));
  }
  if (cached) g_major_plus_one[static_cast<std::size_t>(dev)].store(major + 1);
  return major;
}

}  // namespace

Status tc_attention_supports(const TcAttentionTensors& a, std::initializer_list<const void*> more) {
  if (a.B < 1 || a.T < 1 || a.NH < 1 || a.NKV < 1 || a.hs < 1 || a.NH % a.NKV != 0) {
    return Status::invalid_argument(describe_shape(a) + ": sizes must be >= 1 with NH divisible by NKV");
  }
  if (!tc::head_size_supported(a.hs)) {
    return Status::unsupported(describe_shape(a) + ": head size is not a multiple of 16 in [16, 128]");
  }
  if (static_cast<long long>(a.B) * a.NH > 65535) {
    return Status::unsupported(describe_shape(a) + ": B * NH is above grid.y's 65535");
  }
  if (a.q_ld % 8 != 0 || a.kv_ld % 8 != 0 || a.o_ld % 8 != 0) {
    return Status::unsupported(describe_shape(a) + ": row strides are not multiples of 8 elements");
  }
  bool aligned = aligned16(a.q) && aligned16(a.k) && aligned16(a.v);
  for (const void* p : more) aligned = aligned && aligned16(p);
  if (!aligned) return Status::unsupported(describe_shape(a) + ": a tensor is not 16-byte aligned");
  ZINF_ASSIGN_OR_RETURN(const int major, device_major());
  if (major < 8) {
    return Status::unsupported(describe_shape(a) + ": the device's compute capability " + std::to_string(major) +
                               ".x is below 8.0 (bf16 tensor cores)");
  }
  return Status::ok();
}

// ---- which path -----------------------------------------------------------------------------

std::optional<AttentionPath> parse_attention_path(std::string_view s) {
  if (s == "tc") return AttentionPath::kTensorCore;
  if (s == "gemm") return AttentionPath::kGemm;
  if (s == "flash") return AttentionPath::kFlash;
  if (s == "auto" || s.empty()) return AttentionPath::kAuto;
  return std::nullopt;
}

const char* attention_path_name(AttentionPath p) {
  switch (p) {
    case AttentionPath::kAuto: return "auto";
    case AttentionPath::kTensorCore: return "tc";
    case AttentionPath::kGemm: return "gemm";
    case AttentionPath::kFlash: return "flash";
  }
  return "?";
}

namespace {

// -1: no override; otherwise an AttentionPath.
std::atomic<int> g_override{-1};
std::atomic<long long> g_tc_calls{0};

AttentionPath env_attention_path() {
  static const AttentionPath from_env = [] {
    const char* v = std::getenv("ZINF_ATTENTION");
    if (v == nullptr) return AttentionPath::kAuto;
    const std::optional<AttentionPath> p = parse_attention_path(v);
    if (p) return *p;
    log_once(LogLevel::kWarning, "gpu ZINF_ATTENTION",
             std::string("gpu: ZINF_ATTENTION=") + v + " is not one of tc, gemm, flash, auto; auto is used");
    return AttentionPath::kAuto;
  }();
  return from_env;
}

}  // namespace

AttentionPath requested_attention_path() {
  const int o = g_override.load();
  return o >= 0 ? static_cast<AttentionPath>(o) : env_attention_path();
}

void set_attention_path(std::optional<AttentionPath> p) { g_override.store(p ? static_cast<int>(*p) : -1); }

AttentionPath attention_path_for(AttentionPath requested, const Status& supports) {
  switch (requested) {
    case AttentionPath::kGemm:
    case AttentionPath::kFlash: return requested;
    case AttentionPath::kTensorCore:
      if (!supports.is_ok()) {
        log_once(LogLevel::kNotice, "gpu tc attention unsupported",
                 "gpu: ZINF_ATTENTION=tc, but the tensor-core attention does not take this call, the GEMM path "
                 "runs (" + supports.message() + ")");
      }
      break;
    case AttentionPath::kAuto: break;
  }
  return supports.is_ok() ? AttentionPath::kTensorCore : AttentionPath::kGemm;
}

long long tc_attention_calls() { return g_tc_calls.load(); }
void count_tc_attention_call() { g_tc_calls++; }

}  // namespace zinf::gpu
