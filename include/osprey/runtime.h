#pragma once
/// Compiling and running graphs: Plan, PlanCache, WeightStore, Model.
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "osprey/device.h"
#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey {

/// Arithmetic of the compute-heavy kernels. kBf16 lets Conv, Gemm and MatMul with a constant B run in bfloat16
/// (inputs rounded to bf16 per run, weights packed as bf16 once, fp32 accumulation and fp32 outputs) wherever that is
/// faster on this machine: each kernel times its bf16 and fp32 forms at compile time (remembered on disk) and keeps the
/// faster, bf16 only where its output agrees with fp32 on a test input (OSPREY_TUNE=0: bf16 wherever oneDNN has it,
/// untimed). Every other kernel and every activation between kernels stays float32. Needs a CPU with AVX512_BF16
/// (Compile throws kUnsupported). kAuto: the same choice where the CPU has AVX512_BF16, fp32 elsewhere and with
/// OSPREY_TUNE=0, and fp32 on devices. kFp16 is for devices (CUDA: Conv, Gemm and MatMul on Tensor Cores in float16,
/// fp32 in and out); the CPU refuses it.
enum class Precision : uint8_t { kFp32, kBf16, kFp16, kAuto };

/// "fp32" / "bf16" / "fp16" / "auto".
const char* PrecisionName(Precision p);
/// Every name ParsePrecision takes (for option checks and help).
const std::vector<std::string>& PrecisionNames();
/// Parses "fp32", "bf16", "fp16" or "auto" (kInvalidArgument otherwise; `what` names the setting in the message).
Precision ParsePrecision(const std::string& text, const std::string& what = "precision");

/// Options that change what a Plan computes or how fast; part of the PlanCache key.
struct CompileOptions {
  /// Threads for one run (intra-op). 0 = all cores.
  int num_threads = 0;
  /// Use fast (oneDNN) kernels where available; false runs reference kernels only (the oracle).
  bool fast_kernels = true;
  /// Graph rewrites: BN folding into Conv, Conv/Gemm + activation (+ residual add) fusion.
  bool fuse = true;
  /// Compute precision of the fast Conv/Gemm/MatMul kernels (ignored with fast_kernels = false).
  Precision precision = Precision::kFp32;
  /// Time oneDNN's implementations of each Conv/Gemm/MatMul and keep the fastest (remembered per machine; see
  /// docs/architecture.md). false keeps oneDNN's first choice, as OSPREY_TUNE=0 does for the whole process: the same
  /// kernels, so the same bits, in every process whatever the load (`heads train` uses it for reproducible features).
  bool tune = true;
  /// Where the plan runs. On a device each step whose op the backend has a kernel for runs there and the rest on the
  /// host, with copies between (Plan::num_device_steps, the profile's kernel names say which).
  DeviceSpec device;
  std::string Key() const;
};

/// Concrete type of one input at compile time.
struct TensorSpec {
  DType dtype = DType::kF32;
  Shape shape;
};

/// Per-op timing of one profiled run.
struct OpProfile {
  std::string node_name;
  std::string op_type;
  std::string kernel;
  double ms = 0;
};

/// A deadline for the runs made on the constructing thread while it lives (Model::Run, Plan::Run, the plans of a model
/// run in parts, each iteration of a loop run step by step): they check it before every step, so a run past it stops
/// at its next step (one step is not interrupted) and throws Error(kDeadlineExceeded) saying `reason` and where it
/// stopped; likewise Error(kCancelled) saying `cancel_reason` once `cancelled` (called per step: cheap, thread-safe)
/// returns true. Nested deadlines: the earliest applies, and every cancel check. A server sets one per request on the
/// thread that runs it (Clock::time_point::max(): no deadline, only the cancel check).
class RunDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  RunDeadline(Clock::time_point at, std::string reason, std::function<bool()> cancelled = nullptr,
              std::string cancel_reason = "");
  ~RunDeadline();
  RunDeadline(const RunDeadline&) = delete;
  RunDeadline& operator=(const RunDeadline&) = delete;
  /// Whether the calling thread has a deadline and it has passed (cheap without one: what runs call per step).
  static bool Passed();
  /// Throws kCancelled (a cancel check fired before the deadline) or kDeadlineExceeded for the calling thread's
  /// deadline; `where` names what was about to run.
  [[noreturn]] static void Throw(const std::string& where);

 private:
  Clock::time_point at_, set_;
  std::string reason_;
  std::function<bool()> cancelled_;
  std::string cancel_reason_;
  const RunDeadline* outer_;
};

