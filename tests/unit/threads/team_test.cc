// osprey's OpenMP runtime (src/threads/team.cc) against the OpenMP semantics osprey and oneDNN rely on; expected
// values are computed by hand from the OpenMP specification (thread numbers, static schedules), not by the runtime.
#include <dlfcn.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>
#include <omp.h>
#include <xmmintrin.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "threads/team.h"

extern "C" {
bool GOMP_loop_static_start(long start, long end, long incr, long chunk, long* istart, long* iend);
bool GOMP_loop_static_next(long* istart, long* iend);
void GOMP_loop_end_nowait();
void GOMP_parallel_start(void (*fn)(void*), void* data, unsigned num_threads);
void GOMP_parallel_end();
}

namespace {

// Runs the test body with `threads` in the ICV and restores it.
struct WithThreads {
  explicit WithThreads(int n) : previous(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~WithThreads() { omp_set_num_threads(previous); }
  int previous;
};

TEST(OmpTeam, IsTheRuntimeInUse) {
  ASSERT_FALSE(osprey::threads::UsingLibgomp()) << "OSPREY_OMP_RUNTIME=libgomp is set";
  // The dynamic linker resolves the names libdnnl looks up to this executable's definitions, not libgomp's.
  void* self = dlopen(nullptr, RTLD_NOW);
  void* found = dlsym(self, "GOMP_parallel_start");
  void* gomp = dlsym(RTLD_NEXT, "GOMP_parallel_start");
  EXPECT_EQ(found, reinterpret_cast<void*>(&GOMP_parallel_start));
  EXPECT_NE(found, gomp);
}

// Each worker computes in the floating-point mode of the thread that starts the region (plans flush subnormals to
// zero: core/float_env.h), as a thread created then would. The oracle: 1e-30 x 1e-10 is a subnormal under IEEE
// arithmetic and zero with MXCSR's flush-to-zero bit.
volatile float g_tiny = 1e-30f, g_scale = 1e-10f;  // read at run time: the product is computed, not folded
TEST(OmpTeam, WorkersComputeInTheFloatingPointModeOfTheRegionsStarter) {
  WithThreads with(3);
  auto products = [] {
    std::vector<float> got(3, -1.f);
#pragma omp parallel
    {
#pragma omp barrier
      got[omp_get_thread_num()] = g_tiny * g_scale;  // after the barrier: each part on its own thread (none taken over)
    }
    return got;
  };
  const unsigned saved = _mm_getcsr();
  for (float v : products()) EXPECT_GT(v, 0.f);
  _mm_setcsr(saved | 0x8000);  // flush to zero
  for (float v : products()) EXPECT_EQ(v, 0.f);
  _mm_setcsr(saved);
  for (float v : products()) EXPECT_GT(v, 0.f) << "a worker kept the previous region's mode";
}

TEST(OmpTeam, RegionRunsOnTheRequestedThreads) {
  WithThreads with(3);
  EXPECT_FALSE(omp_in_parallel());
  std::vector<std::pair<int, int>> seen(3, {-1, -1});
  std::atomic<int> in_parallel{0};
  const long before = osprey::threads::RegionsStarted();
#pragma omp parallel
  {
    seen[omp_get_thread_num()] = {omp_get_thread_num(), omp_get_num_threads()};
    in_parallel += omp_in_parallel() ? 1 : 0;
  }
  EXPECT_EQ(osprey::threads::RegionsStarted(), before + 1);
  for (int t = 0; t < 3; ++t) EXPECT_EQ(seen[t], std::make_pair(t, 3));
  EXPECT_EQ(in_parallel.load(), 3);
  EXPECT_EQ(omp_get_num_threads(), 1);
  EXPECT_EQ(omp_get_thread_num(), 0);

  std::atomic<int> count{0};
#pragma omp parallel num_threads(2)
  count += omp_get_num_threads();
  EXPECT_EQ(count.load(), 4);
}

TEST(OmpTeam, ThreadCountsOutOfRangeAreClamped) {
  // Below 1 means 1 (as libgomp); above 256 means 256, so a huge --threads cannot start that many threads per caller.
  WithThreads with(-3);
  EXPECT_EQ(omp_get_max_threads(), 1);
  std::atomic<int> n{0};
#pragma omp parallel
  n += 1;
  EXPECT_EQ(n.load(), 1);
  omp_set_num_threads(1 << 20);
  EXPECT_EQ(omp_get_max_threads(), 256);
  std::atomic<int> size{0}, members{0};
#pragma omp parallel num_threads(100000)
  {
    members += 1;
    if (omp_get_thread_num() == 0) size = omp_get_num_threads();
  }
  EXPECT_EQ(size.load(), 256);
  EXPECT_EQ(members.load(), 256);
}

TEST(OmpTeam, TeamsInheritTheIcvAndNestedRegionsRunOnOneThread) {
  WithThreads with(2);
  std::atomic<int> inner_threads{0}, inner_in_parallel{0}, inner_ids{0}, icv{0};
#pragma omp parallel
  {
    icv += omp_get_max_threads();
#pragma omp parallel num_threads(4)
    {
      inner_threads += omp_get_num_threads();
      inner_ids += omp_get_thread_num();
      inner_in_parallel += omp_in_parallel() ? 1 : 0;
    }
  }
  EXPECT_EQ(icv.load(), 4);             // both threads see 2
  EXPECT_EQ(inner_threads.load(), 2);   // one thread per inner region, two inner regions
  EXPECT_EQ(inner_ids.load(), 0);
  EXPECT_EQ(inner_in_parallel.load(), 2);

  // A region of one thread is inactive: a region inside it gets a team.
  std::atomic<int> inner{0};
#pragma omp parallel num_threads(1)
  {
    EXPECT_FALSE(omp_in_parallel());
#pragma omp parallel num_threads(2)
    inner += omp_get_num_threads();
  }
  EXPECT_EQ(inner.load(), 4);
}

// The static schedule of GOMP_loop_static_start (what oneDNN calls): (start, end, incr, chunk) -> per thread, the
// [begin, end) pieces in order.
std::map<int, std::vector<std::pair<long, long>>> StaticPieces(int threads, long start, long end, long incr,
                                                               long chunk) {
  std::map<int, std::vector<std::pair<long, long>>> pieces;
  std::vector<std::vector<std::pair<long, long>>> per(threads);
  struct Args {
    std::vector<std::vector<std::pair<long, long>>>* per;
    long start, end, incr, chunk;
  } args{&per, start, end, incr, chunk};
  GOMP_parallel_start(
      [](void* p) {
        auto& a = *static_cast<Args*>(p);
        long b, e;
        auto& mine = (*a.per)[omp_get_thread_num()];
        for (bool more = GOMP_loop_static_start(a.start, a.end, a.incr, a.chunk, &b, &e); more;
             more = GOMP_loop_static_next(&b, &e))
          mine.push_back({b, e});
        GOMP_loop_end_nowait();
      },
      &args, threads);
  {
    auto& mine = per[0];
    long b, e;
    for (bool more = GOMP_loop_static_start(start, end, incr, chunk, &b, &e); more; more = GOMP_loop_static_next(&b, &e))
      mine.push_back({b, e});
    GOMP_loop_end_nowait();
  }
  GOMP_parallel_end();
  for (int t = 0; t < threads; ++t)
    if (!per[t].empty()) pieces[t] = per[t];
  return pieces;
}

TEST(OmpTeam, StaticScheduleBlockedAndChunked) {
  using P = std::vector<std::pair<long, long>>;
  // Blocked: 10 iterations on 3 threads: 4, 3, 3.
  auto blocked = StaticPieces(3, 0, 10, 1, 0);
  EXPECT_EQ(blocked[0], (P{{0, 4}}));
  EXPECT_EQ(blocked[1], (P{{4, 7}}));
  EXPECT_EQ(blocked[2], (P{{7, 10}}));
  // Chunks of 3 dealt round-robin: t0 gets 0-2 and 9, t1 3-5, t2 6-8.
  auto chunked = StaticPieces(3, 0, 10, 1, 3);
  EXPECT_EQ(chunked[0], (P{{0, 3}, {9, 10}}));
  EXPECT_EQ(chunked[1], (P{{3, 6}}));
  EXPECT_EQ(chunked[2], (P{{6, 9}}));
  // Counting down by 2 from 10 to 1 (10, 8, 6, 4, 2) on 2 threads: 3 and 2 iterations.
  auto down = StaticPieces(2, 10, 1, -2, 0);
  EXPECT_EQ(down[0], (P{{10, 4}}));
  EXPECT_EQ(down[1], (P{{4, 0}}));
  // Fewer iterations than threads; and none.
  auto few = StaticPieces(4, 5, 7, 1, 0);
  EXPECT_EQ(few.size(), 2u);
  EXPECT_EQ(few[0], (P{{5, 6}}));
  EXPECT_EQ(few[1], (P{{6, 7}}));
  EXPECT_TRUE(StaticPieces(3, 7, 7, 1, 0).empty());
}

TEST(OmpTeam, DynamicLoopsWithoutBarriersCoverEveryIterationOnce) {
  WithThreads with(2);
  constexpr int kLoops = 9, kIters = 1000;  // more loops in a row than the runtime has work-share slots
  std::vector<std::atomic<int>> hits(kLoops * kIters);
#pragma omp parallel
  {
    for (int l = 0; l < kLoops; ++l) {
#pragma omp for schedule(dynamic, 7) nowait
      for (int i = 0; i < kIters; ++i) hits[l * kIters + i]++;
    }
  }
  for (int i = 0; i < kLoops * kIters; ++i) ASSERT_EQ(hits[i].load(), 1) << "iteration " << i;
}

TEST(OmpTeam, BarrierSeparatesPhases) {
  WithThreads with(3);
  std::vector<int> value(3, 0);
  std::atomic<int> wrong{0};
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    for (int phase = 1; phase <= 50; ++phase) {
      value[t] = phase;
#pragma omp barrier
      for (int u = 0; u < 3; ++u)
        if (value[u] != phase) ++wrong;
#pragma omp barrier
    }
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST(OmpTeam, CriticalSectionsExclude) {
  WithThreads with(2);
  long counter = 0;
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < 20000; ++i) {
#pragma omp critical(osprey_team_test)
    counter += 1;
  }
  EXPECT_EQ(counter, 20000);
}

TEST(OmpTeam, SeveralApplicationThreadsRunRegionsAtOnce) {
  // Each has a pool of its own (a server's request threads).
  std::vector<std::thread> callers;
  std::vector<long> sums(4, 0);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([c, &sums] {
      omp_set_num_threads(2);
      for (int r = 0; r < 300; ++r) {
        long sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(dynamic, 16)
        for (int i = 0; i < 1000; ++i) sum += i;
        sums[c] += sum;
      }
    });
  }
  for (auto& t : callers) t.join();
  for (long s : sums) EXPECT_EQ(s, 300L * 499500);
}

TEST(OmpTeam, ThreadsThatSleptAnswerTheNextRegion) {
  // Idle past the spin and yield phases (1 ms by default), the workers sleep; a region must still get them all.
  WithThreads with(2);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::set<int> ids;
    std::atomic<int> n{0};
#pragma omp parallel
    {
#pragma omp critical(osprey_team_ids)
      ids.insert(omp_get_thread_num());
      n += 1;
    }
    EXPECT_EQ(ids, (std::set<int>{0, 1}));
    EXPECT_EQ(n.load(), 2);
  }
}

