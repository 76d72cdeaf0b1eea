#include <omp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "kernels/cpu/bf16_support.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/reference/reference.h"
#include "ops/op_cost.h"
#include "ops/op_registry.h"
#include "runtime/inline_if.h"
#include "runtime/inline_loop.h"
#include "runtime/plan_impl.h"
#ifdef OSPREY_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace osprey {

void InitDevices() {
#ifdef OSPREY_WITH_CUDA
  static const bool once = [] {
    SetBuiltinDeviceBackend(Device::kCuda, cuda::Backend());
    return true;
  }();
  (void)once;
#endif
}

int DefaultNumThreads() {
  static const int n = [] {
    int hw = static_cast<int>(std::thread::hardware_concurrency());
    return hw > 0 ? hw : 1;
  }();
  return n;
}

std::string CompileOptions::Key() const {
  return "t" + std::to_string(num_threads) + (fast_kernels ? "f" : "r") + (fuse ? "u" : "n") +
         (precision == Precision::kBf16   ? "b"
          : precision == Precision::kFp16 ? "h"
          : precision == Precision::kAuto ? "a"
                                          : "") +
         (tune ? "" : "x") + (device.kind == Device::kHost ? "" : "@" + DeviceSpecName(device));
}

namespace {
// Every Precision and its name, in enum order (the one list PrecisionName, ParsePrecision and the CLI read).
constexpr std::pair<Precision, const char*> kPrecisions[] = {
    {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}, {Precision::kFp16, "fp16"}, {Precision::kAuto, "auto"}};
}  // namespace

const char* PrecisionName(Precision p) {
  for (const auto& [value, name] : kPrecisions)
    if (value == p) return name;
  return "fp32";
}

const std::vector<std::string>& PrecisionNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& entry : kPrecisions) v.push_back(entry.second);
    return v;
  }();
  return names;
}

Precision ParsePrecision(const std::string& text, const std::string& what) {
  for (const auto& [value, name] : kPrecisions)
    if (text == name) return value;
  throw Error(ErrorCode::kInvalidArgument,
              what + " must be \"fp32\", \"bf16\" (CPU), \"auto\" or \"fp16\" (GPU), got \"" + text + "\"");
}

int CompileState::AddConstant(Tensor t) {
  CompileValue v;
  v.typed = true;
  v.dtype = t.dtype();
  v.shape = t.shape();
  v.known = true;
  v.value = weights ? weights->Intern(t) : std::move(t);
  values.push_back(std::move(v));
  is_graph_output.push_back(0);
  return static_cast<int>(values.size()) - 1;
}

