// Internal: DeviceOps (ops.h) for a host-addressable device (the host device): each call is a
// work item on the stream that runs the CPU function itself, so results are the CPU's bits.
#pragma once

#include <memory>

#include "device/ops.h"

namespace zinf::device {

// `device` must be host-addressable and outlive the ops.
std::unique_ptr<DeviceOps> make_host_ops(Device& device);

}  // namespace zinf::device
