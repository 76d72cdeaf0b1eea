#include "osprey/runtime.h"

namespace osprey {

PlanCache::PlanCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) { stats_.capacity = capacity_; }

namespace {
std::string MakeKey(const std::string& fingerprint, const std::vector<TensorSpec>& inputs,
                    const CompileOptions& options) {
  std::string key = fingerprint + "|" + options.Key();
  for (const TensorSpec& s : inputs) key += "|" + std::string(DTypeName(s.dtype)) + ShapeToString(s.shape);
  return key;
}
}  // namespace

std::shared_ptr<const Plan> PlanCache::GetOrCompile(const std::string& fingerprint,
                                                    const std::vector<TensorSpec>& inputs,
                                                    const CompileOptions& options,
                                                    const std::function<std::shared_ptr<const Plan>()>& compile) {
  const std::string key = MakeKey(fingerprint, inputs, options);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    if (!in_flight_.count(key)) break;
    cv_.wait(lock);  // another thread is compiling this key; use its result
  }
  ++stats_.misses;
  in_flight_.insert(key);
  lock.unlock();
  std::shared_ptr<const Plan> plan;
  try {
    plan = compile();
  } catch (...) {
    lock.lock();
    in_flight_.erase(key);
    cv_.notify_all();
    throw;
  }
  lock.lock();
  in_flight_.erase(key);
  lru_.emplace_front(key, plan);
  index_[key] = lru_.begin();
  EvictLocked();
  cv_.notify_all();
  return plan;
}

void PlanCache::EvictLocked() {
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.size = lru_.size();
}

PlanCache::Stats PlanCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.size = lru_.size();
  s.capacity = capacity_;
  return s;
}

void PlanCache::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = std::max<size_t>(capacity, 1);
  EvictLocked();
}

std::vector<std::shared_ptr<const Plan>> PlanCache::Plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const Plan>> plans;
  for (const auto& entry : lru_) plans.push_back(entry.second);
  return plans;
}

size_t PlanCache::TrimArenas(double idle_seconds) {
  const std::vector<std::shared_ptr<const Plan>> plans = Plans();
  size_t bytes = 0;
  for (const auto& plan : plans) bytes += plan->TrimArenas(idle_seconds);
  return bytes;
}

void PlanCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
  stats_.size = 0;
}

}  // namespace osprey
