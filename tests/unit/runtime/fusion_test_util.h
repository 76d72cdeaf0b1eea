#pragma once
// The two compiles the fusion tests compare: the oracle (reference kernels, no fusion passes) and the plan under test
// (fast kernels, fusion), both on two threads; and the check that a malformed fused node is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "osprey/error.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey::testing {

inline const CompileOptions kOracle{.num_threads = 2, .fast_kernels = false, .fuse = false};
inline const CompileOptions kFast{.num_threads = 2, .fast_kernels = true, .fuse = true};

/// Runs `graph` on one random input of `x_shape` (values in [-2, 2]) compiled as the oracle and as kFast, expects the
/// outputs to agree within 1e-4, and returns the fast plan's profile: which steps it kept, on which kernels.
inline std::vector<OpProfile> RunFastAgainstOracle(const Graph& graph, const Shape& x_shape) {
  const Tensor x = RandomTensor(x_shape, 9, -2.f, 2.f);
  const std::vector<Tensor> want = Compile(graph, {{DType::kF32, x_shape}}, kOracle)->Run({x});
  std::vector<OpProfile> profile;
  const std::vector<Tensor> got = Compile(graph, {{DType::kF32, x_shape}}, kFast)->Run({x}, &profile);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) ExpectTensorNear(got[i], want[i], 1e-4f, 1e-4f);
  return profile;
}

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
