#pragma once
// The server's workers and the requests waiting for them, in lanes (a request's model), so that a flood of requests
// for one model cannot starve the others. A REST request holds its worker until it is answered, also while it waits
// for its model's stream; with a first-in first-out queue, 100 requests for a slow model queued ahead of one for a fast
// model made the fast one wait for ~100 slow runs. Here a free worker takes the oldest job of the lane that holds the
// fewest workers at that moment (ties: the lane served longest ago, so lanes take turns even with one worker), so a
// request for another model waits at most for the first worker to finish, typically one run of the busy model, and a
// lone model still gets every worker (no worker is kept idle for lanes that have nothing waiting).
//
// The pool also decides who is refused when it is full (`capacity` jobs held, queued or running): a lane holding less
// than its share (capacity / the lanes holding jobs, this one counted) is still admitted, up to 2 x capacity in all,
// so a flood of one model fills its own share and gets refused, while a request for another model is taken.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace osprey::serve {

class LanePool {
 public:
  /// Starts `threads` (at least 1) workers; `capacity` (at least `threads`): jobs held before Post refuses (above).
  explicit LanePool(int threads, int capacity = 1 << 30);
  /// Join()s.
  ~LanePool();
  LanePool(const LanePool&) = delete;
  LanePool& operator=(const LanePool&) = delete;

  /// Queues `job` in `lane` (any string; "" is a lane too); false (`job` dropped, not run) when the pool is full for
  /// this lane, or stopping. Thread-safe. Jobs must not throw.
  [[nodiscard]] bool Post(const std::string& lane, std::function<void()> job);
  int capacity() const { return capacity_; }
  /// What a refused request is told (503 / UNAVAILABLE; the same words for REST and gRPC).
  std::string Refusal() const;
  /// Runs what is queued, then stops the workers. Idempotent.
  void Join();

 private:
  struct Lane {
    std::deque<std::pair<uint64_t, std::function<void()>>> jobs;  // (arrival number, job)
    int running = 0;
    size_t held() const { return jobs.size() + static_cast<size_t>(running); }
    uint64_t last_start = 0;  // starts_ when it last started a job (0: not since it was last idle)
  };
  void Work();

  std::mutex mu_;
  std::condition_variable ready_;
  std::map<std::string, Lane> lanes_;  // lanes with jobs queued or running; erased when both are none
  uint64_t arrivals_ = 0;
  uint64_t starts_ = 0;
  size_t queued_ = 0;
  size_t held_ = 0;  // queued or running
  const int capacity_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace osprey::serve
