#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <unordered_map>

#include "ops/op_registry.h"
#include "osprey/runtime.h"
#include "runtime/promote_half.h"
#include "runtime/segments.h"

namespace osprey {

namespace {

// Cores this process may run on.
int AvailableCpus() {
  static const int cpus = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  }();
  return cpus;
}

// Runnable threads on the machine now (the 4th field of /proc/loadavg, "runnable/total"; it counts the reader), or -1.
int RunnableThreads() {
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  const char* p = buf;
  for (int field = 0; field < 3 && p; ++field) {
    p = std::strchr(p, ' ');
    if (p) ++p;
  }
  return p ? std::atoi(p) : -1;
}

// Threads for one run under CPU contention (docs/performance.md, "Under CPU contention"). OpenMP threads wait for
// the next parallel region by spinning (osprey's runtime, src/threads: briefly, then yielding), which makes
// back-to-back kernels fast on idle cores; when other processes keep the cores busy, a descheduled thread stalls
// every barrier (2-10x on 2 cores with libgomp's default spin; osprey's runtime then shortens its waits).
// So a run can look at how many threads are runnable on the machine (sampled at most every 20 ms) and, when the
// planned threads would not each get a free core, uses a plan compiled for as many threads as are free (at least 1;
// compiled on first use and cached like any plan), where no thread waits for another. The run's own threads are
// counted out: the caller, and after a multi-threaded run its worker threads, which are still spinning.
// Opt-in for now (OSPREY_ADAPTIVE_THREADS=1): it cuts p90 under heavy contention 2-5x, but a single thread also gets
// a smaller share of a busy machine than two do, and it compiles a second plan (tests that count plans would see it).
int ThreadsForRun(int planned) {
  static const bool enabled = [] {
    const char* v = std::getenv("OSPREY_ADAPTIVE_THREADS");
    return v && std::strcmp(v, "1") == 0;
  }();
  if (!enabled || planned <= 1) return planned;
  static std::atomic<int64_t> sampled_at{-1000};
  static std::atomic<int> chosen{0};
  static std::atomic<int> last{0};
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  if (now - sampled_at.load(std::memory_order_relaxed) >= 20) {
    sampled_at.store(now, std::memory_order_relaxed);
    const int r = RunnableThreads();
    if (r < 0) {
      chosen.store(planned, std::memory_order_relaxed);
    } else {
      const int own = std::max(1, last.load(std::memory_order_relaxed));
      const int others = std::max(0, r - own);
      chosen.store(std::clamp(AvailableCpus() - others, 1, planned), std::memory_order_relaxed);
    }
  }
  const int t = std::min(planned, std::max(1, chosen.load(std::memory_order_relaxed)));
  last.store(t, std::memory_order_relaxed);
  return t;
}

}  // namespace

Model::Model(Graph graph, ModelOptions options)
    : graph_(std::move(graph)),
      options_(std::move(options)),
      weight_store_(options_.weight_store ? options_.weight_store : std::make_shared<WeightStore>()),
      account_(std::make_shared<MemoryAccount>("model:" + graph_.name)),
      plan_cache_(options_.plan_cache_capacity) {
  PromoteHalfFloats(graph_);  // float16 / bfloat16 models computed in float32 (runtime/promote_half.h)
  graph_.Validate();
  ValidateOps(graph_);
  // Each weight's bytes are read once: their digest keys the weight in the store and stands for the bytes in the
  // fingerprint. The store keeps the imported buffers themselves when nothing else holds them (no copy).
  std::unordered_map<int, Graph::Digest> digests;
  digests.reserve(graph_.constants.size());
  std::set<const Buffer*> held;
  for (auto& [id, t] : graph_.constants) {
    const Graph::Digest digest = Graph::ContentDigest(t);
    digests.emplace(id, digest);
    t = weight_store_->InternOwned(std::move(t), digest);
    if (held.insert(t.buffer().get()).second) {
      weight_store_->Hold(t);
      held_weights_.push_back(t);
    }
  }
  fingerprint_ = graph_.Fingerprint(digests);
  if (HasDataDependentOps(graph_))
    segments_ = MakeSegmentedRunner(graph_, options_.plan_cache_capacity, weight_store_.get(), account_);
}

size_t Model::TrimArenas(double idle_seconds) {
  size_t bytes = plan_cache_.TrimArenas(idle_seconds);
  if (std::shared_ptr<GraphRunner> segments = Segments())
    segments->ForEachCache([&](PlanCache& c) { bytes += c.TrimArenas(idle_seconds); });
  return bytes;
}

Model::~Model() {
  for (const Tensor& t : held_weights_) weight_store_->Unhold(t);
}

int64_t Model::WeightBytes() const {
  int64_t total = 0;
  for (const Tensor& t : held_weights_) total += static_cast<int64_t>(t.buffer()->size());
  return total;
}

int64_t Model::DeviceBytes() const {
  int64_t total = account_->DeviceBytesLive();  // device arenas (plan-private device constants, if any)
  std::set<const Buffer*> seen;
  auto add = [&](const PlanCache& cache) {
    for (const auto& plan : cache.Plans())
      for (const auto& buffer : plan->DeviceConstants())
        if (seen.insert(buffer.get()).second) total += static_cast<int64_t>(buffer->size());
  };
  add(plan_cache_);
  if (std::shared_ptr<GraphRunner> segments = Segments()) segments->ForEachCache(add);
  return total;
}

int64_t Model::SharedWeightBytes() const {
  int64_t total = 0;
  for (const Tensor& t : held_weights_)
    if (weight_store_->Holders(t) > 1) total += static_cast<int64_t>(t.buffer()->size());
  return total;
}

