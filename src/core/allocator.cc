#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include "osprey/device.h"
#include "osprey/tensor.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace osprey {

void MemoryAccount::Add(int64_t bytes, Device where) {
  if (where != Device::kHost) {
    device_live_.fetch_add(bytes, std::memory_order_relaxed);
    return;
  }
  int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

namespace {
std::atomic<size_t> g_mmap_threshold{Allocator::kMmapThreshold};

int64_t DefaultHostLimit() {
  int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  std::string text;
  if (cgroup >> text && !text.empty() && text != "max") {
    try {
      const int64_t limit = std::stoll(text);
      if (limit > 0 && (physical <= 0 || limit < physical)) physical = limit;
    } catch (const std::exception&) {
    }
  }
  return physical > 0 ? physical / 10 * 9 : 0;
}

std::atomic<int64_t> g_host_limit{DefaultHostLimit()};
}  // namespace

void Allocator::SetHostLimit(int64_t bytes) { g_host_limit.store(bytes < 0 ? 0 : bytes, std::memory_order_relaxed); }
int64_t Allocator::host_limit() { return g_host_limit.load(std::memory_order_relaxed); }

void Allocator::SetMmapThreshold(size_t bytes) { g_mmap_threshold.store(bytes, std::memory_order_relaxed); }
size_t Allocator::mmap_threshold() { return g_mmap_threshold.load(std::memory_order_relaxed); }

Allocator& Allocator::Host() {
  static Allocator host;
  return host;
}

std::shared_ptr<Buffer> Allocator::Allocate(size_t bytes, std::shared_ptr<MemoryAccount> account) {
  if (bytes > static_cast<size_t>(kMaxBytes))
    throw Error(ErrorCode::kInvalidArgument, "cannot allocate " + std::to_string(bytes) +
                                                 " bytes: larger than osprey's limit of 2^48 bytes per buffer");
  const int64_t limit = host_limit();
  const int64_t live = live_[0].load(std::memory_order_relaxed);
  if (limit > 0 && static_cast<int64_t>(bytes) > limit - live)
    throw Error(ErrorCode::kResourceExhausted,
                "out of host memory: allocating " + std::to_string(bytes) + " bytes would bring osprey's buffers past " +
                    "the host limit of " + std::to_string(limit) + " bytes (Allocator::SetHostLimit; default 90% of " +
                    "this machine's memory) with " + std::to_string(live) + " bytes already in use");
  std::shared_ptr<Buffer> buffer(new Buffer());
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = nullptr;
  if (rounded >= mmap_threshold()) {
    p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
    buffer->mmapped_ = true;
  } else {
    p = std::aligned_alloc(kAlignment, rounded);
    if (p != nullptr) heap_live_.fetch_add(static_cast<int64_t>(rounded), std::memory_order_relaxed);
  }
  if (p == nullptr)
    throw Error(ErrorCode::kResourceExhausted, "out of host memory allocating " + std::to_string(bytes) + " bytes");
  buffer->data_ = p;
  buffer->size_ = rounded;
  buffer->account_ = std::move(account);
  const int64_t now = live_[0].fetch_add(static_cast<int64_t>(rounded)) + static_cast<int64_t>(rounded);
  int64_t peak = peak_[0].load(std::memory_order_relaxed);
  while (now > peak && !peak_[0].compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  if (buffer->account_) buffer->account_->Add(static_cast<int64_t>(rounded));
  return buffer;
}

std::shared_ptr<Buffer> Allocator::AllocateOn(Device kind, int ordinal, size_t bytes,
                                             std::shared_ptr<MemoryAccount> account) {
  if (kind == Device::kHost) return Allocate(bytes, std::move(account));
  if (bytes > static_cast<size_t>(kMaxBytes))
    throw Error(ErrorCode::kInvalidArgument, "cannot allocate " + std::to_string(bytes) +
                                                 " bytes: larger than osprey's limit of 2^48 bytes per buffer");
  DeviceBackend* backend = GetDeviceBackend(kind);
  if (backend == nullptr) throw Error(ErrorCode::kUnsupported, "no backend for this device kind");
  size_t rounded = (bytes + 255) / 256 * 256;  // CUDA's own allocation granularity; also keeps 64-byte alignment
  if (rounded == 0) rounded = 256;
  std::shared_ptr<Buffer> buffer(new Buffer());
  buffer->data_ = backend->Malloc(ordinal, rounded);  // throws kResourceExhausted
  buffer->size_ = rounded;
  buffer->device_ = kind;
  buffer->ordinal_ = ordinal;
  buffer->account_ = std::move(account);
  const int d = static_cast<int>(kind);
  const int64_t now = live_[d].fetch_add(static_cast<int64_t>(rounded)) + static_cast<int64_t>(rounded);
  int64_t peak = peak_[d].load(std::memory_order_relaxed);
  while (now > peak && !peak_[d].compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  if (buffer->account_) buffer->account_->Add(static_cast<int64_t>(rounded), kind);
  return buffer;
}

std::shared_ptr<Buffer> Buffer::Borrow(void* data, size_t size, std::shared_ptr<void> keep_alive) {
  std::shared_ptr<Buffer> buffer(new Buffer());
  buffer->data_ = data;
  buffer->size_ = size;
  buffer->borrowed_ = true;
  buffer->keep_alive_ = std::move(keep_alive);
  return buffer;
}

void Allocator::Release(Buffer* buffer) {
  if (buffer->data_ == nullptr) return;
  if (buffer->borrowed_) {
    buffer->keep_alive_.reset();
    buffer->data_ = nullptr;
    return;
  }
  if (buffer->device_ != Device::kHost) {
    DeviceBackend* backend = GetDeviceBackend(buffer->device_);
    if (backend) backend->Free(buffer->ordinal_, buffer->data_);
  } else if (buffer->mmapped_) {
    munmap(buffer->data_, buffer->size_);
  } else {
    std::free(buffer->data_);
    heap_live_.fetch_sub(static_cast<int64_t>(buffer->size_), std::memory_order_relaxed);
  }
  live_[static_cast<int>(buffer->device_)].fetch_sub(static_cast<int64_t>(buffer->size_));
  if (buffer->account_) buffer->account_->Add(-static_cast<int64_t>(buffer->size_), buffer->device_);
  buffer->data_ = nullptr;
}

Buffer::~Buffer() { Allocator::Host().Release(this); }

int64_t Allocator::UntrackedHeapBytes() const {
  // Under AddressSanitizer malloc is the sanitizer's, which glibc's count does not see.
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && !defined(__SANITIZE_ADDRESS__)
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd) - heap_live_.load(std::memory_order_relaxed);
#else
  return -1;
#endif
}

void Buffer::ChargeTo(std::shared_ptr<MemoryAccount> account) {
  if (borrowed_ || data_ == nullptr || account == account_) return;
  if (account_) account_->Add(-static_cast<int64_t>(size_), device_);
  if (account) account->Add(static_cast<int64_t>(size_), device_);
  account_ = std::move(account);
}

}  // namespace osprey
