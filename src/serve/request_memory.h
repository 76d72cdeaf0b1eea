#pragma once
// The bytes of requests the server holds at once, summed over every connection and both protocols: bodies read so far,
// waiting for a worker and running (--max-request-memory). Without it, --workers + --max-queue requests of
// --max-body-size each were held at once (4 + 256 of 64 MiB: 16 GiB), a memory flood from one client. Bytes are
// counted as they arrive, not as announced: a client that announces a large body and sends nothing holds nothing.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace osprey::serve {

class RequestMemory {
  struct State {
    std::atomic<int64_t> held{0};
    int64_t limit = 0;  // <= 0: none
    // Whether `add` more bytes fit beside `held`, of which `own` are the asker's. Never refused while nothing else is
    // held (so one request of --max-body-size always gets in, whatever the limit), nor for nothing.
    bool Fits(int64_t held_now, int64_t own, int64_t add) const {
      return limit <= 0 || add <= 0 || held_now - own <= 0 || held_now + add <= limit;
    }
  };

 public:
  /// A request's bytes in the budget, given back when it goes.
  class Hold {
   public:
    explicit Hold(std::shared_ptr<State> state) : state_(std::move(state)) {}
    ~Hold() { state_->held.fetch_sub(bytes_); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    int64_t bytes() const { return bytes_; }
    /// Holds `bytes` in all (more of a body arrived); false, holding what it held, when they do not fit.
    bool GrowTo(int64_t bytes) {
      const int64_t add = bytes - bytes_;
      int64_t held = state_->held.load();
      do {
        if (!state_->Fits(held, bytes_, add)) return false;
      } while (!state_->held.compare_exchange_weak(held, held + add));
      bytes_ = bytes;
      return true;
    }

   private:
    std::shared_ptr<State> state_;  // may outlive the budget
    int64_t bytes_ = 0;
  };

  /// `limit` <= 0: no limit.
  explicit RequestMemory(int64_t limit) { state_->limit = limit; }

  /// An empty hold for a request that announces `bytes`, or null when they would not fit beside what is held now
  /// (refused before any is read).
  std::shared_ptr<Hold> Admit(int64_t bytes) const {
    if (!state_->Fits(state_->held.load(), 0, bytes)) return nullptr;
    return std::make_shared<Hold>(state_);
  }
  /// A hold of `bytes` (a message already received), or null when they do not fit.
  std::shared_ptr<Hold> Take(int64_t bytes) const {
    auto hold = Admit(bytes);
    return hold && hold->GrowTo(bytes) ? hold : nullptr;
  }
  int64_t held() const { return state_->held.load(); }
  int64_t limit() const { return state_->limit; }
  /// What a refused request is told (503 / UNAVAILABLE).
  std::string Refusal(int64_t bytes) const {
    return "the server is busy: a request of " + std::to_string(bytes) + " bytes does not fit beside the " +
           std::to_string(held()) + " bytes of requests it holds (--max-request-memory " +
           std::to_string(state_->limit) + "); retry later";
  }

 private:
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace osprey::serve
