// osprey's OpenMP runtime: the part of GNU libgomp's ABI that osprey and oneDNN call, with a wait policy of our own.
//
// Why (docs/performance.md, "Sixteenth session"): libgomp's idle threads spin GOMP_SPINCOUNT `pause`s, then sleep on
// a futex. On a VM a sleeping vCPU takes 50-150 us to wake, so at batch 1 one late thread starts a cascade: the
// other spins out at the next barrier, sleeps, and is woken late in turn; MobileNetV2 slept ~7 times per inference.
// Spinning longer (GOMP_SPINCOUNT=10000) removed it (1.1-1.17x faster quiet) but burnt the cores other processes
// needed (2-4x slower with two servers on two cores). Here a waiting thread spins briefly, then yields the CPU in a
// loop (sched_yield: free when nothing else is runnable, the vCPU stays awake; another process's thread runs at once
// when there is one), and sleeps on a futex only after OSPREY_OMP_YIELD_US; a waker calls futex_wake only when a
// thread sleeps (libgomp wakes at every barrier). Beside CPU-bound processes a yielding thread waits for their whole
// time slice, so once a wait finds it lost its CPU that long, the process's waits stay short for a while (Policy).
//
// How it takes over: the executables link this object and export its symbols (CMakeLists.txt), so the dynamic linker
// binds libdnnl's GOMP_* / omp_* references to them before libgomp's, and the static linker binds osprey's own. The
// Python module links and exports it too; there a libgomp already in the process's global scope (loaded with
// RTLD_GLOBAL before osprey) comes first and takes both libdnnl's calls and the module's.
// OSPREY_OMP_RUNTIME=libgomp forwards every entry point to libgomp instead (for comparisons, or as an escape hatch).
//
// Semantics kept (those osprey and oneDNN rely on): a team per region from a pool of threads owned by the calling
// thread (several application threads run regions at once, each with its own pool); nested regions run on one thread
// (max-active-levels 1) with omp_in_parallel() true; the nthreads ICV per thread, inherited by a team; barriers;
// static (blocked or chunked) and dynamic loop work-sharing, nowait allowed; named critical sections.
#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/timing_context.h"
#include "threads/team.h"