std::vector<Tensor> Model::OrderedInputs(const std::map<std::string, Tensor>& inputs,
                                         std::vector<TensorSpec>* specs) const {
  auto expected_names = [&] {
    std::string s;
    for (size_t i = 0; i < graph_.input_infos.size(); ++i)
      s += (i ? ", " : "") + graph_.input_infos[i].name + " " + DTypeName(graph_.input_infos[i].dtype) +
           graph_.input_infos[i].ShapeString();
    return s;
  };
  for (const auto& [name, t] : inputs) {
    bool found = false;
    for (const ValueInfo& vi : graph_.input_infos) found = found || vi.name == name;
    if (!found)
      throw Error(ErrorCode::kInvalidArgument,
                  "unknown input '" + name + "'; the model's inputs are: " + expected_names());
  }
  // A symbolic dim's name is a hint, as ONNX Runtime reads it: inputs whose dims share a name may differ there (a
  // PyTorch export names unrelated dims of two inputs both 'width': LORE's table processor); ops that need them equal
  // say so when compiled.
  std::vector<Tensor> ordered;
  for (const ValueInfo& vi : graph_.input_infos) {
    auto it = inputs.find(vi.name);
    if (it == inputs.end())
      throw Error(ErrorCode::kInvalidArgument,
                  "missing input '" + vi.name + "' (" + DTypeName(vi.dtype) + vi.ShapeString() +
                      "); the model's inputs are: " + expected_names());
    const Tensor& t = it->second;
    const std::string what = "input '" + vi.name + "'";
    if (t.dtype() != vi.dtype)
      throw Error(ErrorCode::kInvalidArgument,
                  what + ": expected dtype " + DTypeName(vi.dtype) + ", got " + DTypeName(t.dtype()));
    if (vi.has_shape) {
      if (t.rank() != static_cast<int64_t>(vi.dims.size()))
        throw Error(ErrorCode::kInvalidArgument, what + ": expected rank " + std::to_string(vi.dims.size()) + " " +
                                                     vi.ShapeString() + ", got rank " + std::to_string(t.rank()) +
                                                     " " + ShapeToString(t.shape()));
      for (size_t d = 0; d < vi.dims.size(); ++d) {
        const Dim& dim = vi.dims[d];
        if (dim.value >= 0 && dim.value != t.shape()[d])
          throw Error(ErrorCode::kInvalidArgument, what + ": dim " + std::to_string(d) + " must be " +
                                                       std::to_string(dim.value) + " (expected shape " +
                                                       vi.ShapeString() + "), got " + ShapeToString(t.shape()));
      }
    }
    if (!t.defined() || (t.numel() > 0 && t.raw() == nullptr))
      throw Error(ErrorCode::kInvalidArgument, what + ": tensor has no data");
    ordered.push_back(t);
    specs->push_back({t.dtype(), t.shape()});
  }
  return ordered;
}

std::shared_ptr<GraphRunner> Model::Segments() const {
  std::lock_guard<std::mutex> lock(segments_mu_);
  return segments_;
}

std::shared_ptr<GraphRunner> Model::SegmentsInsteadOf(const Error& e) {
  std::lock_guard<std::mutex> lock(segments_mu_);
  if (!segments_)
    segments_ = MakeRunnerInsteadOf(graph_, e, options_.plan_cache_capacity, weight_store_.get(), account_);
  return segments_;
}

std::shared_ptr<const Plan> Model::PlanFor(const std::map<std::string, Tensor>& inputs) {
  std::vector<TensorSpec> specs;
  std::vector<Tensor> ordered = OrderedInputs(inputs, &specs);
  std::shared_ptr<GraphRunner> segments = Segments();
  if (!segments) {
    try {
      return plan_cache_.GetOrCompile(fingerprint_, specs, options_.compile, [&] {
        return Compile(graph_, specs, options_.compile, weight_store_.get(), account_);
      });
    } catch (const Error& e) {  // what one plan cannot hold: run as parts from now on (segments.h), or fail
      if (!(segments = SegmentsInsteadOf(e))) throw;
    }
  }
  return segments->FirstPlan(ordered, options_.compile);
}

std::vector<std::pair<std::string, Tensor>> Model::Run(const std::map<std::string, Tensor>& inputs,
                                                       std::vector<OpProfile>* profile) {
  if (RunDeadline::Passed()) RunDeadline::Throw("the run started");
  std::vector<TensorSpec> specs;
  std::vector<Tensor> ordered = OrderedInputs(inputs, &specs);
  CompileOptions compile = options_.compile;
  const int planned = compile.num_threads > 0 ? compile.num_threads : DefaultNumThreads();
  const int threads = ThreadsForRun(planned);
  if (threads != planned) compile.num_threads = threads;
  std::vector<Tensor> outs;
  std::shared_ptr<GraphRunner> segments = Segments();
  if (!segments) {
    try {
      auto plan = plan_cache_.GetOrCompile(
          fingerprint_, specs, compile, [&] { return Compile(graph_, specs, compile, weight_store_.get(), account_); });
      outs = plan->Run(ordered, profile);
    } catch (const Error& e) {  // what one plan cannot hold: run as parts from now on (segments.h), or fail
      if (!(segments = SegmentsInsteadOf(e))) throw;
    }
  }
  if (segments) outs = segments->Run(ordered, compile, profile);
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < outs.size(); ++i) named.emplace_back(graph_.value_names[graph_.outputs[i]], std::move(outs[i]));
  return named;
}

}  // namespace osprey