/// A graph compiled for concrete input shapes: constants folded, passes applied, kernels prepared, and a memory plan
/// (arena offsets by liveness). Immutable after Compile and safe to Run from several threads at once.
class Plan {
 public:
  ~Plan();
  /// Runs with inputs in graph-input order. Shapes/dtypes must equal the compiled ones (Model::Run checks this and
  /// gives user-facing errors). Returns outputs in graph-output order; they own their memory.
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs, std::vector<OpProfile>* profile = nullptr) const;
  size_t num_steps() const;
  /// Bytes of one execution arena (intermediate values).
  size_t arena_bytes() const;
  /// Number of steps run by fast kernels.
  size_t num_fast_steps() const;
  /// Steps of a multi-thread plan that run on one thread: small convolutions, matrix products and recurrent layers
  /// timed faster so when compiling (docs/architecture.md, "Threads per step").
  size_t num_single_thread_steps() const;
  /// Device plans: steps run on the device (copies to it included), copies between host and device, and bytes of one
  /// device arena (values and workspaces). 0 for host plans.
  size_t num_device_steps() const;
  size_t num_copy_steps() const;
  size_t device_arena_bytes() const;
  /// The device copies of this plan's constants (weights uploaded once, shared through the weight store).
  std::vector<std::shared_ptr<Buffer>> DeviceConstants() const;
  /// Device plans: the op types of the steps that run on the host because the device has no kernel for them (their
  /// dtype, attributes or op), with their counts; empty for host plans and for plans wholly on the device.
  std::map<std::string, int> HostFallbackOps() const;
  /// The fast kernels the steps run, by name (e.g. "ConvF32Dnnl", "ConvBf16Dnnl"), with their counts: what
  /// CompileOptions::precision kBf16 / kAuto chose per kernel.
  std::map<std::string, int> KernelCounts() const;
  /// Frees the plan's pooled device arenas and output buffers that no run has used for `idle_seconds` (0 = every idle
  /// one); returns the bytes freed. Runs in progress keep theirs. (Host execution arenas are shared by every plan of
  /// the process: TrimSharedArenas.) A server calls both periodically so that a burst of large requests does not pin
  /// its memory.
  size_t TrimArenas(double idle_seconds) const;
  const std::vector<TensorSpec>& output_specs() const;
  /// Heap the plan's objects keep besides buffers (kernels, oneDNN primitives and their code, what its first run
  /// caches), measured around its compile and its first run (glibc's count, less osprey's buffers; process-wide, so an
  /// estimate when other threads allocate meanwhile) and charged to its account (Compile's `account`) until the plan
  /// is freed, so that a memory budget sees it. 0 for device plans and where the C library cannot count.
  int64_t heap_bytes() const;

  struct Impl;
  explicit Plan(std::unique_ptr<Impl> impl);

 private:
  std::vector<Tensor> RunSteps(const std::vector<Tensor>& inputs, std::vector<OpProfile>* profile) const;
  std::unique_ptr<Impl> impl_;
};

class WeightStore;

/// Host execution arenas are shared by every plan of the process: a run takes an idle one that fits (or a new one),
/// charged to its plan's account while it runs, and gives it back when it ends; idle ones are charged to the pool.
/// So models that run in turn hold one arena between them, not one each. TrimSharedArenas frees those idle for
/// `idle_seconds` (0: all idle ones), and the kernels' per-thread scratch blocks not used for as long when no run is
/// in progress, and returns the bytes freed; SharedArenaBytes is the bytes of the idle arenas and of the scratch
/// blocks.
size_t TrimSharedArenas(double idle_seconds);
int64_t SharedArenaBytes();

/// Compiles `graph` for the given input specs (one per graph input, same order). Constants created by compilation
/// (folded values, BN-folded weights) are interned in `weights` when given, so identical models share them too;
/// execution arenas are charged to `account` while a run holds them (TrimSharedArenas).
std::shared_ptr<const Plan> Compile(const Graph& graph, const std::vector<TensorSpec>& inputs,
                                    const CompileOptions& options = {}, WeightStore* weights = nullptr,
                                    std::shared_ptr<MemoryAccount> account = nullptr);

