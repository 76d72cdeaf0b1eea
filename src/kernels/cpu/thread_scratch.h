#pragma once
// Per-thread scratch memory for kernels (reorder buffers, primitive scratchpads, formed input rows), and how it is
// given back: docs/architecture.md, "Execution arenas".
#include <cstddef>
#include <cstdint>

namespace osprey::cpu {

/// One growing block per thread: kernels on one thread run one after another. Every thread's block is listed, so that
/// TrimThreadScratch can free those a thread no longer uses (a run of a large batch left its block that large for the
/// life of the thread, in no model's account: 32 MiB in a Python process after the model was deleted).
class ThreadScratch {
 public:
  /// Reserves `bytes` (rounded up to 64-byte multiples per region) and returns the base, 64-byte aligned. The
  /// pointer stays valid until the next Reserve on this thread, and while an InUse is alive (see there).
  static char* Reserve(size_t bytes);
  /// Rounds a region size up so consecutive regions stay 64-byte aligned.
  static size_t Align(size_t bytes) { return (bytes + 63) / 64 * 64; }

  /// Kernels may run on this thread, and on the OpenMP teams it starts, while one is alive (Plan::Run, a compile's
  /// kernel timings): TrimThreadScratch frees nothing then. Nests. A block reserved outside any (a kernel run by hand,
  /// as tests do) is not freed until its thread reserves it again inside one.
  class InUse {
   public:
    InUse();
    ~InUse();
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;
  };
};

/// Frees the blocks that no Reserve used for `idle_seconds` (as trims see it: a block used since the previous trim is
/// idle from this one; 0: every block), unless kernels are running (an InUse alive on any thread: then nothing, and
/// 0). Returns the bytes freed. TrimSharedArenas calls it.
size_t TrimThreadScratch(double idle_seconds);
/// Bytes the threads' blocks hold.
int64_t ThreadScratchBytes();

}  // namespace osprey::cpu
