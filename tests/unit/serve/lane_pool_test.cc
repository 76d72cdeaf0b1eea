#include "serve/lane_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace osprey::serve {
namespace {

// A gate jobs wait at until the test opens it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int waiting = 0;
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    ++waiting;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  void WaitForWaiters(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return waiting >= n; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

struct Log {
  std::mutex mu;
  std::vector<std::string> order;
  void Add(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(s);
  }
};

// One worker busy with lane a, five more of a queued, then one of b: b runs next, not after the five (first in first
// out ran it last: a flood of one model starved the others).
TEST(LanePool, AnotherLaneGoesBeforeAFloodWithOneWorker) {
  Gate gate;
  Log log;
  {
    LanePool pool(1);
    EXPECT_TRUE(pool.Post("a", [&] { gate.Wait(); }));
    gate.WaitForWaiters(1);
    for (int i = 1; i <= 5; ++i) EXPECT_TRUE(pool.Post("a", [&log, i] { log.Add("a" + std::to_string(i)); }));
    EXPECT_TRUE(pool.Post("b", [&log] { log.Add("b1"); }));
    gate.Open();
  }  // Join: runs what is queued
  EXPECT_EQ(log.order, (std::vector<std::string>{"b1", "a1", "a2", "a3", "a4", "a5"}));
}

// Two workers, both held by lane a (one "running", one "waiting for its stream"), more of a queued, then b and c: the
// first worker to free takes b (a holds the other), the next c, and a's queue goes on after them.
TEST(LanePool, LanesHoldingFewerWorkersGoFirst) {
  Gate gate, second;
  Log log;
  {
    LanePool pool(2);
    EXPECT_TRUE(pool.Post("a", [&] { gate.Wait(); }));
    EXPECT_TRUE(pool.Post("a", [&] { second.Wait(); }));
    gate.WaitForWaiters(1);
    second.WaitForWaiters(1);
    for (int i = 1; i <= 3; ++i) EXPECT_TRUE(pool.Post("a", [&log, i] { log.Add("a" + std::to_string(i)); }));
    EXPECT_TRUE(pool.Post("b", [&log] { log.Add("b"); }));
    EXPECT_TRUE(pool.Post("c", [&log] { log.Add("c"); }));
    gate.Open();  // one worker frees; the other stays with a until `second` opens
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(log.mu);
        if (log.order.size() >= 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    second.Open();
  }
  ASSERT_EQ(log.order.size(), 5u);
  EXPECT_EQ(log.order[0], "b");
  EXPECT_EQ(log.order[1], "c");
}

// A lane alone gets every worker: two jobs that each wait until both run finish only if both workers take lane a.
TEST(LanePool, OneLaneUsesEveryWorker) {
  Gate gate;
  std::atomic<int> done{0};
  {
    LanePool pool(2);
    for (int i = 0; i < 2; ++i)
      EXPECT_TRUE(pool.Post("a", [&] {
        gate.Wait();
        ++done;
      }));
    gate.WaitForWaiters(2);  // would hang if a lane were held to fewer workers
    gate.Open();
  }
  EXPECT_EQ(done.load(), 2);
}

TEST(LanePool, JoinRunsWhatIsQueuedAndIsIdempotent) {
  std::atomic<int> done{0};
  LanePool pool(2);
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(pool.Post(std::to_string(i % 7), [&] { ++done; }));
  pool.Join();
  pool.Join();
  EXPECT_EQ(done.load(), 50);
}

// Full (capacity 4, all lane a's): a is refused, b is taken up to its share (4 / 2 lanes), c up to its (4 / 3), d (4 /
// 4), and nothing beyond 2 x capacity in all, however many lanes come. Without the shares a flood of one model got
// every other model's request refused (503 / UNAVAILABLE) as soon as it filled the queue.
TEST(LanePool, AFullPoolRefusesTheFloodButTakesOtherLanesUpToTheirShare) {
  Gate gate;
  std::atomic<int> done{0};
  {
    LanePool pool(1, 4);
    EXPECT_TRUE(pool.Post("a", [&] { gate.Wait(); }));
    gate.WaitForWaiters(1);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.Post("a", [&] { ++done; }));
    EXPECT_FALSE(pool.Post("a", [&] { ++done; }));
    EXPECT_TRUE(pool.Post("b", [&] { ++done; }));
    EXPECT_TRUE(pool.Post("b", [&] { ++done; }));
    EXPECT_FALSE(pool.Post("b", [&] { ++done; }));
    EXPECT_TRUE(pool.Post("c", [&] { ++done; }));
    EXPECT_FALSE(pool.Post("c", [&] { ++done; }));  // 4 / 3 lanes: one each
    EXPECT_TRUE(pool.Post("d", [&] { ++done; }));   // 4 / 4 lanes: one; 8 held now, 2 x capacity
    EXPECT_FALSE(pool.Post("e", [&] { ++done; }));  // below its share, but the pool holds 2 x capacity
    gate.Open();
  }
  EXPECT_EQ(done.load(), 7);
}

TEST(LanePool, RefusesOnceStopping) {
  LanePool pool(1);
  pool.Join();
  EXPECT_FALSE(pool.Post("a", [] {}));
}

}  // namespace
}  // namespace osprey::serve
