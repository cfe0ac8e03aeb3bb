// Internal: where a device model's passes spend their time, and the table of its fields, so that
// a new timer is one field and one row here (the arithmetic, the step report and the JSON log
// follow the table).
#pragma once

#include <array>
#include <cstdint>

namespace zinf::device {

// Summed since the model was made: host clocks around the bridge's work, and the compute stream's
// busy time from events between the points where the host makes it wait (so it counts kernels
// and the launch gaps between them; the device's waiting is the rest of the step's wall time).
struct StepTimes {
  std::uint64_t passes = 0;
  double pass_s = 0;              // host wall time inside forward_backward / forward_loss
  double gpu_compute_s = 0;       // the compute stream's busy time
  double host_acquire_s = 0;      // the engine's acquire: gathering values (memory, CPU or NVMe)
  double upload_s = 0;            // the cast into pinned staging, the H2D copy and its wait
  double download_s = 0;          // the D2H copies of gradients, their wait, the adds into host buffers
  double host_grads_ready_s = 0;  // the engine's grads_ready (partition copy, reduction)
  std::uint64_t upload_bytes = 0;
  std::uint64_t download_bytes = 0;
};

// Every field with its key in zinf train's --json-log lines.
template <typename T>
struct StepTimeField {
  const char* json_key;
  T StepTimes::*member;
};
inline constexpr std::array<StepTimeField<double>, 6> kStepTimeSeconds{{
    {"gpu_pass_s", &StepTimes::pass_s},
    {"gpu_compute_s", &StepTimes::gpu_compute_s},
    {"gpu_host_acquire_s", &StepTimes::host_acquire_s},
    {"gpu_upload_s", &StepTimes::upload_s},
    {"gpu_download_s", &StepTimes::download_s},
    {"gpu_host_grads_ready_s", &StepTimes::host_grads_ready_s},
}};
inline constexpr std::array<StepTimeField<std::uint64_t>, 3> kStepTimeCounts{{
    {"gpu_passes", &StepTimes::passes},
    {"gpu_upload_bytes", &StepTimes::upload_bytes},
    {"gpu_download_bytes", &StepTimes::download_bytes},
}};

static_assert(sizeof(StepTimes) == sizeof(double) * kStepTimeSeconds.size() + sizeof(std::uint64_t) * kStepTimeCounts.size(),
              "every StepTimes field has a row in kStepTimeSeconds or kStepTimeCounts");

inline StepTimes& operator+=(StepTimes& a, const StepTimes& b) {
  for (const auto& f : kStepTimeSeconds) a.*f.member += b.*f.member;
  for (const auto& f : kStepTimeCounts) a.*f.member += b.*f.member;
  return a;
}

// b minus a, field by field: one step's share of two running totals.
inline StepTimes operator-(const StepTimes& b, const StepTimes& a) {
  StepTimes d = b;
  for (const auto& f : kStepTimeSeconds) d.*f.member -= a.*f.member;
  for (const auto& f : kStepTimeCounts) d.*f.member -= a.*f.member;
  return d;
}

}  // namespace zinf::device
