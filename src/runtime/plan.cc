#include <omp.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/float_env.h"
#include "kernels/cpu/thread_scratch.h"
#include "ops/activation.h"
#include "runtime/arena_pool.h"
#include "runtime/plan_impl.h"

namespace osprey {

std::shared_ptr<Buffer> OutputPool::Take(const std::shared_ptr<OutputPool>& pool, int slot, size_t bytes,
                                         const std::shared_ptr<MemoryAccount>& account) {
  std::shared_ptr<Buffer> block;
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    auto& idle = pool->idle_[slot];
    for (auto it = idle.begin(); it != idle.end(); ++it)
      if (it->buffer->size() >= bytes) {
        block = std::move(it->buffer);
        idle.erase(it);
        break;
      }
  }
  if (!block) block = Allocator::Host().Allocate(bytes, account);
  Buffer* raw = block.get();
  std::weak_ptr<OutputPool> weak = pool;
  // The handle shares `block`'s lifetime with the tensors made from it; when the last goes, the block goes back.
  return std::shared_ptr<Buffer>(raw, [weak, block, slot](Buffer*) mutable {
    if (auto alive = weak.lock()) alive->Give(slot, std::move(block));
  });
}

void OutputPool::Give(int slot, std::shared_ptr<Buffer> buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& idle = idle_[slot];
  if (idle.size() < kMaxIdlePerSlot) idle.push_back({std::move(buffer), std::chrono::steady_clock::now()});
}

size_t OutputPool::Trim(double idle_seconds) {
  std::vector<std::shared_ptr<Buffer>> dropped;  // freed outside the lock
  size_t bytes = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [slot, idle] : idle_) bytes += TakeIdle(idle, idle_seconds, &dropped);
  return bytes;
}

Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::~Plan() = default;

int64_t Plan::heap_bytes() const { return impl_->heap_bytes.load(); }

namespace {
thread_local int g_heap_measures = 0;  // HeapMeasures alive on this thread
std::atomic<int64_t> g_heap_readings{0};

// Per account, per phase: the last kSampled measures (a ring: `next` is the oldest), how many of them were taken (up to
// kSampled) and how many estimates since the last. Keyed by the account's address; an entry whose account has gone (a
// later account there) starts again.
struct HeapSamples {
  struct Phase {
    int64_t last[HeapMeasure::kSampled] = {};
    int count = 0, next = 0, estimated = 0;
    int64_t Mean() const {
      int64_t sum = 0;
      for (int64_t v : last) sum += v;
      return sum / HeapMeasure::kSampled;
    }
  };
  std::weak_ptr<MemoryAccount> account;
  Phase phase[2];
};
std::mutex g_samples_mu;
std::unordered_map<const MemoryAccount*, HeapSamples>& Samples() {
  static auto* samples = new std::unordered_map<const MemoryAccount*, HeapSamples>();  // outlives exit-time plans
  return *samples;
}

HeapSamples& SamplesOf(const std::shared_ptr<MemoryAccount>& account) {  // under g_samples_mu
  auto& all = Samples();
  HeapSamples& s = all[account.get()];
  if (s.account.lock() != account) s = HeapSamples{account};
  if (all.size() > 64)  // drop the entries of accounts that are gone
    for (auto it = all.begin(); it != all.end();) it = it->second.account.expired() ? all.erase(it) : std::next(it);
  return all[account.get()];
}

int64_t ReadUntrackedHeap() {
  g_heap_readings.fetch_add(1, std::memory_order_relaxed);
  return Allocator::Host().UntrackedHeapBytes();
}
}  // namespace

HeapMeasure::HeapMeasure(bool wanted, const std::shared_ptr<MemoryAccount>& account, Phase phase)
    : account_(account), phase_(phase) {
  if (wanted && g_heap_measures == 0) {
    if (account) {
      std::lock_guard<std::mutex> lock(g_samples_mu);
      HeapSamples::Phase& s = SamplesOf(account).phase[static_cast<int>(phase)];
      if (s.count >= kSampled && s.estimated < kEstimatesPerMeasure) {
        estimate_ = s.Mean();
        ++s.estimated;
      }
    }
    if (estimate_ < 0) before_ = ReadUntrackedHeap();
  }
  ++g_heap_measures;
}