TEST(OmpTeam, AWorkerWokenAfterAnIdleGapIsKeptOffThreadZerosCpuWithItsMaskIntact) {
  // After an idle gap the worker sleeps; waking it, thread 0 leaves its own CPU out of the worker's mask for the
  // wake-up so the kernel places it elsewhere (team.cc, "Where a woken worker runs"); the worker puts its mask back
  // before it runs its part. (On 2-vCPU VMs, without this, the worker shared thread 0's CPU after 10 of 10 gaps.)
  // Where the two threads then run depends on what else the machine runs (ctest -j), so that is printed, not checked;
  // checked: every steered wake came up off the waker's CPU, and the mask is the caller's again in the region.
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  if (CPU_COUNT(&mask) < 2) GTEST_SKIP() << "one CPU in this process's mask";
  WithThreads with(2);
  const long steered_before = osprey::threads::WakesSteered();
  const long in_vain_before = osprey::threads::WakesSteeredOntoTheWakersCpu();
  int apart = 0, masks_kept = 0;
  constexpr int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    int cpu[2] = {-1, -1};
    cpu_set_t worker_mask;
    CPU_ZERO(&worker_mask);
#pragma omp parallel
    {
      const int t = omp_get_thread_num();
      if (t == 1) sched_getaffinity(0, sizeof(worker_mask), &worker_mask);
#pragma omp barrier
      cpu[t] = sched_getcpu();  // after the barrier: the worker itself runs part 1 (no part taken over)
    }
    apart += cpu[0] != cpu[1];
    masks_kept += CPU_EQUAL(&worker_mask, &mask);
  }
  const long steered = osprey::threads::WakesSteered() - steered_before;
  std::printf("%ld of %d wakes steered; the threads ran on different CPUs in %d of %d regions\n", steered, kRounds,
              apart, kRounds);
  EXPECT_EQ(masks_kept, kRounds);
  EXPECT_EQ(osprey::threads::WakesSteeredOntoTheWakersCpu() - in_vain_before, 0);
  if (steered == 0) GTEST_SKIP() << "no wake was steered: the process counted as contended throughout (busy host)";
}

