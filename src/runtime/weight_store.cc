#include <algorithm>
#include <cstring>
#include <set>

#include "core/hash.h"
#include "core/memory_advice.h"
#include "osprey/runtime.h"

namespace osprey {

WeightStore::WeightStore() : account_(std::make_shared<MemoryAccount>("weights")) {}

namespace {
// The store's key: dtype, shape and the bytes' digest (Graph::ContentDigest, which the fingerprint uses too).
uint64_t ContentKey(const Tensor& t, const Graph::Digest& digest) {
  Hasher h;
  h.UpdateU64(static_cast<uint64_t>(t.dtype()));
  h.UpdateU64(t.shape().size());
  for (int64_t d : t.shape()) h.UpdateU64(static_cast<uint64_t>(d));
  h.UpdateU64(digest[0]);
  h.UpdateU64(digest[1]);
  return h.Finish().lo;
}

uint64_t ContentHash(const Tensor& t) { return ContentKey(t, Graph::ContentDigest(t)); }

// Keeps an adopted buffer alive and charged to the store's account while the store's view of it lives.
struct AdoptedBuffer {
  AdoptedBuffer(std::shared_ptr<Buffer> b, std::shared_ptr<MemoryAccount> a) : buffer(std::move(b)), account(std::move(a)) {
    account->Add(static_cast<int64_t>(buffer->size()));
  }
  ~AdoptedBuffer() { account->Add(-static_cast<int64_t>(buffer->size())); }
  std::shared_ptr<Buffer> buffer;
  std::shared_ptr<MemoryAccount> account;
};
}  // namespace

bool WeightStore::FindLocked(uint64_t key, const Tensor& t, std::shared_ptr<Buffer>* found) const {
  auto range = entries_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    std::shared_ptr<Buffer> buf = it->second.buffer.lock();
    if (!buf || it->second.dtype != t.dtype() || it->second.shape != t.shape()) continue;
    // Equal hashes are confirmed byte by byte, so a collision can never alias two different weights.
    if (t.nbytes() && std::memcmp(buf->data(), t.raw(), t.nbytes()) != 0) continue;
    *found = std::move(buf);
    return true;
  }
  return false;
}

Tensor WeightStore::Intern(const Tensor& t) { return InternKeyed(t, ContentHash(t), /*adopt=*/false); }

Tensor WeightStore::InternOwned(Tensor t, const std::array<uint64_t, 2>& digest) {
  return InternKeyed(t, ContentKey(t, digest), /*adopt=*/true);
}

Tensor WeightStore::InternKeyed(const Tensor& t, uint64_t key, bool adopt) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Buffer> found;
  if (FindLocked(key, t, &found)) return Tensor::View(t.dtype(), t.shape(), found, 0);
  const std::shared_ptr<Buffer>& source = t.buffer();
  Tensor stored;
  // InternOwned's by-value tensor is the buffer's only holder when use_count is 1: keep the buffer itself. Its view
  // is a borrowed Buffer whose keep-alive charges the bytes to the store, as a copy made here would be charged.
  if (adopt && source && source.use_count() == 1 && source->device() == Device::kHost && !source->borrowed() &&
      t.raw() == source->data()) {
    auto holder = std::make_shared<AdoptedBuffer>(source, account_);
    stored = Tensor::View(t.dtype(), t.shape(), Buffer::Borrow(source->data(), source->size(), holder), 0);
  } else {
    stored = Tensor(t.dtype(), t.shape(), account_);
    PrepareForFill(stored, /*huge_pages=*/true);
    if (t.nbytes()) std::memcpy(stored.raw(), t.raw(), t.nbytes());
  }
  entries_.emplace(key, Entry{stored.buffer(), t.dtype(), t.shape()});
  // Drop entries whose weights died, now and then, so the table stays proportional to live weights.
  if (++interns_since_sweep_ >= 256 && interns_since_sweep_ >= entries_.size()) {
    interns_since_sweep_ = 0;
    for (auto it = entries_.begin(); it != entries_.end();)
      it = it->second.buffer.expired() ? entries_.erase(it) : std::next(it);
  }
  return stored;
}

int64_t WeightStore::BytesNotStored(const Graph& graph) const {
  int64_t bytes = 0;
  std::set<const void*> seen;
  for (const auto& [id, t] : graph.constants) {
    if (!seen.insert(t.raw()).second) continue;
    const uint64_t key = ContentHash(t);
    std::shared_ptr<Buffer> found;
    std::lock_guard<std::mutex> lock(mu_);
    if (!FindLocked(key, t, &found)) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

std::shared_ptr<Buffer> WeightStore::Derive(const Tensor& source, const std::string& key, size_t bytes,
                                            const std::function<void(void* data)>& fill, const DeviceSpec& where) {
  const std::shared_ptr<Buffer>& source_buffer = source.buffer();
  OSPREY_CHECK(source_buffer != nullptr);
  const auto offset = static_cast<const char*>(source.raw()) - static_cast<const char*>(source_buffer->data());
  const std::string full_key = std::to_string(reinterpret_cast<uintptr_t>(source_buffer.get())) + "+" +
                               std::to_string(offset) + "/" + DeviceSpecName(where) + "/" + key;
  auto find_live = [&]() -> std::shared_ptr<Buffer> {
    auto it = derived_.find(full_key);
    if (it == derived_.end() || it->second.source.lock() != source_buffer) return nullptr;
    return it->second.derived.lock();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto hit = find_live()) return hit;
  }
  // Filled outside the lock: packing a large weight takes milliseconds and must not serialise other models' compiles.
  // Two compiles racing on one key both fill; the first to finish is kept.
  std::shared_ptr<Buffer> made =
      where.kind == Device::kHost
          ? Allocator::Host().Allocate(std::max<size_t>(bytes, 64), account_)
          : Allocator::Host().AllocateOn(where.kind, where.ordinal, std::max<size_t>(bytes, 64), device_account_);
  // Populated in one call; ordinary pages even with OSPREY_HUGEPAGES=1 (packing was bimodal on huge pages here).
  if (where.kind == Device::kHost) PrepareForFill(made, /*huge_pages=*/false);
  fill(made->data());
  std::lock_guard<std::mutex> lock(mu_);
  if (auto hit = find_live()) return hit;
  derived_[full_key] = DerivedEntry{source_buffer, made};
  if (++derives_since_sweep_ >= 256 && derives_since_sweep_ >= derived_.size()) {
    derives_since_sweep_ = 0;
    for (auto it = derived_.begin(); it != derived_.end();)
      it = it->second.derived.expired() ? derived_.erase(it) : std::next(it);
  }
  return made;
}

size_t WeightStore::NumDerivedLive() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, e] : derived_) n += !e.derived.expired();
  return n;
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