namespace {

constexpr size_t kArenaAlignment = 64;
// Folding is skipped for results larger than this; such values are computed at run time instead.
constexpr int64_t kMaxFoldBytes = int64_t{64} << 20;

InferContext MakeInferContext(const CompileState& st, const Node& node) {
  InferContext ic{node, st.opset};
  for (int v : node.inputs) {
    bool present = v >= 0;
    ic.present.push_back(present);
    const CompileValue* cv = present ? &st.values[v] : nullptr;
    ic.input_dtypes.push_back(cv ? cv->dtype : DType::kF32);
    ic.input_shapes.push_back(cv ? cv->shape : Shape{});
    ic.input_values.push_back(cv && cv->known ? &cv->value : nullptr);
  }
  return ic;
}

// Infers one node's outputs; folds it when its inputs are all known, else appends it to the live nodes. An If is
// replaced by the nodes of the branch its (known) condition picks (inline_if.cc), a Loop or Scan by its unrolled
// iterations (inline_loop.cc).
void InferAndFoldNode(CompileState& st, const Node& node) {
  const OpRegistry& registry = OpRegistry::Get();
  if (node.op_type == "If" && node.domain.empty()) {
    if (IfConditionKnown(st, node)) {
      const Graph* branch = nullptr;
      for (const Node& inlined : InlineIfBranch(st, node, &branch)) InferAndFoldNode(st, inlined);
      CheckDeclaredOutputTypes(st, *branch, node.outputs,
                               node.Describe() + ": " + (branch == node.attrs.at("then_branch").g.get()
                                                              ? "then_branch"
                                                              : "else_branch"));
    } else {
      st.nodes.push_back(CompileRuntimeIf(st, node));
    }
    return;
  }
  if (node.op_type == "DynamicQuantizeLSTM" && node.domain == kMicrosoftDomain) {
    InferAndFoldNode(st, DequantizedLstm(st, node));
    return;
  }
  if ((node.op_type == "Loop" || node.op_type == "Scan") && node.domain.empty()) {
    const auto fold = [&st](const Node& n) { InferAndFoldNode(st, n); };
    node.op_type == "Loop" ? InlineLoop(st, node, fold) : InlineScan(st, node, fold);
    return;
  }
  const OpSchema* schema = registry.Find(node.op_type);
  OSPREY_CHECK(schema != nullptr);  // ValidateOps ran first
  for (int v : node.inputs)
    if (v >= 0 && !st.values[v].typed)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input '" +
                                                   (v < st.graph->num_values() ? st.graph->value_names[v] : "?") +
                                                   "' has no value (it is neither a graph input, a constant, nor "
                                                   "produced by an earlier node)");
  InferContext ic = MakeInferContext(st, node);
  schema->infer(ic);
  if (ic.output_shapes.size() < node.outputs.size()) {
    // Optional outputs the schema did not describe are not produced.
    for (size_t i = ic.output_shapes.size(); i < node.outputs.size(); ++i)
      throw Error(ErrorCode::kUnsupported,
                  node.Describe() + ": optional output " + std::to_string(i) + " is not supported");
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    CompileValue& out = st.values[node.outputs[i]];
    out.typed = true;
    out.dtype = ic.output_dtypes[i];
    out.shape = ic.output_shapes[i];
  }
  // Shape and Size (OpTraits::shape_only) only need shapes, which are concrete here.
  bool all_known = true;
  for (int v : node.inputs)
    if (v >= 0 && !st.values[v].known) all_known = false;
  const bool shape_only = schema->traits.shape_only;
  int64_t out_bytes = 0;
  for (size_t i = 0; i < node.outputs.size(); ++i)
    out_bytes = CheckedAdd(out_bytes, NumBytes(ic.output_dtypes[i], ic.output_shapes[i]), node.Describe());
  bool foldable = (all_known || shape_only) && out_bytes <= kMaxFoldBytes && node.op_type != "Dropout";
  if (!foldable) {
    st.nodes.push_back(node);
    return;
  }
  ReferenceKernel kernel = FindReferenceKernel(node.op_type);
  if (!kernel) throw Error(ErrorCode::kUnsupported, node.Describe() + ": no kernel for op " + node.op_type);
  std::vector<Tensor> outs;
  outs.reserve(node.outputs.size());
  for (size_t i = 0; i < node.outputs.size(); ++i) outs.emplace_back(ic.output_dtypes[i], ic.output_shapes[i]);
  KernelContext kc{node, st.opset};
  for (int v : node.inputs) kc.inputs.push_back(v >= 0 && st.values[v].known ? &st.values[v].value : nullptr);
  if (shape_only && !all_known) {
    // Compute Shape/Size directly from the concrete shape.
    const Shape& in = st.values[node.inputs[0]].shape;
    Tensor& out = outs[0];
    if (node.op_type == "Size") {
      out.data<int64_t>()[0] = NumElements(in);
    } else {
      int64_t rank = static_cast<int64_t>(in.size());
      int64_t start = node.GetInt("start", 0), end = node.GetInt("end", rank);
      if (start < 0) start += rank;
      if (end < 0) end += rank;
      start = std::clamp<int64_t>(start, 0, rank);
      end = std::clamp<int64_t>(end, 0, rank);
      for (int64_t i = start; i < end; ++i) out.data<int64_t>()[i - start] = in[i];
    }
  } else {
    for (Tensor& t : outs) kc.outputs.push_back(&t);
    kernel(kc);
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    CompileValue& out = st.values[node.outputs[i]];
    out.known = true;
    out.value = std::move(outs[i]);
  }
}

// Infers every node's outputs in order; folds nodes whose inputs are all known.
void InferAndFold(CompileState& st) {
  for (const Node& node : st.graph->nodes) InferAndFoldNode(st, node);
}

