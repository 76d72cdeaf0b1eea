#include "core/hash.h"
#include "osprey/runtime.h"

namespace osprey {

WeightStore::WeightStore() : account_(std::make_shared<MemoryAccount>("weights")) {}

namespace {
uint64_t ContentHash(const Tensor& t) {
  Hasher h;
  h.UpdateU64(static_cast<uint64_t>(t.dtype()));
  h.UpdateU64(t.shape().size());
  for (int64_t d : t.shape()) h.UpdateU64(static_cast<uint64_t>(d));
  if (t.nbytes()) h.Update(t.raw(), t.nbytes());
  return h.Finish().lo;
}
}  // namespace

Tensor WeightStore::Intern(const Tensor& t) {
  const uint64_t key = ContentHash(t);
  std::lock_guard<std::mutex> lock(mu_);
  auto range = entries_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    std::shared_ptr<Buffer> buf = it->second.buffer.lock();
    if (!buf || it->second.dtype != t.dtype() || it->second.shape != t.shape()) continue;
    // Equal hashes are confirmed byte by byte, so a collision can never alias two different weights.
    if (t.nbytes() && std::memcmp(buf->data(), t.raw(), t.nbytes()) != 0) continue;
    return Tensor::View(t.dtype(), t.shape(), buf, 0);
  }
  Tensor copy = t.Clone(account_);
  entries_.emplace(key, Entry{copy.buffer(), t.dtype(), t.shape()});
  // Drop entries whose weights died, now and then, so the table stays proportional to live weights.
  if (++interns_since_sweep_ >= 256 && interns_since_sweep_ >= entries_.size()) {
    interns_since_sweep_ = 0;
    for (auto it = entries_.begin(); it != entries_.end();)
      it = it->second.buffer.expired() ? entries_.erase(it) : std::next(it);
  }
  return copy;
}

size_t WeightStore::NumLive() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, e] : entries_) n += !e.buffer.expired();
  return n;
}

void WeightStore::Hold(const Tensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  ++holders_[t.buffer().get()];
}

void WeightStore::Unhold(const Tensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holders_.find(t.buffer().get());
  if (it != holders_.end() && --it->second <= 0) holders_.erase(it);
}

int WeightStore::Holders(const Tensor& t) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holders_.find(t.buffer().get());
  return it == holders_.end() ? 0 : it->second;
}

}  // namespace osprey
