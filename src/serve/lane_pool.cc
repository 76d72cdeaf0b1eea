#include "serve/lane_pool.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace osprey::serve {

LanePool::LanePool(int threads, int capacity) : capacity_(std::max({1, threads, capacity})) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Work(); });
}

LanePool::~LanePool() { Join(); }

bool LanePool::Post(const std::string& lane, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    const size_t capacity = static_cast<size_t>(capacity_);
    if (held_ >= capacity) {
      // Full: only a lane below its share gets in (lanes are at most the jobs held, so the count is cheap enough).
      auto it = lanes_.find(lane);
      const size_t mine = it == lanes_.end() ? 0 : it->second.held();
      const size_t lanes = lanes_.size() + (it == lanes_.end() ? 1 : 0);
      if (held_ >= 2 * capacity || mine >= std::max<size_t>(1, capacity / lanes)) return false;
    }
    lanes_[lane].jobs.emplace_back(arrivals_++, std::move(job));
    ++queued_;
    ++held_;
  }
  ready_.notify_one();
  return true;
}

std::string LanePool::Refusal() const {
  return "the server is busy: " + std::to_string(capacity_) +
         " requests are running or waiting for a worker (--workers + --max-queue) and this model holds its share of "
         "them; retry later";
}

void LanePool::Join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void LanePool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ready_.wait(lock, [this] { return queued_ > 0 || stopping_; });
    if (queued_ == 0) return;  // stopping, nothing left
    // The lane holding the fewest workers, then the one served longest ago, then the oldest job. Lanes are at most
    // the requests queued or running (bounded by --workers + --max-queue), so the scan is short.
    auto key = [](const Lane& l) { return std::make_tuple(l.running, l.last_start, l.jobs.front().first); };
    auto best = lanes_.end();
    for (auto it = lanes_.begin(); it != lanes_.end(); ++it)
      if (!it->second.jobs.empty() && (best == lanes_.end() || key(it->second) < key(best->second))) best = it;
    std::function<void()> job = std::move(best->second.jobs.front().second);
    best->second.jobs.pop_front();
    --queued_;
    ++best->second.running;
    best->second.last_start = ++starts_;
    const std::string lane = best->first;
    lock.unlock();
    job();
    job = nullptr;  // what the job captured goes before the lock is taken again
    lock.lock();
    auto it = lanes_.find(lane);
    --held_;
    if (--it->second.running == 0 && it->second.jobs.empty()) lanes_.erase(it);
  }
}

}  // namespace osprey::serve