TEST(OmpTeam, PartsOfThreadsNotStartedAreRunOnceByThreadZero) {
  // A caller and its pool on one CPU: when thread 0 ends its (tiny) part, the worker has mostly not run yet, and
  // thread 0 runs the worker's part as thread 1 (team.cc, "Parts taken over"). Every part must still run exactly
  // once, as its own thread number, with its own share of a static loop; regions with barriers must still finish.
  std::thread([] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // the pool's workers, started below, inherit it
    omp_set_num_threads(2);
    const long before = osprey::threads::PartsTakenOver();
    int wrong = 0;
    for (int round = 0; round < 2000; ++round) {
      int runs[2] = {0, 0};
#pragma omp parallel
      runs[omp_get_thread_num()] += 1;
      long part[2] = {0, 0};
#pragma omp parallel for schedule(static)
      for (int i = 0; i < 100; ++i) part[omp_get_thread_num()] += i;
      wrong += runs[0] != 1 || runs[1] != 1 || part[0] != 49 * 50 / 2 || part[1] != 99 * 100 / 2 - 49 * 50 / 2;
    }
    EXPECT_EQ(wrong, 0);
    const long taken = osprey::threads::PartsTakenOver() - before;
    std::printf("%ld of 4000 worker parts run by thread 0\n", taken);
    EXPECT_GT(taken, 0);
    for (int round = 0; round < 200; ++round) {
      int value[2] = {0, 0}, seen_other = 0;
#pragma omp parallel
      {
        const int t = omp_get_thread_num();
        value[t] = round + 1;
#pragma omp barrier
#pragma omp atomic
        seen_other += value[1 - t] == round + 1;
      }
      wrong += seen_other != 2;
    }
    EXPECT_EQ(wrong, 0);
    // Four threads on the CPU: any thread that has finished takes over; each of the four parts still runs once.
    omp_set_num_threads(4);
    for (int round = 0; round < 1000; ++round) {
      int runs[4] = {0, 0, 0, 0};
#pragma omp parallel
      {
#pragma omp atomic
        runs[omp_get_thread_num()] += 1;
      }
      long part[4] = {0, 0, 0, 0};
#pragma omp parallel for schedule(static)
      for (int i = 0; i < 100; ++i) part[omp_get_thread_num()] += 1;
      for (int t = 0; t < 4; ++t) wrong += runs[t] != 1 || part[t] != 25;
    }
    EXPECT_EQ(wrong, 0);
  }).join();
}

