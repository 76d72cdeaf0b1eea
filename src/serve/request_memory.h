#pragma once
// The bytes of requests the server holds at once, summed over every connection and both protocols: bodies being read,
// waiting for a worker and running (--max-request-memory). Without it, --workers + --max-queue requests of
// --max-body-size each were held at once (4 + 256 of 64 MiB: 16 GiB), a memory flood from one client.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace osprey::serve {

class RequestMemory {
 public:
  /// A share of the budget, given back when the last copy goes.
  class Hold {
   public:
    Hold(std::shared_ptr<std::atomic<int64_t>> held, int64_t bytes) : held_(std::move(held)), bytes_(bytes) {}
    ~Hold() { held_->fetch_sub(bytes_); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    int64_t bytes() const { return bytes_; }
    /// Keeps `bytes` (<= what is held): the rest goes back (a body shorter than what was set aside for it).
    void Shrink(int64_t bytes) {
      if (bytes >= bytes_) return;
      held_->fetch_sub(bytes_ - bytes);
      bytes_ = bytes;
    }

   private:
    std::shared_ptr<std::atomic<int64_t>> held_;  // the budget's count, which may outlive the budget
    int64_t bytes_;
  };

  /// `limit` <= 0: no limit.
  explicit RequestMemory(int64_t limit) : limit_(limit) {}

  /// `bytes` of the budget, or null when they do not fit beside what is held. A request is never refused while nothing
  /// else is held (so one of --max-body-size always gets in, whatever the limit), nor for 0 bytes.
  std::shared_ptr<Hold> Take(int64_t bytes) {
    bytes = bytes < 0 ? 0 : bytes;
    int64_t held = held_->load();
    for (;;) {
      if (limit_ > 0 && held > 0 && bytes > 0 && held + bytes > limit_) return nullptr;
      if (held_->compare_exchange_weak(held, held + bytes)) return std::make_shared<Hold>(held_, bytes);
    }
  }
  int64_t held() const { return held_->load(); }
  int64_t limit() const { return limit_; }
  /// What a refused request is told (503 / UNAVAILABLE).
  std::string Refusal(int64_t bytes) const {
    return "the server is busy: a request of " + std::to_string(bytes) + " bytes does not fit beside the " +
           std::to_string(held()) + " bytes of requests it holds (--max-request-memory " + std::to_string(limit_) +
           "); retry later";
  }

 private:
  const int64_t limit_;
  std::shared_ptr<std::atomic<int64_t>> held_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace osprey::serve
