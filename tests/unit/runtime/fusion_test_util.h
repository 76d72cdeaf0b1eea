#pragma once
// The two compiles the fusion tests compare: the oracle (reference kernels, no fusion passes) and the plan under test
// (fast kernels, fusion), both on two threads.
#include "osprey/runtime.h"

namespace osprey::testing {

inline const CompileOptions kOracle{.num_threads = 2, .fast_kernels = false, .fuse = false};
inline const CompileOptions kFast{.num_threads = 2, .fast_kernels = true, .fuse = true};

}  // namespace osprey::testing
