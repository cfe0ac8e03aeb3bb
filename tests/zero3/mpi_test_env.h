// Test helper for suites run under mpirun: one MPI communicator for the whole test binary.
#pragma once

#include <chrono>
#include <memory>

#include <gtest/gtest.h>

#include "zinf/zero3/comm_mpi.h"

namespace zinf::zero3::testing {

// MPI is initialised once, before the first test, and finalised after the last.
class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto c = make_mpi_communicator(std::chrono::seconds(60));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    comm = std::move(c).value();
  }
  void TearDown() override { comm.reset(); }
  static inline std::unique_ptr<Communicator> comm;
};

// Registered by each test binary that includes this header (one per binary).
[[maybe_unused]] inline auto* const kMpiEnvironment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

inline Communicator& comm() { return *MpiEnvironment::comm; }

}  // namespace zinf::zero3::testing