HeapMeasure::~HeapMeasure() { --g_heap_measures; }

int64_t HeapMeasure::Grown() const {
  if (estimate_ >= 0) return estimate_;
  if (before_ < 0) return 0;
  const int64_t grown = std::max<int64_t>(ReadUntrackedHeap() - before_, 0);
  if (account_) {
    std::lock_guard<std::mutex> lock(g_samples_mu);
    HeapSamples::Phase& s = SamplesOf(account_).phase[static_cast<int>(phase_)];
    s.last[s.next] = grown;
    s.next = (s.next + 1) % kSampled;
    s.count = std::min(s.count + 1, kSampled);
    s.estimated = 0;
  }
  return grown;
}

int64_t HeapMeasure::Readings() { return g_heap_readings.load(std::memory_order_relaxed); }

size_t Plan::num_steps() const { return impl_->steps.size(); }
size_t Plan::arena_bytes() const { return impl_->arena_bytes; }

size_t Plan::TrimArenas(double idle_seconds) const {
  std::vector<std::shared_ptr<Buffer>> dropped;  // freed outside the lock
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->arena_mu);
    bytes += TakeIdle(impl_->free_device_arenas, idle_seconds, &dropped,
                      [this](const Buffer* arena) { impl_->arena_graphs.erase(arena); });
  }
  bytes += impl_->output_pool->Trim(idle_seconds);
  for (const auto& plan : impl_->sub_plans) bytes += plan->TrimArenas(idle_seconds);
  return bytes;
}
size_t Plan::num_device_steps() const {
  size_t n = 0;
  for (const Step& s : impl_->steps) n += s.on_device;
  return n;
}
size_t Plan::num_copy_steps() const {
  size_t n = 0;
  for (const Step& s : impl_->steps) n += IsDeviceCopy(s);
  return n;
}
size_t Plan::num_single_thread_steps() const {
  size_t n = 0;
  for (const Step& s : impl_->steps) n += s.threads == 1 && impl_->num_threads > 1;
  for (const auto& plan : impl_->sub_plans) n += plan->num_single_thread_steps();
  return n;
}
size_t Plan::device_arena_bytes() const { return impl_->device_arena_bytes; }
std::vector<std::shared_ptr<Buffer>> Plan::DeviceConstants() const {
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (const Slot& s : impl_->slots)
    if (s.kind == Slot::Kind::kConstant && s.device != Device::kHost && s.constant.buffer())
      buffers.push_back(s.constant.buffer());
  return buffers;
}
std::map<std::string, int> Plan::HostFallbackOps() const {
  std::map<std::string, int> ops;
  if (!impl_->backend) return ops;
  // A host same-bytes step (Reshape, Flatten, ... of a value the host made) is a view, not an op the device lacks.
  for (const Step& s : impl_->steps)
    if (!s.on_device && !IsDeviceCopy(s) && !(s.fast && std::strcmp(s.fast->Name(), "SameBytesCopy") == 0))
      ++ops[s.node.op_type];
  return ops;
}
std::map<std::string, int> Plan::KernelCounts() const {
  std::map<std::string, int> kernels;
  for (const Step& s : impl_->steps)
    if (s.fast) ++kernels[s.fast->Name()];
  for (const auto& plan : impl_->sub_plans)
    for (const auto& [name, count] : plan->KernelCounts()) kernels[name] += count;
  return kernels;
}
const std::vector<TensorSpec>& Plan::output_specs() const { return impl_->output_specs; }
size_t Plan::num_fast_steps() const {
  size_t n = 0;
  for (const Step& s : impl_->steps) n += s.fast != nullptr;
  return n;
}

