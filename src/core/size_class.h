#pragma once
// Size classes: how kernel timings are shared between sizes that vary with the input (free image dims, sequence
// lengths). A choice timed at one size holds for every size of its class, so a model seeing a new size is timed once
// per class, not at every size (kernels/cpu/dnnl_common.h TuningActivationKey, runtime/step_threads.cc).
#include <cstdint>

namespace osprey {

/// `n` with all but its two leading bits cleared; exact up to 16 (17-23 -> 16, 24-31 -> 24, 32-47 -> 32, ...).
inline int64_t SizeClass(int64_t n) {
  if (n <= 16) return n;
  const int top = 63 - __builtin_clzll(static_cast<unsigned long long>(n));
  return n & (int64_t{3} << (top - 1));
}

}  // namespace osprey