/// Bounded LRU cache of plans keyed by (graph fingerprint, input specs, options). Thread-safe; concurrent misses on
/// one key compile once.
class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 16);
  /// The cached plan for (fingerprint, inputs, options), or the result of `compile()` stored under that key.
  std::shared_ptr<const Plan> GetOrCompile(const std::string& fingerprint, const std::vector<TensorSpec>& inputs,
                                           const CompileOptions& options,
                                           const std::function<std::shared_ptr<const Plan>()>& compile);
  struct Stats {
    uint64_t hits = 0, misses = 0, evictions = 0;
    size_t size = 0, capacity = 0;
  };
  Stats stats() const;
  void set_capacity(size_t capacity);
  void Clear();
  /// Plan::TrimArenas on every cached plan; returns the bytes freed.
  size_t TrimArenas(double idle_seconds);
  /// The cached plans, most recent first.
  std::vector<std::shared_ptr<const Plan>> Plans() const;

 private:
  void EvictLocked();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> in_flight_;
  size_t capacity_;
  std::list<std::pair<std::string, std::shared_ptr<const Plan>>> lru_;  // front = most recent
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  Stats stats_;
};

/// Content-addressed store of constant tensors (hash of dtype, shape and bytes). Entries are held weakly: a weight
/// lives while some model uses it. Two models holding an identical tensor share one copy. Thread-safe.
class WeightStore {
 public:
  WeightStore();
  /// Returns the stored tensor equal to `t` (sharing its buffer), storing a copy first if none is live.
  Tensor Intern(const Tensor& t);
  /// Intern for a tensor the caller gives up, whose bytes' digest it already has (`digest` = Graph::ContentDigest(t)):
  /// the bytes are not hashed again, and when no equal tensor is live and `t` is the only holder of a buffer it spans
  /// from its start, the store keeps that buffer (charged to the store) instead of a copy. Model uses it at load.
  Tensor InternOwned(Tensor t, const std::array<uint64_t, 2>& digest);
  /// Holder counting, for "shared" statistics: a model calls Hold once per distinct weight buffer it keeps and Unhold
  /// when it drops it. Holders(t) is the number of current holders of t's buffer.
  void Hold(const Tensor& t);
  void Unhold(const Tensor& t);
  int Holders(const Tensor& t) const;
  /// A buffer derived from the stored tensor `source` (its weights reordered into the layout a kernel prefers, say),
  /// named by `key` (the derivation: layouts, scale). The first call's `fill` writes `bytes` into a new buffer charged
  /// to this store; while that buffer lives, every call with the same source buffer and key gets it, so the plans,
  /// batch sizes and models that share a weight share its packed forms too.
  /// With `where` a device, the buffer is device memory (`fill` gets a device pointer and uploads into it): five
  /// models on one backbone hold one device copy of it, as they hold one host copy.
  std::shared_ptr<Buffer> Derive(const Tensor& source, const std::string& key, size_t bytes,
                                 const std::function<void(void* data)>& fill, const DeviceSpec& where = {});
  /// Bytes of live unique weights and their derived (packed) forms held through this store, on the host.
  int64_t BytesLive() const { return account_->BytesLive(); }
  /// Device bytes of the weights' device copies held through this store (every device together).
  int64_t DeviceBytesLive() const { return device_account_->DeviceBytesLive(); }
  size_t NumLive() const;
  /// Bytes the constants of `graph` would add if interned now: those without a live equal tensor here (what loading
  /// a model that shares a backbone with loaded ones really costs). Hashes every constant; stores nothing.
  int64_t BytesNotStored(const Graph& graph) const;
  /// Live derived buffers (for tests and statistics).
  size_t NumDerivedLive() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<MemoryAccount> account_;
  std::shared_ptr<MemoryAccount> device_account_ = std::make_shared<MemoryAccount>("weights (device)");
  struct Entry {
    std::weak_ptr<Buffer> buffer;
    DType dtype;
    Shape shape;
  };
  std::unordered_multimap<uint64_t, Entry> entries_;
  std::unordered_map<const Buffer*, int> holders_;
  size_t interns_since_sweep_ = 0;
  struct DerivedEntry {
    std::weak_ptr<Buffer> source;  // identity of the source: an address reused by a later buffer never matches
    std::weak_ptr<Buffer> derived;
  };
  std::unordered_map<std::string, DerivedEntry> derived_;
  bool FindLocked(uint64_t key, const Tensor& t, std::shared_ptr<Buffer>* found) const;
  Tensor InternKeyed(const Tensor& t, uint64_t key, bool adopt);
  size_t derives_since_sweep_ = 0;
};

