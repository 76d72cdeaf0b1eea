// Threads per step, by measurement (docs/architecture.md, "Threads per step"): a small matrix product or recurrent
// layer of a multi-thread plan is also built for one thread and timed both ways; the one-thread kernel is kept where
// it is clearly faster.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/load_watch.h"
#include "core/size_class.h"
#include "ops/matmul_views.h"
#include "ops/op_cost.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

// Matrix products (attention too) and recurrent layers whose EstimatedWork (ops/op_cost.h) is below this are built for
// one thread too and timed both ways when tuning (OneThreadFaster): oneDNN's parallel forms of small ones can be
// several times slower than its serial ones (Silero VAD's single-step LSTM: 0.109 ms on two threads, 0.015 ms on one).
// Convolutions are left out: timed alone, small ones often looked faster on one thread, but in MobileNetV2,
// EfficientNet and ShuffleNet the networks did not get faster (within this host's noise, some slower).
constexpr int64_t kMaxTimedWork = int64_t{1} << 23;

bool ThreadCountMatters(const Node& node) {
  static const char* const kOps[] = {"Gemm", "MatMul", kMatMulViewsOp, kAttentionViewsOp, "LSTM", "GRU", "RNN"};
  for (const char* op : kOps)
    if (node.op_type == op) return node.domain.empty();
  return false;
}

// Everything about a step that its timing depends on: op, attributes, input and output types, shapes (a constant's
// exactly, a computed value's dims by size class: core/size_class.h), layouts, which inputs are constant, thread count
// and bf16 use. The verdict is remembered per key for the process, so every plan that has the step (other batch sizes'
// plans aside: other shapes) runs the same kernel and shares its packed weights; a model seeing a new sequence length
// or image width (an OCR recogniser: every text line) is timed once per class, and the verdicts stay few.
std::string StepTimingKey(const CompileState& st, const Node& node, int threads, Bf16Use bf16) {
  std::string key = node.op_type + "|" + std::to_string(threads) + "|" + std::to_string(static_cast<int>(bf16));
  auto put_shape = [&key](const Shape& s, bool exact) {
    for (int64_t d : s) key += std::to_string(exact ? d : SizeClass(d)) + ",";
  };
  for (int v : node.inputs) {
    key += "|i";
    if (v < 0) continue;
    key += std::to_string(static_cast<int>(st.values[v].dtype)) + (st.values[v].known ? "k" : "") +
           std::to_string(static_cast<int>(st.layouts[v])) + ":";
    put_shape(st.values[v].shape, st.values[v].known);
  }
  for (int v : node.outputs) {
    key += "|o" + std::to_string(static_cast<int>(st.layouts[v])) + ":";
    put_shape(st.values[v].shape, false);
  }
  for (const auto& [name, a] : node.attrs) {
    key += "|" + name + "=";
    switch (a.kind) {
      case Attribute::Kind::kFloat: key += std::to_string(a.f); break;
      case Attribute::Kind::kInt: key += std::to_string(a.i); break;
      case Attribute::Kind::kString: key += a.s; break;
      case Attribute::Kind::kFloats:
        for (float f : a.floats) key += std::to_string(f) + ",";
        break;
      case Attribute::Kind::kInts:
        for (int64_t i : a.ints) key += std::to_string(i) + ",";
        break;
      case Attribute::Kind::kStrings:
        for (const std::string& s : a.strings) key += s + ",";
        break;
      case Attribute::Kind::kTensor:
        put_shape(a.t.shape(), true);
        break;
      case Attribute::Kind::kGraph: break;
    }
  }
  return key;
}

// The verdicts remembered for the process.
struct Verdicts {
  std::mutex mu;
  std::map<std::string, bool> by_key;
};

Verdicts& StepVerdicts() {
  static Verdicts verdicts;
  return verdicts;
}

// The verdict remembered for `key`, if any.
std::optional<bool> KnownVerdict(const std::string& key) {
  Verdicts& v = StepVerdicts();
  std::lock_guard<std::mutex> lock(v.mu);
  auto it = v.by_key.find(key);
  return it == v.by_key.end() ? std::nullopt : std::optional<bool>(it->second);
}

// The remembered verdict for `key`, or `decide()`: remembered, unless it is empty (timed under load: the step keeps its
// threads this time, and a later compile times it again).
bool RememberedVerdict(const std::string& key, const std::function<std::optional<bool>()>& decide) {
  if (const std::optional<bool> known = KnownVerdict(key)) return *known;
  const std::optional<bool> verdict = decide();
  if (!verdict) return false;
  Verdicts& v = StepVerdicts();
  std::lock_guard<std::mutex> lock(v.mu);
  return v.by_key.emplace(key, *verdict).first->second;
}

