#include "runtime/arena_pool.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "kernels/cpu/thread_scratch.h"
#include "osprey/runtime.h"

namespace osprey {

size_t TakeIdle(std::vector<IdleBuffer>& idle, double idle_seconds, std::vector<std::shared_ptr<Buffer>>* dropped,
                const std::function<void(const Buffer*)>& on_drop) {
  const auto cutoff = std::chrono::steady_clock::now() -
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(std::max(0.0, idle_seconds)));
  size_t bytes = 0;
  for (auto it = idle.begin(); it != idle.end();) {
    if (it->since <= cutoff) {
      bytes += it->buffer->size();
      if (on_drop) on_drop(it->buffer.get());
      dropped->push_back(std::move(it->buffer));
      it = idle.erase(it);
    } else {
      ++it;
    }
  }
  return bytes;
}

struct ArenaPool::Impl {
  std::mutex mu;
  std::vector<IdleBuffer> idle;  // oldest first
  std::shared_ptr<MemoryAccount> account = std::make_shared<MemoryAccount>("idle execution arenas");
};

ArenaPool::ArenaPool() : impl_(std::make_unique<Impl>()) {}

ArenaPool& ArenaPool::Host() {
  static ArenaPool* pool = new ArenaPool();  // never destroyed: arenas may come back while the process exits
  return *pool;
}

std::shared_ptr<Buffer> ArenaPool::Take(size_t bytes, const std::shared_ptr<MemoryAccount>& account) {
  std::shared_ptr<Buffer> arena;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto best = impl_->idle.end();
    for (auto it = impl_->idle.begin(); it != impl_->idle.end(); ++it) {
      const size_t size = it->buffer->size();
      if (size >= bytes && size <= std::max(bytes, kSmallArena) * kMaxWaste &&
          (best == impl_->idle.end() || size < best->buffer->size()))
        best = it;
    }
    if (best != impl_->idle.end()) {
      arena = std::move(best->buffer);
      impl_->idle.erase(best);
    }
  }
  if (!arena) return Allocator::Host().Allocate(bytes, account);
  arena->ChargeTo(account);
  return arena;
}

void ArenaPool::Give(std::shared_ptr<Buffer> arena) {
  if (!arena) return;
  arena->ChargeTo(impl_->account);
  std::shared_ptr<Buffer> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->idle.push_back({std::move(arena), std::chrono::steady_clock::now()});
  if (impl_->idle.size() > kMaxIdle) {
    dropped = std::move(impl_->idle.front().buffer);
    impl_->idle.erase(impl_->idle.begin());
  }
}

size_t ArenaPool::Trim(double idle_seconds) {
  std::vector<std::shared_ptr<Buffer>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(impl_->mu);
  return TakeIdle(impl_->idle, idle_seconds, &dropped);
}

int64_t ArenaPool::IdleBytes() const { return impl_->account->BytesLive(); }

size_t TrimSharedArenas(double idle_seconds) {
  return ArenaPool::Host().Trim(idle_seconds) + cpu::TrimThreadScratch(idle_seconds);
}
int64_t SharedArenaBytes() { return ArenaPool::Host().IdleBytes() + cpu::ThreadScratchBytes(); }

}  // namespace osprey