KernelBuildContext MakeBuildContext(const CompileState& st, const Node& node, int num_threads, Bf16Use bf16,
                                    bool tune) {
  KernelBuildContext bc{node, st.opset};
  for (int v : node.inputs) {
    bool present = v >= 0;
    bc.present.push_back(present);
    bc.input_dtypes.push_back(present ? st.values[v].dtype : DType::kF32);
    bc.input_shapes.push_back(present ? st.values[v].shape : Shape{});
    bc.input_values.push_back(present && st.values[v].known ? &st.values[v].value : nullptr);
    if (!st.layouts.empty()) bc.input_layouts.push_back(present ? st.layouts[v] : Layout::kPlain);
  }
  for (int v : node.outputs) {
    bc.output_dtypes.push_back(st.values[v].dtype);
    bc.output_shapes.push_back(st.values[v].shape);
    if (!st.layouts.empty()) bc.output_layouts.push_back(st.layouts[v]);
  }
  bc.num_threads = num_threads;
  bc.bf16 = bf16;
  bc.tune = tune;
  if (st.weights) {
    WeightStore* store = st.weights;
    bc.derive_weight = [store](const Tensor& source, const std::string& key, size_t bytes,
                               const std::function<void(void*)>& fill) {
      return store->Derive(source, key, bytes, fill);
    };
  }
  return bc;
}

// Plain loops converting NCHW <-> NHWC; used when no fast reorder kernel is available.
class LayoutReorderRef : public Kernel {
 public:
  LayoutReorderRef(Shape shape, bool to_nhwc) : shape_(std::move(shape)), to_nhwc_(to_nhwc) {}
  const char* Name() const override { return "LayoutReorderRef"; }
  void Run(KernelContext& ctx) override {
    const int64_t n = shape_[0], c = shape_[1], hw = shape_[2] * shape_[3];
    const float* src = ctx.In(0).data<float>();
    float* dst = ctx.Out(0).data<float>();
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t p = 0; p < hw; ++p) {
          int64_t plain = (b * c + ch) * hw + p, nhwc = (b * hw + p) * c + ch;
          if (to_nhwc_)
            dst[nhwc] = src[plain];
          else
            dst[plain] = src[nhwc];
        }
  }

 private:
  Shape shape_;
  bool to_nhwc_;
};

// A Transpose between [N, C, H, W] stored channels-last and plain [N, H, W, C] (layout.cc): the bytes are the same.
class LayoutCopy : public Kernel {
 public:
  const char* Name() const override { return "TransposeLayoutCopy"; }
  void Run(KernelContext& ctx) override {
    OSPREY_CHECK(ctx.In(0).nbytes() == ctx.Out(0).nbytes());
    const char* src = static_cast<const char*>(ctx.In(0).raw());
    char* dst = static_cast<char*>(ctx.Out(0).raw());
    if (src == dst) return;  // the memory plan gave both the same bytes
    const int64_t n = static_cast<int64_t>(ctx.Out(0).nbytes());
    constexpr int64_t kBlock = int64_t{1} << 16;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= 4 * kBlock)
    for (int64_t b = 0; b < blocks; ++b) std::memcpy(dst + b * kBlock, src + b * kBlock, std::min(kBlock, n - b * kBlock));
  }
};

// Matrix products and recurrent layers whose EstimatedWork (ops/op_cost.h) is below this are built for one thread
// too and timed both ways when tuning (OneThreadFaster): oneDNN's parallel forms of small ones can be several times
// slower than its serial ones (Silero VAD's single-step LSTM: 0.109 ms on two threads, 0.015 ms on one).
// Convolutions are left out: timed alone, small ones often looked faster on one thread, but in MobileNetV2,
// EfficientNet and ShuffleNet the networks did not get faster (within this host's noise, some slower).
constexpr int64_t kMaxTimedWork = int64_t{1} << 23;

bool ThreadCountMatters(const Node& node) {
  static const char* const kOps[] = {"Gemm", "MatMul", "LSTM", "GRU", "RNN"};
  for (const char* op : kOps)
    if (node.op_type == op) return node.domain.empty();
  return false;
}