// What a parallel region costs to start after the team idled 300 us: a serial step that long makes the next parallel
// step pay it. Under libgomp's bounded spin (GOMP_SPINCOUNT) the team is asleep by then (tens of us, more on a VM);
// osprey's runtime (src/threads) keeps it yielding for 1 ms, so ~1 us. Measured once per thread count, median of 7.
double WakePenaltyUs(int threads) {
  static std::mutex mu;
  static std::map<int, double> measured;
  std::lock_guard<std::mutex> lock(mu);
  auto it = measured.find(threads);
  if (it != measured.end()) return it->second;
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<double> us;
  std::atomic<int> sink{0};
  for (int i = 0; i < 8; ++i) {
    const auto idle_until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
    while (std::chrono::steady_clock::now() < idle_until) {
    }
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    sink.fetch_add(1, std::memory_order_relaxed);
    if (i > 0) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  omp_set_num_threads(previous);
  std::sort(us.begin(), us.end());
  return measured[threads] = us[us.size() / 2];
}

// Times `serial` (built for one thread) against `parallel` (built for `threads`) on this step's shapes, inputs zero
// or their constant values, alternating runs; true when one thread is clearly faster: its median below half the
// parallel one and below it by more than the wake-up a serial step causes (WakePenaltyUs; timed alone, a small
// depthwise convolution is faster on one thread, but in MobileNetV2 its neighbours then pay more than it saves).
// Anything a kernel throws here keeps the parallel one.
bool OneThreadFaster(const CompileState& st, const Node& node, Kernel& serial, Kernel& parallel, int threads) {
  std::vector<Tensor> inputs, outputs;
  for (int v : node.inputs) {
    if (v < 0) {
      inputs.emplace_back();
      continue;
    }
    const CompileValue& cv = st.values[v];
    inputs.push_back(cv.known ? cv.value : Tensor::Zeros(cv.dtype, PhysicalShape(cv.shape, st.layouts[v])));
  }
  for (int v : node.outputs) outputs.emplace_back(st.values[v].dtype, PhysicalShape(st.values[v].shape, st.layouts[v]));
  KernelContext ctx{node, st.opset};
  for (size_t k = 0; k < node.inputs.size(); ++k) ctx.inputs.push_back(node.inputs[k] >= 0 ? &inputs[k] : nullptr);
  for (Tensor& t : outputs) ctx.outputs.push_back(&t);
  const int previous = omp_get_max_threads();
  std::vector<double> one, many;
  try {
    for (int i = 0; i < 9; ++i) {
      for (int which = 0; which < 2; ++which) {
        omp_set_num_threads(which == 0 ? 1 : threads);
        const auto t0 = std::chrono::steady_clock::now();
        (which == 0 ? serial : parallel).Run(ctx);
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (i >= 2) (which == 0 ? one : many).push_back(us);  // two warm-up rounds
      }
    }
  } catch (const std::exception&) {
    omp_set_num_threads(previous);
    return false;
  }
  omp_set_num_threads(previous);
  std::sort(one.begin(), one.end());
  std::sort(many.begin(), many.end());
  const double serial_us = one[one.size() / 2], parallel_us = many[many.size() / 2];
  return serial_us < 0.5 * parallel_us && serial_us + WakePenaltyUs(threads) < parallel_us;
}

int64_t StepWork(const CompileState& st, const Node& node) {
  std::vector<Shape> in, out;
  for (int v : node.inputs) in.push_back(v >= 0 ? st.values[v].shape : Shape{});
  for (int v : node.outputs) out.push_back(st.values[v].shape);
  return EstimatedWork(node, in, out);
}

// OSPREY_STEP_THREADS: 0 keeps every step on the plan's threads, 1 puts every candidate on one thread without timing
// (both for comparisons and tests); unset, the timing decides. Read at every compile.
std::string StepThreadsSetting() {
  const char* value = std::getenv("OSPREY_STEP_THREADS");
  return value ? value : "";
}

bool StepThreadsCandidate(const CompileState& st, const Node& node, int threads, const std::string& setting) {
  return setting != "0" && threads > 1 && ThreadCountMatters(node) && StepWork(st, node) < kMaxTimedWork;
}

}  // namespace

bool KnownToRunOnOneThread(const CompileState& st, const Node& node, int threads, Bf16Use bf16) {
  const std::string env = StepThreadsSetting();
  if (!StepThreadsCandidate(st, node, threads, env)) return false;
  return env == "1" || KnownVerdict(StepTimingKey(st, node, threads, bf16)).value_or(false);
}

std::unique_ptr<Kernel> SingleThreadKernelIfFaster(const CompileState& st, const Node& node, Kernel& parallel,
                                                   int threads, Bf16Use bf16,
                                                   const std::function<std::unique_ptr<Kernel>()>& build_serial) {
  const std::string env = StepThreadsSetting();
  if (!StepThreadsCandidate(st, node, threads, env)) return nullptr;
  std::unique_ptr<Kernel> serial;
  auto built = [&] {
    if (!serial) serial = build_serial();
    return serial != nullptr;
  };
  // Timed while other work competed for the CPUs (a server compiling a model under traffic, another program starting
  // beside), the parallel runs wait for a CPU and one thread can look faster for the life of the process: such a
  // timing decides nothing (the step keeps the plan's threads) and is not remembered.
  const bool one_thread = env == "1" || RememberedVerdict(StepTimingKey(st, node, threads, bf16), [&] {
                            const LoadWatch watch;
                            const bool faster = built() && OneThreadFaster(st, node, *serial, parallel, threads);
                            return watch.Disturbed() ? std::nullopt : std::optional<bool>(faster);
                          });
  if (!one_thread || !built()) return nullptr;
  return serial;
}

}  // namespace osprey
