#pragma once
// Whether timings taken on this machine competed with other work for the CPUs: the tuner's choices (oneDNN
// implementations, osprey's own kernels) and the plan's per-step thread counts are timed when a model compiles, which
// on a server can be while other models run, and a choice timed under load must not outlive the load.
#include <chrono>
#include <cstdint>

namespace osprey {

/// Nanoseconds this process's threads have spent runnable but waiting for a CPU (the second field of
/// /proc/self/task/<tid>/schedstat, summed); -1 where the kernel does not expose it.
int64_t ProcessRunDelayNs();

/// Watches the timings taken between its construction and Disturbed().
class LoadWatch {
 public:
  /// The share of the wall time this process's threads may wait for a CPU before the timings count as disturbed.
  static constexpr double kDisturbedShare = 0.1;

  LoadWatch() : delay_ns_(ProcessRunDelayNs()), start_(std::chrono::steady_clock::now()) {}
  /// True when the threads waited for a CPU more than kDisturbedShare of the wall time since construction; false
  /// where the kernel does not say (the timing is then trusted).
  bool Disturbed() const;
  /// The share of the wall time since construction the threads waited for a CPU (0 where the kernel does not say).
  double DelayShare() const;

 private:
  int64_t delay_ns_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace osprey