// Everything about a step that its timing depends on: op, attributes, input and output types, shapes, layouts, which
// inputs are constant, thread count and bf16 use. The verdict is remembered per key for the process, so every plan
// that has the step (other batch sizes' plans aside: other shapes) runs the same kernel and shares its packed weights.
std::string StepTimingKey(const CompileState& st, const Node& node, int threads, Bf16Use bf16) {
  std::string key = node.op_type + "|" + std::to_string(threads) + "|" + std::to_string(static_cast<int>(bf16));
  auto put_shape = [&key](const Shape& s) {
    for (int64_t d : s) key += std::to_string(d) + ",";
  };
  for (int v : node.inputs) {
    key += "|i";
    if (v < 0) continue;
    key += std::to_string(static_cast<int>(st.values[v].dtype)) + (st.values[v].known ? "k" : "") +
           std::to_string(static_cast<int>(st.layouts[v])) + ":";
    put_shape(st.values[v].shape);
  }
  for (int v : node.outputs) {
    key += "|o" + std::to_string(static_cast<int>(st.layouts[v])) + ":";
    put_shape(st.values[v].shape);
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
      case Attribute::Kind::kTensor: put_shape(a.t.shape()); break;
      case Attribute::Kind::kGraph: break;
    }
  }
  return key;
}

// The remembered verdict for `key`, or `decide()` (remembered).
bool RememberedVerdict(const std::string& key, const std::function<bool()>& decide) {
  static std::mutex mu;
  static std::map<std::string, bool> verdicts;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = verdicts.find(key);
    if (it != verdicts.end()) return it->second;
  }
  const bool verdict = decide();
  std::lock_guard<std::mutex> lock(mu);
  return verdicts.emplace(key, verdict).first->second;
}

// What a parallel region costs to start when the team's other threads have gone to sleep (idle longer than OpenMP's
// spin: GOMP_SPINCOUNT, which osprey bounds, docs/performance.md): a serial step that long makes the next parallel
// step pay it. Measured once per thread count: a region started after 300 us of idling, median of 7.
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

size_t AlignUp(size_t n) { return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// First-fit allocator over one arena, used at compile time to assign offsets by liveness.
class ArenaPlanner {
 public:
  size_t Allocate(size_t bytes) {
    bytes = AlignUp(std::max<size_t>(bytes, 1));
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes) {
        size_t off = it->first;
        if (it->second == bytes)
          free_.erase(it);
        else {
          it->first += bytes;
          it->second -= bytes;
        }
        return off;
      }
    }
    // Grow: extend a free block at the end, if any.
    if (!free_.empty() && free_.back().first + free_.back().second == end_) {
      size_t off = free_.back().first;
      free_.pop_back();
      end_ = off + bytes;
      return off;
    }
    size_t off = end_;
    end_ = static_cast<size_t>(CheckedAdd(static_cast<int64_t>(end_), static_cast<int64_t>(bytes), "execution arena"));
    return off;
  }
  void Free(size_t offset, size_t bytes) {
    bytes = AlignUp(std::max<size_t>(bytes, 1));
    auto it = std::lower_bound(free_.begin(), free_.end(), std::make_pair(offset, size_t{0}));
    it = free_.insert(it, {offset, bytes});
    // Coalesce with neighbours.
    if (it + 1 != free_.end() && it->first + it->second == (it + 1)->first) {
      it->second += (it + 1)->second;
      free_.erase(it + 1);
    }
    if (it != free_.begin() && (it - 1)->first + (it - 1)->second == it->first) {
      (it - 1)->second += it->second;
      free_.erase(it);
    }
  }
  size_t size() const { return end_; }

 private:
  std::vector<std::pair<size_t, size_t>> free_;  // (offset, bytes), sorted by offset
  size_t end_ = 0;
};

}  // namespace

std::shared_ptr<const Plan> Compile(const Graph& graph, const std::vector<TensorSpec>& inputs,
                                    const CompileOptions& options, WeightStore* weights,
                                    std::shared_ptr<MemoryAccount> account) {
  int64_t subgraph_nodes = 0;
  return CompileSubgraph(graph, inputs, options, weights, std::move(account), &subgraph_nodes);
}

