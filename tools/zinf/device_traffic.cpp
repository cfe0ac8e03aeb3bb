// Step and run figures of the device-resident path (device_traffic.h).
#include "device_traffic.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace zinf::cli {
namespace {
constexpr double kMiB = 1048576.0;
bool moved(const zero3::StepReport& r) { return r.h2d_bytes + r.d2h_bytes > 0; }
// On a device: moved data, or held the state in device memory (offload none: nothing moves).
bool on_device(const zero3::StepReport& r) { return moved(r) || r.device_peak_bytes > 0; }
// GB/s while copying; NaN where the device does not time its copies.
double gb_per_s(std::uint64_t bytes, double copy_s) {
  return std::isfinite(copy_s) && copy_s > 0 ? static_cast<double>(bytes) / copy_s / 1e9
                                             : std::numeric_limits<double>::quiet_NaN();
}
}  // namespace

double device_wait_share(const zero3::StepReport& r) {
  const double passes = r.forward_s + r.backward_s;
  return passes > 0 ? r.device_wait_s / passes : 0.0;
}

void DeviceTraffic::add(const zero3::StepReport& r) {
  if (!on_device(r)) return;
  ++steps_;
  h2d_ += r.h2d_bytes;
  d2h_ += r.d2h_bytes;
  peak_ = std::max(peak_, r.device_peak_bytes);
  seconds_ += r.seconds;
  h2d_copy_s_ += r.h2d_copy_s;
  d2h_copy_s_ += r.d2h_copy_s;
  pass_s_ += r.forward_s + r.backward_s;
  wait_s_ += r.device_wait_s;
  download_wait_s_ += r.download_wait_s;
  staging_wait_s_ += r.staging_wait_s;
}

std::string DeviceTraffic::step_line(const zero3::StepReport& r) {
  if (!moved(r)) return "";
  return fmt::format(" | h2d {:.1f} MiB d2h {:.1f} MiB wait {:.1f}%", r.h2d_bytes / kMiB, r.d2h_bytes / kMiB,
                     100.0 * device_wait_share(r));
}

void DeviceTraffic::add_json(nlohmann::json& line, const zero3::StepReport& r) {
  if (!on_device(r)) return;
  line["h2d_bytes"] = r.h2d_bytes;
  line["d2h_bytes"] = r.d2h_bytes;
  line["device_wait_s"] = r.device_wait_s;
  line["device_wait_share"] = device_wait_share(r);
  line["download_wait_s"] = r.download_wait_s;
  line["staging_wait_s"] = r.staging_wait_s;
  line["device_peak_bytes"] = r.device_peak_bytes;
  // Transfer rates while copying; null where the device does not time its copies.
  auto rate = [](std::uint64_t bytes, double s) {
    const double r = gb_per_s(bytes, s);
    return std::isnan(r) ? nlohmann::json() : nlohmann::json(r);
  };
  line["h2d_gbps"] = rate(r.h2d_bytes, r.h2d_copy_s);
  line["d2h_gbps"] = rate(r.d2h_bytes, r.d2h_copy_s);
}

std::string DeviceTraffic::summary() const {
  if (steps_ == 0) return "";
  const double per_step = 1.0 / static_cast<double>(steps_);
  auto rate = [](std::uint64_t bytes, double s) {
    const double r = gb_per_s(bytes, s);
    return std::isnan(r) ? std::string("rate not measured") : fmt::format("{:.1f} GB/s", r);
  };
  const std::string peak =
      predicted_peak_ == 0
          ? fmt::format("peak device memory {:.1f} MiB", peak_ / kMiB)
          : fmt::format("peak device memory {:.1f} MiB (predicted {:.1f} MiB, {:.3f}x)", peak_ / kMiB,
                        predicted_peak_ / kMiB, peak_ > 0 ? static_cast<double>(predicted_peak_) / static_cast<double>(peak_) : 0.0);
  if (h2d_ + d2h_ == 0) {
    return fmt::format("device: {} steps; nothing moved between host and device (the state is on the device); {}\n",
                       steps_, peak);
  }
  return fmt::format(
      "device: {} steps; per step: parameters up {:.1f} MiB ({}), gradients down {:.1f} MiB ({}); compute waited "
      "for uploads {:.1f}% of the passes, for gradient downloads {:.3f} s, for staging {:.3f} s; {}\n",
      steps_, h2d_ * per_step / kMiB, rate(h2d_, h2d_copy_s_), d2h_ * per_step / kMiB, rate(d2h_, d2h_copy_s_),
      pass_s_ > 0 ? 100.0 * wait_s_ / pass_s_ : 0.0, download_wait_s_ * per_step, staging_wait_s_ * per_step, peak);
}

}  // namespace zinf::cli