TEST(OmpTeam, AChildOfForkRunsRegions) {
  // The child has none of the parent's worker threads; it must start its own rather than wait for them.
  WithThreads with(2);
  std::atomic<int> n{0};
#pragma omp parallel
  n += 1;
  ASSERT_EQ(n.load(), 2);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);  // a hang ends the child with SIGALRM
    std::atomic<int> m{0};
#pragma omp parallel
    m += omp_get_num_threads();
    _exit(m.load() == 4 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(OmpTeam, OneDnnRunsItsRegionsHere) {
  WithThreads with(2);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::dims dims{1, 64, 128, 128};
  dnnl::memory src({dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::nchw}, engine);
  dnnl::memory dst({dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::nhwc}, engine);
  float* s = static_cast<float*>(src.get_data_handle());
  const long n = 64L * 128 * 128;
  for (long i = 0; i < n; ++i) s[i] = static_cast<float>(i % 1000);
  const long before = osprey::threads::RegionsStarted();
  dnnl::reorder(src, dst).execute(stream, src, dst);
  stream.wait();
  EXPECT_GT(osprey::threads::RegionsStarted(), before);
  // And it computed the transpose: dst[h][w][c] = src[c][h][w].
  const float* d = static_cast<const float*>(dst.get_data_handle());
  for (long c : {0L, 5L, 63L})
    for (long h : {0L, 77L, 127L})
      for (long w : {0L, 1L, 127L}) EXPECT_EQ(d[(h * 128 + w) * 64 + c], s[(c * 128 + h) * 128 + w]);
}

}  // namespace