std::shared_ptr<const Plan> CompileSubgraph(const Graph& graph, const std::vector<TensorSpec>& inputs,
                                            const CompileOptions& options, WeightStore* weights,
                                            std::shared_ptr<MemoryAccount> account, int64_t* subgraph_nodes) {
  graph.Validate();
  ValidateOps(graph);
  InitDevices();
  const bool on_device = options.device.kind != Device::kHost;
  DeviceBackend* backend = on_device ? &RequireDevice(options.device) : nullptr;
  if (options.precision == Precision::kFp16 && !on_device)
    throw Error(ErrorCode::kUnsupported, "precision fp16 runs on a GPU (--device cuda); on the CPU use fp32 or bf16");
  if (options.precision == Precision::kBf16 && on_device)
    throw Error(ErrorCode::kUnsupported, "precision bf16 is for the CPU; on a GPU use fp32 or fp16");
  const bool fp16 = on_device && options.fast_kernels && options.precision == Precision::kFp16;
  const bool tune = options.tune && cpu::TuningEnabled();
  Bf16Use bf16 = Bf16Use::kNo;
  if (!on_device && options.fast_kernels && options.precision == Precision::kBf16) {
    std::string cpu;
    if (!cpu::CpuSupportsBf16(&cpu))
      throw Error(ErrorCode::kUnsupported, "--precision bf16 needs a CPU with AVX512_BF16 (this CPU: " + cpu +
                                               "); --precision auto uses it where it is there and faster");
    bf16 = tune ? Bf16Use::kIfFaster : Bf16Use::kYes;
  }
  if (!on_device && options.fast_kernels && options.precision == Precision::kAuto && tune && cpu::CpuSupportsBf16())
    bf16 = Bf16Use::kIfFaster;
  if (inputs.size() != graph.inputs.size())
    throw Error(ErrorCode::kInvalidArgument, "graph '" + graph.name + "' has " + std::to_string(graph.inputs.size()) +
                                                 " inputs, got " + std::to_string(inputs.size()));
  CompileState st;
  st.graph = &graph;
  st.opset = graph.opset;
  st.weights = weights;
  st.options = options;
  st.account = account;
  st.values.resize(graph.num_values());
  st.is_graph_output.assign(graph.num_values(), 0);
  for (int id : graph.outputs) st.is_graph_output[id] = 1;
  for (const auto& [id, t] : graph.constants) {
    CompileValue& v = st.values[id];
    v.typed = v.known = true;
    v.dtype = t.dtype();
    v.shape = t.shape();
    v.value = t;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    CompileValue& v = st.values[graph.inputs[i]];
    NumElements(inputs[i].shape);  // rejects negative dims
    v.typed = true;
    v.dtype = inputs[i].dtype;
    v.shape = inputs[i].shape;
  }

  st.subgraph_nodes = *subgraph_nodes;
  {
    // The count is handed back even when the compile fails, so that failed branch compiles still use the budget.
    struct HandBack {
      const int64_t& from;
      int64_t* to;
      ~HandBack() { *to = from; }
    } hand_back{st.subgraph_nodes, subgraph_nodes};
    InferAndFold(st);
  }
  CheckDeclaredOutputTypes(st, graph, graph.outputs, "graph");
  if (options.fuse) RunFusionPasses(st);
  const int nthreads = options.num_threads > 0 ? options.num_threads : DefaultNumThreads();
  if (options.fast_kernels && !on_device) {
    AssignLayouts(st,
                  [&](int i) { return CpuKernelSupportsNhwc(MakeBuildContext(st, st.nodes[i], nthreads, bf16, tune)); });
  } else {
    st.layouts.assign(st.values.size(), Layout::kPlain);
    st.transparent.assign(st.nodes.size(), 0);
  }

  auto impl = std::make_unique<Plan::Impl>();
  impl->opset = st.opset;
  impl->num_threads = nthreads;
  impl->account = std::move(account);
  impl->device = options.device;
  impl->backend = backend;

  // Slots: one per value the plan touches.
  std::vector<int> slot_of(st.values.size(), -1);
  auto slot_for = [&](int v) {
    if (v < 0) return -1;
    if (slot_of[v] >= 0) return slot_of[v];
    Slot s;
    const CompileValue& cv = st.values[v];
    s.dtype = cv.dtype;
    s.shape = cv.shape;
    s.layout = st.layouts[v];
    if (cv.known) {
      s.kind = Slot::Kind::kConstant;
      s.constant = cv.value;
    } else {
      auto it = std::find(graph.inputs.begin(), graph.inputs.end(), v);
      if (it != graph.inputs.end()) {
        s.kind = Slot::Kind::kInput;
        s.input_index = static_cast<int>(it - graph.inputs.begin());
      } else if (st.is_graph_output[v]) {
        s.kind = Slot::Kind::kOutput;
      } else {
        s.kind = Slot::Kind::kArena;
      }
    }
    impl->slots.push_back(std::move(s));
    slot_of[v] = static_cast<int>(impl->slots.size()) - 1;
    return slot_of[v];
  };

  for (size_t ni = 0; ni < st.nodes.size(); ++ni) {
    Node& node = st.nodes[ni];
    Step step;
    step.threads = nthreads;
    for (int v : node.inputs) step.inputs.push_back(slot_for(v));
    for (int v : node.outputs) step.outputs.push_back(slot_for(v));
    bool any_nhwc = false;
    for (int v : node.inputs) any_nhwc = any_nhwc || (v >= 0 && st.layouts[v] == Layout::kNhwc);
    for (int v : node.outputs) any_nhwc = any_nhwc || st.layouts[v] == Layout::kNhwc;
    if (node.op_type == "If" && node.Has(kRuntimeIfAttr)) {
      const std::shared_ptr<const RuntimeIf>& branches = st.runtime_ifs.at(node.GetInt(kRuntimeIfAttr, -1));
      step.fast = CreateRuntimeIfKernel(branches);
      for (const auto& plan : branches->plans)
        if (plan) impl->sub_plans.push_back(plan);
    } else if (node.op_type == kLayoutReorderOp) {
      const Shape& shape = st.values[node.inputs[0]].shape;
      Layout from = static_cast<Layout>(node.GetInt("from", 0)), to = static_cast<Layout>(node.GetInt("to", 0));
      step.fast = CreateLayoutReorderKernel(shape, from, to, nthreads);
      if (!step.fast) step.fast = std::make_unique<LayoutReorderRef>(shape, to == Layout::kNhwc);
    } else if (st.transparent[ni] == CompileState::kTransparentCopy) {
      step.fast = std::make_unique<LayoutCopy>();
    } else if (st.transparent[ni]) {
      // Elementwise kernel on physical shapes; plain operands are viewed as [N, H, W, C].
      step.reference = FindReferenceKernel(node.op_type);
      OSPREY_CHECK(step.reference != nullptr);
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        int v = node.inputs[k];
        bool view = v >= 0 && st.layouts[v] == Layout::kPlain && !(k > 0 && node.inputs.size() > 1 &&
                                                                   NumElements(st.values[v].shape) == 1 &&
                                                                   st.values[v].shape.size() <= 1);
        step.input_views.push_back(view ? ChannelsLastView(st.values[v].shape) : Shape{});
        step.has_view.push_back(view);
      }
      // The fast elementwise kernels classify broadcasts from the (physical, viewed) tensors they get at run time.
      if (options.fast_kernels)
        step.fast = CreateElementwiseKernel(MakeBuildContext(st, node, nthreads, bf16, tune));
    } else {
      if (on_device && options.fast_kernels) {
        KernelBuildContext bc = MakeBuildContext(st, node, nthreads, Bf16Use::kNo, tune);
        bc.device = options.device;
        bc.fp16 = fp16;
        step.fast = backend->CreateKernel(bc);
        step.on_device = step.fast != nullptr;
      }
      if (options.fast_kernels && !step.fast)
        step.fast = CreateCpuKernel(MakeBuildContext(st, node, nthreads, bf16, tune));
      // OSPREY_STEP_THREADS: 0 keeps every step on the plan's threads, 1 puts every candidate on one thread without
      // timing (both for comparisons and tests); unset, the timing decides.
      static const std::string step_threads_env = [] {
        const char* env = std::getenv("OSPREY_STEP_THREADS");
        return std::string(env ? env : "");
      }();
      if (step_threads_env != "0" && step.fast && !step.on_device && tune && nthreads > 1 &&
          ThreadCountMatters(node) && StepWork(st, node) < kMaxTimedWork) {
        std::unique_ptr<Kernel> serial;
        auto build_serial = [&] {
          if (!serial) serial = CreateCpuKernel(MakeBuildContext(st, node, 1, bf16, tune));
          return serial != nullptr;
        };
        const bool one_thread =
            step_threads_env == "1" || RememberedVerdict(StepTimingKey(st, node, nthreads, bf16), [&] {
              return build_serial() && OneThreadFaster(st, node, *serial, *step.fast, nthreads);
            });
        if (one_thread && build_serial()) {
          step.fast = std::move(serial);
          step.threads = 1;
        }
      }
      if (!step.fast) {
        if (any_nhwc)
          throw Error(ErrorCode::kInternal, node.Describe() + ": a channels-last kernel promised by "
                                                              "CpuKernelSupportsNhwc could not be built");
        step.reference = FindReferenceKernel(node.op_type);
        if (!step.reference)
          throw Error(ErrorCode::kUnsupported, node.Describe() + ": no kernel for op " + node.op_type);
      }
    }
    step.node = std::move(node);
    impl->steps.push_back(std::move(step));
  }

  for (int id : graph.outputs) {
    int s = slot_for(id);
    impl->output_slots.push_back(s);
    impl->output_specs.push_back({impl->slots[s].dtype, impl->slots[s].shape});
  }
  if (on_device) PlaceOnDevice(*impl, weights);

  // Memory plan: arena offsets by liveness, first fit. The output of a layout copy (a Transpose between NHWC-stored
  // [N, C, H, W] and plain [N, H, W, C]) shares its input's bytes when both live in the arena: values are never
  // written after their step, so the two slots are one buffer, freed when the last of them dies, and the copy kernel
  // finds nothing to do.
  std::vector<int> root(impl->slots.size());
  for (size_t s = 0; s < root.size(); ++s) root[s] = static_cast<int>(s);
  for (size_t i = 0; i < impl->steps.size(); ++i) {
    const Step& step = impl->steps[i];
    if (!dynamic_cast<const LayoutCopy*>(step.fast.get())) continue;
    const int in = step.inputs[0], out = step.outputs[0];
    if (impl->slots[in].kind == Slot::Kind::kArena && impl->slots[out].kind == Slot::Kind::kArena) root[out] = root[in];
  }
  std::vector<int> last_use(impl->slots.size(), -1);
  for (size_t i = 0; i < impl->steps.size(); ++i) {
    for (int s : impl->steps[i].inputs)
      if (s >= 0) last_use[root[s]] = std::max(last_use[root[s]], static_cast<int>(i));
    for (int s : impl->steps[i].outputs)
      if (last_use[root[s]] < static_cast<int>(i)) last_use[root[s]] = static_cast<int>(i);
  }
  ArenaPlanner host_planner, device_planner;
  auto planner_for = [&](const Slot& slot) -> ArenaPlanner& {
    return slot.device == Device::kHost ? host_planner : device_planner;
  };
  for (size_t i = 0; i < impl->steps.size(); ++i) {
    for (int s : impl->steps[i].outputs) {
      Slot& slot = impl->slots[s];
      if (slot.kind != Slot::Kind::kArena) continue;
      slot.offset = root[s] == s ? planner_for(slot).Allocate(static_cast<size_t>(NumBytes(slot.dtype, slot.shape)))
                                 : impl->slots[root[s]].offset;
    }
    // A device step's workspace lives for that step only (steps run in order on one stream).
    Step& step = impl->steps[i];
    const size_t workspace = step.on_device && step.fast ? step.fast->WorkspaceBytes() : 0;
    if (workspace) step.workspace_offset = device_planner.Allocate(workspace);
    std::vector<int> done;
    for (int s : impl->steps[i].inputs)
      if (s >= 0 && root[s] == s && last_use[s] == static_cast<int>(i)) done.push_back(s);
    for (int s : impl->steps[i].outputs)
      if (root[s] == s && last_use[s] == static_cast<int>(i)) done.push_back(s);
    std::sort(done.begin(), done.end());
    done.erase(std::unique(done.begin(), done.end()), done.end());
    for (int s : done) {
      Slot& slot = impl->slots[s];
      if (slot.kind == Slot::Kind::kArena)
        planner_for(slot).Free(slot.offset, static_cast<size_t>(NumBytes(slot.dtype, slot.shape)));
    }
    if (workspace) device_planner.Free(step.workspace_offset, workspace);
  }
  impl->arena_bytes = host_planner.size();
  impl->device_arena_bytes = device_planner.size();
  return std::make_shared<const Plan>(std::move(impl));
}

}  // namespace osprey
