#pragma once
// The two compiles the fusion tests compare: the oracle (reference kernels, no fusion passes) and the plan under test
// (fast kernels, fusion), both on two threads; and the check that a malformed fused node is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "osprey/error.h"
#include "osprey/runtime.h"

namespace osprey::testing {

inline const CompileOptions kOracle{.num_threads = 2, .fast_kernels = false, .fuse = false};
inline const CompileOptions kFast{.num_threads = 2, .fast_kernels = true, .fuse = true};

/// Expects compiling `graph` for `specs` (as the oracle) to fail with an error whose message contains `needle`.
inline void ExpectCompileError(const Graph& graph, const std::vector<TensorSpec>& specs, const std::string& needle) {
  try {
    Compile(graph, specs, kOracle);
    ADD_FAILURE() << "compiled; expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace osprey::testing