struct ModelOptions {
  CompileOptions compile;
  size_t plan_cache_capacity = 8;
  /// Shared store for weights; null gives the model a private store.
  std::shared_ptr<WeightStore> weight_store;
};

/// A graph plus its interned weights and a plan cache. Thread-safe Run. Dropping the last handle frees its memory.
class Model {
 public:
  explicit Model(Graph graph, ModelOptions options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  const Graph& graph() const { return graph_; }
  const std::string& fingerprint() const { return fingerprint_; }
  /// Runs with named inputs. Checks names, dtypes, ranks and fixed dims (symbolic dims are free, as ONNX Runtime
  /// reads them) and says what is wrong (kInvalidArgument) when they don't fit. Returns named outputs in graph order.
  std::vector<std::pair<std::string, Tensor>> Run(const std::map<std::string, Tensor>& inputs,
                                                  std::vector<OpProfile>* profile = nullptr);
  /// The plan for these inputs (compiling on a cache miss), after the same checks as Run. For a model with
  /// data-dependent ops (run cut into parts, runtime/segments.h): the first part's plan, null when there is none.
  std::shared_ptr<const Plan> PlanFor(const std::map<std::string, Tensor>& inputs);
  PlanCache& plan_cache() { return plan_cache_; }
  /// Frees execution arenas idle for `idle_seconds` (see Plan::TrimArenas); returns the bytes freed.
  size_t TrimArenas(double idle_seconds);
  /// Bytes of this model's weights (each interned weight counted once, whether or not another model shares it).
  int64_t WeightBytes() const;
  /// Of WeightBytes(), the bytes of weights also held by another live model.
  int64_t SharedWeightBytes() const;
  const std::shared_ptr<WeightStore>& weight_store() const { return weight_store_; }
  /// Host bytes charged to this model besides weights: execution arenas, plan-private constants, and the heap its
  /// plans' objects keep (Plan::heap_bytes).
  int64_t RuntimeBytes() const { return account_->BytesLive(); }
  /// Device (GPU) bytes this model holds: its plans' device arenas and the device copies of its weights (each
  /// counted once, also when other models share them). 0 for a model on the CPU.
  int64_t DeviceBytes() const;

 private:
  std::vector<Tensor> OrderedInputs(const std::map<std::string, Tensor>& inputs, std::vector<TensorSpec>* specs) const;
  Graph graph_;
  ModelOptions options_;
  std::string fingerprint_;
  std::shared_ptr<WeightStore> weight_store_;
  std::shared_ptr<MemoryAccount> account_;
  std::vector<Tensor> held_weights_;  // one per distinct interned buffer
  PlanCache plan_cache_;
  std::shared_ptr<class GraphRunner> Segments() const;
  std::shared_ptr<class GraphRunner> SegmentsInsteadOf(const Error& e);
  // Set when the graph has data-dependent ops (NonZero, NonMaxSuppression, ...), or once a compile met what one plan
  // cannot hold (MakeRunnerInsteadOf): the model runs as parts (runtime/segments.h), each with its own plan cache.
  mutable std::mutex segments_mu_;
  std::shared_ptr<class GraphRunner> segments_;
};

/// Registers the built-in device backends (CUDA when built with it). Compile calls it; call it before using
/// GetDeviceBackend directly.
void InitDevices();

/// Sets the default intra-op thread count used when CompileOptions::num_threads is 0.
int DefaultNumThreads();

/// The CPU kernels' implementation and bf16/fp32 choices made by timing (CompileOptions::tune) in this process so
/// far: taken from the tuning cache, timed now on a quiet machine (final), timed now under load (provisional, timed
/// again later), or timed again under load with the earlier provisional choice kept.
struct TuningCounts {
  int64_t cached = 0, timed = 0, provisional = 0, kept = 0;
};
TuningCounts KernelTuningCounts();

}  // namespace osprey
