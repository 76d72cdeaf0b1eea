#pragma once
// Host execution arenas shared by every plan of the process (docs/architecture.md, "Execution arenas").
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "osprey/tensor.h"

namespace osprey {

/// A pooled block and since when it has been idle (arenas, device arenas, output blocks).
struct IdleBuffer {
  std::shared_ptr<Buffer> buffer;
  std::chrono::steady_clock::time_point since;
};

/// Moves the blocks of `idle` unused for `idle_seconds` (0: every one) into `dropped`, for the caller to free outside
/// its lock, calling `on_drop` (when given) with each; returns their bytes.
size_t TakeIdle(std::vector<IdleBuffer>& idle, double idle_seconds, std::vector<std::shared_ptr<Buffer>>* dropped,
                const std::function<void(const Buffer*)>& on_drop = nullptr);

/// The idle host arenas of the process. A run takes the smallest idle one that holds its plan's arena and is at most
/// kMaxWaste times as large (as if it needed at least kSmallArena: tiny plans take tiny arenas, not new ones each
/// time), else a new one is allocated, charged to its model's account while it runs; when the run
/// ends it goes back here, charged to this pool's account (SharedArenaBytes). So models that run in turn share one
/// arena: their memory follows the number of runs at once, not the number of models. Thread-safe.
class ArenaPool {
 public:
  static ArenaPool& Host();
  /// An idle arena of at least `bytes` bytes charged to `account`, or a new one.
  std::shared_ptr<Buffer> Take(size_t bytes, const std::shared_ptr<MemoryAccount>& account);
  /// Returns a run's arena (charged to the pool from now on). Beyond kMaxIdle idle arenas the oldest is freed.
  void Give(std::shared_ptr<Buffer> arena);
  /// Frees the arenas idle for `idle_seconds` (0: all idle ones); returns the bytes freed.
  size_t Trim(double idle_seconds);
  /// Bytes of the idle arenas.
  int64_t IdleBytes() const;

  static constexpr size_t kMaxWaste = 4;
  static constexpr size_t kSmallArena = size_t{64} << 10;
  static constexpr size_t kMaxIdle = 16;

 private:
  ArenaPool();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
