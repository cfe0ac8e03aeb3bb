// The device-resident path's share of a run (zinf train --host-device): what each step moved
// through the device and how long the passes waited for it, per step (--json-log, the progress
// line's breakdown) and for the whole run (the end-of-run summary).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "zinf/zero3/engine.h"

namespace zinf::cli {

class DeviceTraffic {
 public:
  // Adds a step's figures (steps that moved nothing through a device and used no device memory
  // add nothing).
  void add(const zero3::StepReport& r);
  bool any() const { return steps_ > 0; }
  // The peak device memory zinf train predicted for the run (zero3::predict_memory's GPU bytes),
  // printed beside the measured one; 0: none.
  void set_predicted_peak(std::uint64_t bytes) { predicted_peak_ = bytes; }
  // " | h2d 12.0 MiB d2h 11.9 MiB wait 3.1%" for the progress line, "" when nothing moved.
  static std::string step_line(const zero3::StepReport& r);
  // The step's keys for --json-log (none when nothing moved through a device and no device
  // memory was used).
  static void add_json(nlohmann::json& line, const zero3::StepReport& r);
  // "device: 24 steps, parameters up 1.2 GiB (2.1 GB/s of step time), ..." for the end of a run.
  std::string summary() const;

 private:
  std::uint64_t steps_ = 0, h2d_ = 0, d2h_ = 0, peak_ = 0, predicted_peak_ = 0;
  double h2d_copy_s_ = 0, d2h_copy_s_ = 0;
  double seconds_ = 0, pass_s_ = 0, wait_s_ = 0, download_wait_s_ = 0, staging_wait_s_ = 0;
};

// The share of the passes (forward + backward) the compute waited for uploads to land.
double device_wait_share(const zero3::StepReport& r);

}  // namespace zinf::cli