namespace {

// The device kernels of a run, [graph_begin, graph_end): replayed as this arena's graph when it has one; captured at
// the arena's second run (the first warmed the libraries up: cuDNN and cuBLAS load lazily); else run step by step.
void RunDeviceGraph(const Plan::Impl& p, const Buffer* arena, void* stream, const std::function<void()>& run_kernels) {
  const int ordinal = p.device.ordinal;
  std::shared_ptr<void> graph;
  bool capture = false;
  {
    std::lock_guard<std::mutex> lock(p.arena_mu);
    Plan::Impl::ArenaGraph& entry = p.arena_graphs[arena];
    graph = entry.graph;
    capture = !graph && entry.runs++ >= 1;
  }
  if (graph) {
    p.backend->Replay(ordinal, graph.get(), stream);
    return;
  }
  if (!capture) {
    run_kernels();
    return;
  }
  if (!p.backend->BeginCapture(ordinal, stream)) {
    p.graphs_off.store(true);  // this backend has no graphs
    run_kernels();
    return;
  }
  std::shared_ptr<void> made;
  try {
    run_kernels();  // recorded, not run
    made = p.backend->EndCapture(ordinal, stream);
  } catch (...) {
    try {
      p.backend->EndCapture(ordinal, stream);  // end the capture; what it recorded is dropped
    } catch (...) {
    }
    made = nullptr;
  }
  if (!made) {
    p.graphs_off.store(true);  // run step by step from now on (the error, if any, comes again there)
    run_kernels();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(p.arena_mu);
    p.arena_graphs[arena].graph = made;
  }
  p.backend->Replay(ordinal, made.get(), stream);
}

}  // namespace

namespace {

#if defined(__x86_64__)
constexpr unsigned kFloatStatusBits = 0x3F;  // MXCSR's sticky exception flags

// Whether the OpenMP runtime running osprey's regions gives each worker the floating-point mode of the thread that
// starts the region: osprey's does (threads/team.cc); libgomp does not (its workers keep the mode they were created
// with), and it runs the regions when it was loaded globally before osprey (PyTorch imported first in Python) or
// with OSPREY_OMP_RUNTIME=libgomp. Probed once: after a region that makes sure the workers exist, a region started
// under a rounding mode nobody uses (towards -inf) looks at what its threads see.
bool WorkersTakeTheCallersMode() {
  static const bool follows = [] {
#pragma omp parallel num_threads(2)
    {}
    const unsigned saved = _mm_getcsr();
    _mm_setcsr((saved & ~0x6000u) | 0x2000u);
    std::atomic<int> other{0};
#pragma omp parallel num_threads(2)
    {
      if ((_mm_getcsr() & 0x6000u) != 0x2000u) other.fetch_add(1, std::memory_order_relaxed);
    }
    _mm_setcsr(saved);
    return other.load() == 0;
  }();
  return follows;
}

thread_local bool t_mode_saved = false;
thread_local unsigned t_saved_mode = 0;

// On a runtime whose workers keep their own mode, a run of more than one thread starts with a region that gives each
// worker the caller's mode (subnormals flushed: core/float_env.h) and ends with one that puts each worker's back, so
// the caller's other work on those threads (PyTorch's) computes as before. PyTorch imported first: basic-pitch's model
// ran 490 ms instead of 28 after torch had started its threads, its workers computing on subnormals.
class WorkerFloatModes {
 public:
  explicit WorkerFloatModes(int threads)
      : threads_(threads), active_(threads > 1 && FlushDenormals::Wanted() && !WorkersTakeTheCallersMode()) {
    if (!active_) return;
    const unsigned mode = _mm_getcsr() & ~kFloatStatusBits;
#pragma omp parallel num_threads(threads_)
    {
      const unsigned csr = _mm_getcsr();
      if ((csr & ~kFloatStatusBits) != mode && !t_mode_saved) {
        t_saved_mode = csr & ~kFloatStatusBits;
        t_mode_saved = true;
        _mm_setcsr((csr & kFloatStatusBits) | mode);
      }
    }
  }
  ~WorkerFloatModes() {
    if (!active_) return;
#pragma omp parallel num_threads(threads_)
    {
      if (t_mode_saved) {
        _mm_setcsr((_mm_getcsr() & kFloatStatusBits) | t_saved_mode);
        t_mode_saved = false;
      }
    }
  }
  WorkerFloatModes(const WorkerFloatModes&) = delete;
  WorkerFloatModes& operator=(const WorkerFloatModes&) = delete;

