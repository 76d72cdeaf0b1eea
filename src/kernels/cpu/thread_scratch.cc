#include "kernels/cpu/thread_scratch.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_set>

#include "osprey/error.h"

namespace osprey::cpu {
namespace {

using Clock = std::chrono::steady_clock;

struct Block {
  char* data = nullptr;
  size_t capacity = 0;
  // Idle time as trims see it (a clock read per Reserve would cost more than the Reserve): `used` is set by each
  // Reserve and cleared by a trim, which then starts `idle_since`.
  bool used = false;
  Clock::time_point idle_since;
  bool pinned = false;  // reserved outside any InUse: never freed by a trim
};

// Every thread's block. `running` is held shared by each thread inside an InUse and exclusively by a trim, which
// only tries: runs never wait for a trim. A trim changes blocks under `mu` too, as does a Reserve outside any InUse.
struct Registry {
  std::shared_mutex running;
  std::mutex mu;
  std::unordered_set<Block*> blocks;
  std::atomic<int64_t> bytes{0};
};

Registry& Blocks() {
  static Registry* registry = new Registry();  // never destroyed: threads may end after static destruction
  return *registry;
}

void Free(Block& b) {
  std::free(b.data);
  Blocks().bytes.fetch_sub(static_cast<int64_t>(b.capacity), std::memory_order_relaxed);
  b.data = nullptr;
  b.capacity = 0;
}

struct ThreadBlock {
  Block block;
  ThreadBlock() {
    std::lock_guard<std::mutex> lock(Blocks().mu);
    Blocks().blocks.insert(&block);
  }
  ~ThreadBlock() {
    std::lock_guard<std::mutex> lock(Blocks().mu);
    Blocks().blocks.erase(&block);
    Free(block);
  }
};

thread_local int t_in_use = 0;  // InUse scopes alive on this thread

void Grow(Block& b, size_t bytes) {
  if (bytes <= b.capacity) return;
  // Grow by half again so a thread that sees slowly increasing sizes does not reallocate on every call.
  const size_t capacity = ThreadScratch::Align(std::max(bytes, b.capacity + b.capacity / 2));
  char* p = static_cast<char*>(std::aligned_alloc(64, capacity));
  if (p == nullptr)
    throw Error(ErrorCode::kResourceExhausted,
                "kernel scratch memory: could not allocate " + std::to_string(capacity) + " bytes");
  Free(b);
  b.data = p;
  b.capacity = capacity;
  Blocks().bytes.fetch_add(static_cast<int64_t>(capacity), std::memory_order_relaxed);
}

}  // namespace

char* ThreadScratch::Reserve(size_t bytes) {
  thread_local ThreadBlock owned;
  Block& b = owned.block;
  if (bytes == 0) bytes = 64;
  // Inside an InUse, here or in the thread that started this team, no trim runs: the block is this thread's alone.
  if (t_in_use > 0 || omp_in_parallel()) {
    b.pinned = false;  // an earlier use outside an InUse on this thread is over
    Grow(b, bytes);
    b.used = true;
    return b.data;
  }
  std::lock_guard<std::mutex> lock(Blocks().mu);
  b.pinned = true;
  Grow(b, bytes);
  return b.data;
}

ThreadScratch::InUse::InUse() {
  if (t_in_use++ == 0) Blocks().running.lock_shared();
}

ThreadScratch::InUse::~InUse() {
  if (--t_in_use == 0) Blocks().running.unlock_shared();
}

size_t TrimThreadScratch(double idle_seconds) {
  Registry& r = Blocks();
  std::unique_lock<std::shared_mutex> running(r.running, std::try_to_lock);
  if (!running.owns_lock()) return 0;
  const Clock::time_point now = Clock::now();
  const auto idle = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(idle_seconds));
  size_t freed = 0;
  std::lock_guard<std::mutex> lock(r.mu);
  for (Block* b : r.blocks) {
    if (b->used) {  // used since the last trim: idle from now
      b->used = false;
      b->idle_since = now;
    }
    if (b->pinned || b->capacity == 0 || (idle_seconds > 0 && now - b->idle_since < idle)) continue;
    freed += b->capacity;
    Free(*b);
  }
  return freed;
}

int64_t ThreadScratchBytes() { return Blocks().bytes.load(std::memory_order_relaxed); }

}  // namespace osprey::cpu