namespace {

using Clock = std::chrono::steady_clock;

// ---- wait policy ------------------------------------------------------------------------------------------------

struct Policy {
  long spin_ns = 20'000;     // pause-spin this long (a quick reply costs no syscall)
  long yield_ns = 1'000'000; // then sched_yield until this long since the wait began, then sleep
  // A yield or a spin that came back this much later lost the CPU to another thread for a time slice: for the next
  // contended_for_ns every wait of the process spins at most contended_spin_ns, then sleeps (a woken thread is
  // scheduled ahead of CPU-bound ones; a spinning or yielding one waits for their slice to end).
  long preempted_ns = 500'000;
  long contended_for_ns = 200'000'000;
  long contended_spin_ns = 25'000;
  bool use_libgomp = false;
};

long EnvMicros(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long us = std::strtol(v, &end, 10);
  if (*end || us < 0 || us > 10'000'000) {
    std::fprintf(stderr, "osprey: ignoring %s=%s (want microseconds, 0..10000000)\n", name, v);
    return fallback;
  }
  return us * 1000;
}

const Policy& GetPolicy() {
  static const Policy policy = [] {
    Policy p;
    const char* rt = std::getenv("OSPREY_OMP_RUNTIME");
    p.use_libgomp = rt && std::strcmp(rt, "libgomp") == 0;
    if (const char* w = std::getenv("OMP_WAIT_POLICY")) {
      if (strcasecmp(w, "passive") == 0) p.spin_ns = p.yield_ns = 0;
      if (strcasecmp(w, "active") == 0) p.spin_ns = p.yield_ns = 200'000'000;
    }
    p.spin_ns = EnvMicros("OSPREY_OMP_SPIN_US", p.spin_ns);
    p.yield_ns = std::max(p.spin_ns, EnvMicros("OSPREY_OMP_YIELD_US", p.yield_ns));
    return p;
  }();
  return policy;
}

void FutexWait(std::atomic<uint32_t>& word, uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// What OSPREY_OMP_DEBUG=1 prints at exit.
struct Stats {
  std::atomic<long> regions{0}, sleeps{0}, contended{0}, taken_over{0}, steered{0}, steered_in_vain{0};
  ~Stats() {
    const char* d = std::getenv("OSPREY_OMP_DEBUG");
    if (d && d[0] == '1' && regions.load() + sleeps.load() > 0)
      std::fprintf(stderr,
                   "osprey: openmp: %ld regions, %ld waits ended asleep, %ld times the CPU was lost, %ld threads' "
                   "parts run by another thread of the team, %ld sleeping workers woken off the waker's CPU\n",
                   regions.load(), sleeps.load(), contended.load(), taken_over.load(), steered.load());
  }
} stats;

// Where a woken worker runs. A thread woken from a futex while its waker runs is often placed on the waker's CPU
// although another is idle (seen on 2-vCPU VMs after an idle gap of 20 ms or more: a halted vCPU counts as
// preempted, not idle, so the scheduler's idle search passes it over). The two threads of a team then share one CPU
// until the scheduler parts them, milliseconds later: thread 0 takes over the worker's parts, every region runs on
// one thread, and a request after an idle gap took twice as long (MobileNetV2 3.3 -> 7.0 ms; docs/performance.md,
// "Twenty-eighth session"). So a thread that wakes a worker asleep on its start signal first leaves its own CPU out
// of the worker's affinity mask (the kernel then places it elsewhere), and the worker puts its mask back as soon as
// it runs. Not while the process's waits are short because its threads lost their CPUs (Policy): the other CPUs
// are busy then, and a worker placed behind a CPU-bound process waits for its time slice (ResNet-50 beside two
// such processes: 63 -> 95 ms when every wake was steered). Only the waker's CPU is ever left out, so a user's mask
// (taskset, cpusets) is kept; a mask of one CPU, or one without that CPU, is left alone. OSPREY_OMP_STEER=0 turns
// it off (comparisons).
bool NoSteer() {
  static const bool off = [] {
    const char* v = std::getenv("OSPREY_OMP_STEER");
    return v && std::strcmp(v, "0") == 0;
  }();
  return off;
}

// A word that waiters watch for a change, and the count of those asleep on it.
struct Signal {
  std::atomic<uint32_t> word{0};
  std::atomic<int> sleepers{0};
  // When one thread only ever waits here (a worker's start signal): its thread id, its affinity mask as it was when
  // it went to sleep, and whether a waker left a CPU out of it (see "Where a woken worker runs").
  std::atomic<pid_t> owner{0};
  std::atomic<bool> owner_steered{false};
  cpu_set_t owner_mask{};
  int steered_from = -1;  // the waker's CPU, left out of the owner's mask

  uint32_t Load() const { return word.load(std::memory_order_acquire); }
  // Changes the word; wakes sleepers (seq_cst on both sides: a waiter counts itself, then the kernel checks the word).
  // One publisher at a time.
  void Publish() {
    const bool wake = sleepers.load(std::memory_order_seq_cst) > 0;
    if (wake) SteerOwner();
    word.fetch_add(1, std::memory_order_seq_cst);
    if (wake || sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(word);
  }
  // Before the owner, asleep, is woken: its mask without this CPU, unless there is no other to go to.
  void SteerOwner() {
    const pid_t tid = owner.load(std::memory_order_relaxed);
    if (tid == 0 || NoSteer() || owner_steered.load() || NowNs() < contended_until.load(std::memory_order_relaxed))
      return;
    // owner_mask: the owner's own, read by it before it counted itself asleep (one system call here, not two, per
    // sleeping worker: a team of 63 wakes on a 64-core machine).
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &owner_mask) || CPU_COUNT(&owner_mask) < 2) return;
    cpu_set_t others = owner_mask;
    CPU_CLR(cpu, &others);
    if (sched_setaffinity(tid, sizeof(others), &others) != 0) return;
    steered_from = cpu;
    owner_steered.store(true, std::memory_order_seq_cst);  // before the word changes: the owner reads it after
    stats.steered.fetch_add(1, std::memory_order_relaxed);
  }
  // Returns once the word is not `seen`.
  void WaitChange(uint32_t seen) {
    if (Load() != seen) return;
    const Policy& p = GetPolicy();
    const int64_t start = NowNs();
    const bool contended = start < contended_until.load(std::memory_order_relaxed);
    const int64_t limit = contended ? std::min(p.spin_ns, p.contended_spin_ns) : p.yield_ns;
    int64_t last = start;
    for (int i = 1;; ++i) {
      if (Load() != seen) return;
      if ((i & 31) == 0) {
        const int64_t now = NowNs();
        if (now - last > p.preempted_ns) {  // another thread had this CPU for a time slice: the cores are busy
          contended_until.store(now + p.contended_for_ns, std::memory_order_relaxed);
          stats.contended.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        last = now;
        if (now - start >= limit) break;
        if (now - start >= p.spin_ns) sched_yield();
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    stats.sleeps.fetch_add(1, std::memory_order_relaxed);
    // The owner (the only thread that waits on an owned signal) leaves its mask for SteerOwner; an empty one on
    // failure, which SteerOwner then leaves alone.
    if (owner.load(std::memory_order_relaxed) != 0 && sched_getaffinity(0, sizeof(owner_mask), &owner_mask) != 0)
      CPU_ZERO(&owner_mask);
    sleepers.fetch_add(1, std::memory_order_seq_cst);  // publishes owner_mask to a waker that sees it
    while (word.load(std::memory_order_seq_cst) == seen) FutexWait(word, seen);
    sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (owner_steered.exchange(false, std::memory_order_seq_cst)) {
      if (sched_getcpu() == steered_from) stats.steered_in_vain.fetch_add(1, std::memory_order_relaxed);  // never
      sched_setaffinity(0, sizeof(owner_mask), &owner_mask);
    }
  }

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
  // Until when the waits of this process keep short: set when a waiting thread found it had lost its CPU.
  static inline std::atomic<int64_t> contended_until{0};
};

bool NoTakeOver() {
  static const bool off = [] {
    const char* v = std::getenv("OSPREY_OMP_TAKE_OVER");
    return v && std::strcmp(v, "0") == 0;
  }();
  return off;
}

// ---- teams ------------------------------------------------------------------------------------------------------

constexpr int kMaxThreads = 256;
constexpr int kWorkShares = 4;  // loops a thread may run ahead of the slowest (nowait) before it waits

long TripCount(long start, long end, long incr) {
  if (incr > 0) return end > start ? (end - start + incr - 1) / incr : 0;
  return start > end ? (start - end - incr - 1) / -incr : 0;
}

struct WorkShare {
  std::mutex mu;
  long seq = -1;      // which construct of the region uses this slot
  int remaining = 0;  // threads that have not ended it
  long start = 0, incr = 1, chunk = 1, trip = 0;
  std::atomic<long> next{0};

  void Init(long s, long end, long inc, long c, long sequence, int threads) {
    seq = sequence;
    remaining = threads;
    start = s;
    incr = inc;
    chunk = std::max(1L, c);
    trip = TripCount(s, end, inc);
    next.store(0, std::memory_order_relaxed);
  }
};

// The loop of a combined `parallel for` (GOMP_parallel_loop_*): work-shared from the region's start.
struct Loop {
  enum Kind { kNone, kStatic, kDynamic } kind = kNone;
  long start = 0, end = 0, incr = 1, chunk = 0;
};

constexpr unsigned kFloatStatusBits = 0x3F;  // MXCSR's sticky exception flags (not a mode)

struct Team {
  int n = 1;
  int active_levels = 1;  // of the team's threads
  int icv = 1;            // the nthreads ICV the team's threads inherit
  Loop loop;
  void (*fn)(void*) = nullptr;
  void* data = nullptr;
  std::atomic<int> bar_count{0};
  Signal bar;
  WorkShare ws[kWorkShares];
  unsigned float_mode = 0x1F80;  // the starting thread's MXCSR control bits (rounding, FTZ, DAZ, masks)

  // Before the region starts (no thread of the team runs), on the thread that starts it.
  void Reset(int threads, int levels, int icv_value, const Loop& l) {
#if defined(__x86_64__)
    float_mode = _mm_getcsr() & ~kFloatStatusBits;
#endif
    n = threads;
    active_levels = levels;
    icv = icv_value;
    loop = l;
    bar_count.store(0, std::memory_order_relaxed);
    for (WorkShare& w : ws) {
      w.seq = -1;
      w.remaining = 0;
    }
    if (loop.kind == Loop::kDynamic) ws[0].Init(loop.start, loop.end, loop.incr, loop.chunk, 0, n);
  }
};

struct ThreadState {
  Team* team = nullptr;  // innermost region's team (a region of one has one too)
  int tid = 0;
  int active_levels = 0;
  int icv = 0;  // 0: not set yet (DefaultThreads)
  // The loop this thread is in.
  long ws_seq = 0;  // constructs met in this region
  WorkShare* ws = nullptr;
  long s_start = 0, s_incr = 1, s_chunk = 0, s_trip = 0, s_next_chunk = 0;

  void StartStatic(long start, long end, long incr, long chunk) {
    ++ws_seq;
    ws = nullptr;
    s_start = start;
    s_incr = incr;
    s_chunk = chunk;
    s_trip = TripCount(start, end, incr);
    s_next_chunk = 0;
  }
};
thread_local ThreadState ts;

// Makes the calling thread thread `tid` of `team`. A worker takes the floating-point mode of the thread that started
// the region (osprey's plans flush subnormals to zero: core/float_env.h), as a thread made then would have.
void EnterTeam(Team* team, int tid) {
#if defined(__x86_64__)
  const unsigned csr = _mm_getcsr();
  if ((csr & ~kFloatStatusBits) != team->float_mode) _mm_setcsr((csr & kFloatStatusBits) | team->float_mode);
#endif
  ts = ThreadState{};
  ts.team = team;
  ts.tid = tid;
  ts.active_levels = team->active_levels;
  ts.icv = team->icv;
  if (team->loop.kind == Loop::kStatic) ts.StartStatic(team->loop.start, team->loop.end, team->loop.incr,
                                                       team->loop.chunk);
  if (team->loop.kind == Loop::kDynamic) {
    ts.ws_seq = 1;
    ts.ws = &team->ws[0];
  }
}

int DefaultThreads() {
  static const int n = [] {
    if (const char* v = std::getenv("OMP_NUM_THREADS")) {
      const int k = std::atoi(v);  // first entry of a list
      if (k > 0) return std::min(k, kMaxThreads);
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}
int Icv() { return ts.icv > 0 ? ts.icv : DefaultThreads(); }

// Threads owned by one application thread; its regions run on them. Each worker has its own start signal, so a
// region of fewer threads leaves the others asleep and untouched.
//
// Parts taken over: when a thread has finished its part of a region and a worker has not yet started its own (it
// is descheduled beside busy processes, or still waking from a futex), the thread runs that part itself, as that
// thread number, instead of waiting for it; the worker, when it runs, finds its part taken and waits for the next
// region. Each part runs exactly once and as the same thread number, so results are identical to a normal run (no
// other plan, no other partition). It is safe because a thread can only finish its part when the region holds no
// barrier or other wait for the missing thread (it would still be waiting there), so the taken-over part meets
// none either. On an idle machine a spinning worker starts within a microsecond and nothing changes; beside busy
// processes a region costs at worst its work on one thread instead of a scheduler time slice.
// OSPREY_OMP_TAKE_OVER=0 turns it off (comparisons).
class Pool {
 public:
  ~Pool() {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& w : workers_) w->start.Publish();
    for (auto& w : workers_) w->thread.join();
  }
  // Starts fn on threads 1..n-1 (the caller then runs it as thread 0, and Join()s).
  Team* Begin(int n, void (*fn)(void*), void* data, const Loop& loop) {
    while (static_cast<int>(workers_.size()) < n - 1) {
      auto w = std::make_unique<Worker>();
      const int index = static_cast<int>(workers_.size()) + 1;
      try {
        w->thread = std::thread([this, raw = w.get(), index] { WorkerLoop(*raw, index); });
      } catch (const std::system_error& e) {  // no more threads (limits): run on those there are, as OpenMP allows
        static std::once_flag said;
        std::call_once(said, [&] { std::fprintf(stderr, "osprey: openmp: cannot start a thread (%s)\n", e.what()); });
        n = static_cast<int>(workers_.size()) + 1;
        break;
      }
      workers_.push_back(std::move(w));
    }
    team_.Reset(n, ts.active_levels + 1, Icv(), loop);
    team_.fn = fn;
    team_.data = data;
    running_.store(n - 1, std::memory_order_relaxed);
    for (int i = 0; i < n - 1; ++i) {
      workers_[i]->taken.store(false, std::memory_order_release);
      workers_[i]->start.Publish();
    }
    return &team_;
  }
  // After the caller's own part (thread 0): runs the part of each thread that has not started it yet, then waits for
  // the others. See "Parts taken over" above Pool.
  void Join() {
    TakeOverUnstarted();
    while (running_.load(std::memory_order_acquire) != 0) {
      const uint32_t seen = done_.Load();
      if (running_.load(std::memory_order_acquire) == 0) break;
      done_.WaitChange(seen);
    }
  }

 private:
  struct Worker {
    std::thread thread;
    Signal start;
    std::atomic<bool> taken{true};  // this region's part of the worker's thread number has been started (by anyone)
  };
  // Runs, each as its thread number, the parts of the region that no thread has started. A worker calls it before
  // it counts its own part done, so the region (and workers_) cannot change under it.
  void TakeOverUnstarted() {
    if (NoTakeOver()) return;
    const ThreadState mine = ts;
    for (int i = 1; i < team_.n; ++i) {
      if (workers_[i - 1]->taken.exchange(true, std::memory_order_acq_rel)) continue;
      EnterTeam(&team_, i);
      team_.fn(team_.data);
      ts = mine;
      stats.taken_over.fetch_add(1, std::memory_order_relaxed);
      if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.Publish();
    }
  }
  void WorkerLoop(Worker& self, int index) {
    self.start.owner.store(static_cast<pid_t>(syscall(SYS_gettid)), std::memory_order_relaxed);
    uint32_t seen = 0;
    for (;;) {
      self.start.WaitChange(seen);
      seen = self.start.Load();
      if (stop_.load(std::memory_order_relaxed)) return;
      if (self.taken.exchange(true, std::memory_order_acq_rel)) continue;  // run by thread 0 (or already by us)
      EnterTeam(&team_, index);
      team_.fn(team_.data);
      TakeOverUnstarted();
      ts = ThreadState{};
      if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.Publish();
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  Team team_;
  Signal done_;
  std::atomic<int> running_{0};
  std::atomic<bool> stop_{false};
};

thread_local std::unique_ptr<Pool> pool;

// A child of fork() has only the forking thread: its pool's workers are gone, so it forgets the pool (leaked: its
// threads cannot be joined) and starts a new one at its first region. (libgomp hangs there.)
[[maybe_unused]] const bool fork_handler_installed = [] {
  pthread_atfork(nullptr, nullptr, [] { (void)pool.release(); });
  return true;
}();
thread_local std::vector<ThreadState> saved;  // states of the regions this thread started (nesting)
thread_local std::vector<std::unique_ptr<Team>> solo_teams;

// Enters a region of `requested` threads (0: the ICV); the caller becomes its thread 0.
void ParallelBegin(void (*fn)(void*), void* data, unsigned requested, const Loop& loop = {}) {
  int n = requested ? static_cast<int>(std::min<unsigned>(requested, kMaxThreads)) : Icv();
  if (ts.active_levels > 0) n = 1;  // nested: max-active-levels is 1
  saved.push_back(ts);
  Team* team;
  if (n == 1) {
    while (solo_teams.size() < saved.size()) solo_teams.push_back(std::make_unique<Team>());
    team = solo_teams[saved.size() - 1].get();
    team->Reset(1, ts.active_levels, Icv(), loop);
  } else {
    if (!pool) pool = std::make_unique<Pool>();
    stats.regions.fetch_add(1, std::memory_order_relaxed);
    team = pool->Begin(n, fn, data, loop);
  }
  EnterTeam(team, 0);
}

void ParallelEnd() {
  Team* team = ts.team;
  if (team && team->n > 1) pool->Join();
  ts = saved.back();
  saved.pop_back();
}

void RunRegion(void (*fn)(void*), void* data, unsigned requested, const Loop& loop) {
  ParallelBegin(fn, data, requested, loop);
  fn(data);
  ParallelEnd();
}

void Barrier() {
  Team* team = ts.team;
  if (!team || team->n == 1) return;
  const uint32_t seen = team->bar.Load();
  if (team->bar_count.fetch_add(1, std::memory_order_acq_rel) + 1 == team->n) {
    team->bar_count.store(0, std::memory_order_relaxed);
    team->bar.Publish();
  } else {
    team->bar.WaitChange(seen);
  }
}

bool StaticNext(long* istart, long* iend) {
  const Team* team = ts.team;
  const long n = team ? team->n : 1;
  const long tid = ts.tid;
  long first, count;
  if (ts.s_chunk <= 0) {  // one block per thread, the remainder spread over the first threads
    if (ts.s_next_chunk > 0) return false;
    const long q = ts.s_trip / n, r = ts.s_trip % n;
    first = tid * q + std::min(tid, r);
    count = q + (tid < r ? 1 : 0);
  } else {  // chunks dealt round-robin
    first = (ts.s_next_chunk * n + tid) * ts.s_chunk;
    count = std::min(ts.s_chunk, ts.s_trip - first);
  }
  ++ts.s_next_chunk;
  if (count <= 0 || first >= ts.s_trip) return false;
  *istart = ts.s_start + first * ts.s_incr;
  *iend = ts.s_start + (first + count) * ts.s_incr;
  return true;
}

bool DynamicNext(long* istart, long* iend) {
  WorkShare* w = ts.ws;
  if (!w) return false;
  const long first = w->next.fetch_add(w->chunk, std::memory_order_relaxed);
  if (first >= w->trip) return false;
  *istart = w->start + first * w->incr;
  *iend = w->start + std::min(first + w->chunk, w->trip) * w->incr;
  return true;
}

void DynamicStart(long start, long end, long incr, long chunk) {
  Team* team = ts.team;
  thread_local Team none;  // a loop outside any region: a team of one of its own
  if (!team) team = &none;
  const long seq = ts.ws_seq++;
  WorkShare& w = team->ws[seq % kWorkShares];
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (w.seq == seq) break;
      if (w.remaining == 0) {  // free: the previous construct in this slot has been ended by every thread
        w.Init(start, end, incr, chunk, seq, team->n);
        break;
      }
    }
    sched_yield();
  }
  ts.ws = &w;
}

void LoopEnd() {
  if (ts.ws) {
    std::lock_guard<std::mutex> lock(ts.ws->mu);
    --ts.ws->remaining;
  }
  ts.ws = nullptr;
}

std::mutex& CriticalMutex(const void* name) {
  static std::mutex table[64];
  return table[(reinterpret_cast<uintptr_t>(name) >> 4) % 64];
}

// libgomp's functions, for OSPREY_OMP_RUNTIME=libgomp.
template <class F>
F Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    std::fprintf(stderr, "osprey: OSPREY_OMP_RUNTIME=libgomp but %s is not in libgomp\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}
#define OSPREY_FORWARD(name, type, ...)                                 \
  if (GetPolicy().use_libgomp) {                                      \
    static const auto real = Real<type>(#name);                        \
    return real(__VA_ARGS__);                                          \
  }

}  // namespace

namespace osprey::threads {
long RegionsStarted() { return stats.regions.load(std::memory_order_relaxed); }
long PartsTakenOver() { return stats.taken_over.load(std::memory_order_relaxed); }
long WakesSteered() { return stats.steered.load(std::memory_order_relaxed); }
long WakesSteeredOntoTheWakersCpu() { return stats.steered_in_vain.load(std::memory_order_relaxed); }
bool UsingLibgomp() { return GetPolicy().use_libgomp; }
const char* Describe() {
  static const std::string text = [] {
    const Policy& p = GetPolicy();
    if (p.use_libgomp) return std::string("libgomp (OSPREY_OMP_RUNTIME=libgomp)");
    char buf[160];
    std::snprintf(buf, sizeof buf, "osprey runtime: spin %ld us, yield until %ld us, then sleep", p.spin_ns / 1000,
                  p.yield_ns / 1000);
    return std::string(buf);
  }();
  return text.c_str();
}

// The tuner's timing context (core/timing_context.h) for this runtime: "" under its default waits, else what differs;
// under libgomp core's own text for libgomp: with OSPREY_OMP_RUNTIME=libgomp, and where a libgomp in the process's
// global scope took the entry points (the Python module imported after PyTorch): the dynamic linker then binds
// GOMP_parallel to libgomp's, as it bound libdnnl's calls when this object was loaded. Set before main (in the module:
// when it is loaded, after its relocations), before any kernel is timed.
// (Compared by the object that holds it: in a shared object the address of an exported function is the bound one.)
bool EntryPointsAreOurs() {
  Dl_info bound{}, ours{};
  void* f = dlsym(RTLD_DEFAULT, "GOMP_parallel");
  return f != nullptr && dladdr(f, &bound) != 0 && dladdr(reinterpret_cast<void*>(&GetPolicy), &ours) != 0 &&
         bound.dli_fbase == ours.dli_fbase;
}
const bool g_timing_context_set = [] {
  const Policy& p = GetPolicy();
  if (p.use_libgomp || !EntryPointsAreOurs()) return false;
  const Policy defaults;
  std::string text = p.spin_ns != defaults.spin_ns || p.yield_ns != defaults.yield_ns ? Describe() : "";
  if (NoTakeOver()) text += " no-take-over";
  if (NoSteer()) text += " no-steer";
  SetTimingContext(std::move(text));
  return true;
}();
}  // namespace osprey::threads

// Default visibility: a shared object that links this (a Python module built with hidden symbols) exports them too.
#pragma GCC visibility push(default)
extern "C" {

int omp_get_max_threads() {
  OSPREY_FORWARD(omp_get_max_threads, int (*)());
  return Icv();
}
void omp_set_num_threads(int n) {
  OSPREY_FORWARD(omp_set_num_threads, void (*)(int), n);
  ts.icv = std::clamp(n, 1, kMaxThreads);
}
int omp_get_num_threads() {
  OSPREY_FORWARD(omp_get_num_threads, int (*)());
  return ts.team ? ts.team->n : 1;
}
int omp_get_thread_num() {
  OSPREY_FORWARD(omp_get_thread_num, int (*)());
  return ts.tid;
}
int omp_in_parallel() {
  OSPREY_FORWARD(omp_in_parallel, int (*)());
  return ts.active_levels > 0;
}

void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  OSPREY_FORWARD(GOMP_parallel, void (*)(void (*)(void*), void*, unsigned, unsigned), fn, data, num_threads, flags);
  RunRegion(fn, data, num_threads, Loop{});
}
// Combined `parallel for`: the loop is work-shared from the start; fn calls only the *_next functions.
#define OSPREY_PARALLEL_LOOP(name, kind)                                                                          \
  void name(void (*fn)(void*), void* data, unsigned num_threads, long start, long end, long incr, long chunk,    \
            unsigned flags) {                                                                                   \
    OSPREY_FORWARD(name, void (*)(void (*)(void*), void*, unsigned, long, long, long, long, unsigned), fn, data, \
                   num_threads, start, end, incr, chunk, flags);                                                \
    RunRegion(fn, data, num_threads, Loop{kind, start, end, incr, chunk});                                      \
  }
OSPREY_PARALLEL_LOOP(GOMP_parallel_loop_nonmonotonic_dynamic, Loop::kDynamic)
OSPREY_PARALLEL_LOOP(GOMP_parallel_loop_dynamic, Loop::kDynamic)
OSPREY_PARALLEL_LOOP(GOMP_parallel_loop_static, Loop::kStatic)
#undef OSPREY_PARALLEL_LOOP
void GOMP_parallel_start(void (*fn)(void*), void* data, unsigned num_threads) {
  OSPREY_FORWARD(GOMP_parallel_start, void (*)(void (*)(void*), void*, unsigned), fn, data, num_threads);
  ParallelBegin(fn, data, num_threads);
}
void GOMP_parallel_end() {
  OSPREY_FORWARD(GOMP_parallel_end, void (*)());
  ParallelEnd();
}
void GOMP_barrier() {
  OSPREY_FORWARD(GOMP_barrier, void (*)());
  Barrier();
}

bool GOMP_loop_static_start(long start, long end, long incr, long chunk, long* istart, long* iend) {
  OSPREY_FORWARD(GOMP_loop_static_start, bool (*)(long, long, long, long, long*, long*), start, end, incr, chunk,
                 istart, iend);
  ts.StartStatic(start, end, incr, chunk);
  return StaticNext(istart, iend);
}
bool GOMP_loop_static_next(long* istart, long* iend) {
  OSPREY_FORWARD(GOMP_loop_static_next, bool (*)(long*, long*), istart, iend);
  return StaticNext(istart, iend);
}
// schedule(dynamic): GCC calls the nonmonotonic pair for a plain `dynamic`, the monotonic one when asked to.
#define OSPREY_DYNAMIC_LOOP(start_name, next_name)                                                             \
  bool start_name(long start, long end, long incr, long chunk, long* istart, long* iend) {                    \
    OSPREY_FORWARD(start_name, bool (*)(long, long, long, long, long*, long*), start, end, incr, chunk, istart, \
                   iend);                                                                                      \
    DynamicStart(start, end, incr, chunk);                                                                     \
    return DynamicNext(istart, iend);                                                                          \
  }                                                                                                            \
  bool next_name(long* istart, long* iend) {                                                                   \
    OSPREY_FORWARD(next_name, bool (*)(long*, long*), istart, iend);                                           \
    return DynamicNext(istart, iend);                                                                          \
  }
OSPREY_DYNAMIC_LOOP(GOMP_loop_nonmonotonic_dynamic_start, GOMP_loop_nonmonotonic_dynamic_next)
OSPREY_DYNAMIC_LOOP(GOMP_loop_dynamic_start, GOMP_loop_dynamic_next)
#undef OSPREY_DYNAMIC_LOOP
void GOMP_loop_end_nowait() {
  OSPREY_FORWARD(GOMP_loop_end_nowait, void (*)());
  LoopEnd();
}
void GOMP_loop_end() {
  OSPREY_FORWARD(GOMP_loop_end, void (*)());
  LoopEnd();
  Barrier();
}

void GOMP_critical_name_start(void** name) {
  OSPREY_FORWARD(GOMP_critical_name_start, void (*)(void**), name);
  CriticalMutex(name).lock();
}
void GOMP_critical_name_end(void** name) {
  OSPREY_FORWARD(GOMP_critical_name_end, void (*)(void**), name);
  CriticalMutex(name).unlock();
}
void GOMP_critical_start() {
  OSPREY_FORWARD(GOMP_critical_start, void (*)());
  CriticalMutex(nullptr).lock();
}
void GOMP_critical_end() {
  OSPREY_FORWARD(GOMP_critical_end, void (*)());
  CriticalMutex(nullptr).unlock();
}

}  // extern "C"
#pragma GCC visibility pop