 private:
  int threads_;
  bool active_;
};
#else
struct WorkerFloatModes {
  explicit WorkerFloatModes(int) {}
};
#endif

}  // namespace

std::vector<Tensor> Plan::Run(const std::vector<Tensor>& inputs, std::vector<OpProfile>* profile) const {
  const cpu::ThreadScratch::InUse scratch;  // kernels run: their threads' scratch is not trimmed meanwhile
  const FlushDenormals flush;
  const WorkerFloatModes workers(impl_->backend == nullptr ? impl_->num_threads : 1);
  // The first run's caches (kernels' lazily made state, oneDNN's) stay with the plan: measured like its compile.
  if (impl_->first_run.load(std::memory_order_relaxed) && impl_->first_run.exchange(false)) {
    const HeapMeasure measure(impl_->backend == nullptr, impl_->account, HeapMeasure::Phase::kFirstRun);
    std::vector<Tensor> outputs = RunSteps(inputs, profile);
    impl_->ChargeHeap(measure.Grown());
    return outputs;
  }
  return RunSteps(inputs, profile);
}

std::vector<Tensor> Plan::RunSteps(const std::vector<Tensor>& inputs, std::vector<OpProfile>* profile) const {
  const Impl& p = *impl_;
  std::shared_ptr<Buffer> arena = ArenaPool::Host().Take(p.arena_bytes, p.account);
  // Device plans: a device arena and a stream for this run, returned to their pools at the end (after the stream is
  // drained, so no queued kernel still uses the arena).
  std::shared_ptr<Buffer> device_arena;
  void* stream = nullptr;
  if (p.backend) {
    {
      std::lock_guard<std::mutex> lock(p.arena_mu);
      if (!p.free_device_arenas.empty()) {
        device_arena = std::move(p.free_device_arenas.back().buffer);
        p.free_device_arenas.pop_back();
      }
    }
    try {
      if (!device_arena)
        device_arena = Allocator::Host().AllocateOn(p.device.kind, p.device.ordinal, p.device_arena_bytes, p.account);
      stream = p.backend->AcquireStream(p.device.ordinal);
    } catch (...) {
      ArenaPool::Host().Give(std::move(arena));
      if (device_arena) p.ReturnDeviceArena(std::move(device_arena));
      throw;
    }
  }
  // Returns the arenas and the stream; never throws (a successful run synchronised before it).
  auto finish = [&](bool /*ok*/) {
    if (p.backend) {
      try {
        p.backend->Synchronize(p.device.ordinal, stream);
      } catch (...) {
      }
      p.backend->ReleaseStream(p.device.ordinal, stream);
      p.ReturnDeviceArena(std::move(device_arena));
    }
    ArenaPool::Host().Give(std::move(arena));
  };

  std::vector<Tensor> values(p.slots.size());
  for (size_t i = 0; i < p.slots.size(); ++i) {
    const Slot& s = p.slots[i];
    switch (s.kind) {
      case Slot::Kind::kConstant: values[i] = s.constant; break;
      case Slot::Kind::kInput:
        OSPREY_CHECK(s.input_index < static_cast<int>(inputs.size()));
        OSPREY_CHECK(inputs[s.input_index].shape() == s.shape && inputs[s.input_index].dtype() == s.dtype);
        values[i] = inputs[s.input_index];
        break;
      case Slot::Kind::kArena:
        values[i] = Tensor::View(s.dtype, PhysicalShape(s.shape, s.layout),
                                 s.device == Device::kHost ? arena : device_arena, s.offset);
        break;
      case Slot::Kind::kOutput: {
        const size_t bytes = static_cast<size_t>(NumBytes(s.dtype, s.shape));
        values[i] = bytes >= Allocator::mmap_threshold()
                        ? Tensor::View(s.dtype, s.shape,
                                       OutputPool::Take(p.output_pool, static_cast<int>(i), bytes, p.account), 0)
                        : Tensor(s.dtype, s.shape);
        break;
      }
      case Slot::Kind::kView: break;  // below, once every input is bound
    }
  }
  for (size_t i = 0; i < p.slots.size(); ++i) {
    const Slot& s = p.slots[i];
    if (s.kind != Slot::Kind::kView) continue;
    const Tensor& input = values[s.view_of];
    OSPREY_CHECK(input.buffer() && s.offset + static_cast<size_t>(NumBytes(s.dtype, s.shape)) <= input.nbytes());
    values[i] = Tensor::View(s.dtype, PhysicalShape(s.shape, s.layout), input.buffer(), input.offset() + s.offset);
  }

  int threads = p.num_threads;
  omp_set_num_threads(threads);
  std::vector<Tensor> views;
  auto run_steps = [&](size_t from, size_t to, bool check_deadline = true) {
    for (size_t si = from; si < to; ++si) {
      const Step& step = p.steps[si];
      if (step.no_output) continue;  // its outputs, bound above, have no elements to write
      if (check_deadline && RunDeadline::Passed())
        RunDeadline::Throw("node '" + step.node.name + "' (" + step.node.op_type + ", step " + std::to_string(si + 1) +
                           " of " + std::to_string(p.steps.size()) + ")");
      if (step.threads != threads) omp_set_num_threads(threads = step.threads);
      KernelContext ctx{step.node, p.opset};
      ctx.inputs.reserve(step.inputs.size());
      views.clear();
      views.reserve(step.inputs.size());
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        int s = step.inputs[k];
        if (s >= 0 && !step.has_view.empty() && step.has_view[k]) {
          views.push_back(values[s].Reshaped(step.input_views[k]));
          ctx.inputs.push_back(&views.back());
        } else {
          ctx.inputs.push_back(s >= 0 ? &values[s] : nullptr);
        }
      }
      for (int s : step.outputs) ctx.outputs.push_back(&values[s]);
      if (p.backend) ctx.stream = stream;
      if (step.workspace_bytes)
        ctx.workspace = static_cast<char*>((step.on_device ? device_arena : arena)->data()) + step.workspace_offset;
      auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      if (step.fast) {
        step.fast->Run(ctx);
      } else {
        step.reference(ctx);
        if (step.fused_steps) ApplyFusedSteps(step.node, ctx.Out(0).data<float>(), ctx.Out(0).numel());
      }
      // Profiling times each device step to its end, not its launch.
      if (profile && step.on_device) p.backend->Synchronize(p.device.ordinal, stream);
      if (profile) {
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        profile->push_back({step.node.name, step.node.op_type, step.fast ? step.fast->Name() : "reference", ms});
      }
    }
  };
  // Steps may run on fewer threads (Step::threads); the caller's thread is left with the plan's count, as before.
  struct RestoreThreads {
    const int& current;
    int plan;
    ~RestoreThreads() {
      if (current != plan) omp_set_num_threads(plan);
    }
  } restore{threads, p.num_threads};
  try {
    const size_t gb = p.graph_begin, ge = p.graph_end;
    if (!p.backend || ge <= gb || profile || p.graphs_off.load(std::memory_order_relaxed)) {
      run_steps(0, p.steps.size());
    } else {
      run_steps(0, gb);
      RunDeviceGraph(p, device_arena.get(), stream, [&] { run_steps(gb, ge, false); });  // no stop mid-capture
      run_steps(ge, p.steps.size());
    }
  } catch (...) {
    finish(false);
    throw;
  }
  if (p.backend) {
    try {
      p.backend->Synchronize(p.device.ordinal, stream);
    } catch (...) {
      finish(false);
      throw;
    }
  }

  std::vector<Tensor> outputs;
  outputs.reserve(p.output_slots.size());
  std::vector<int> seen;
  for (int s : p.output_slots) {
    const Slot& slot = p.slots[s];
    // Outputs must own their memory: constants/inputs passed through are copied, and so is a repeated output.
    bool repeated = std::find(seen.begin(), seen.end(), s) != seen.end();
    if (slot.kind == Slot::Kind::kOutput && !repeated)
      outputs.push_back(values[s]);
    else
      outputs.push_back(values[s].Clone());
    seen.push_back(s);
  }
  finish(true);
  return outputs;
}

}  // namespace osprey
