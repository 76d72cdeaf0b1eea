#include <omp.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "core/float_env.h"
#include "kernels/cpu/bf16_support.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_scratch.h"
#include "kernels/reference/reference.h"
#include "ops/activation.h"
#include "ops/op_registry.h"
#include "ops/slice.h"
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

int CompileState::AddConstant(Tensor t) { return AddStoredConstant(weights ? weights->Intern(t) : std::move(t)); }

int CompileState::AddStoredConstant(Tensor t) {
  CompileValue v;
  v.typed = true;
  v.dtype = t.dtype();
  v.shape = t.shape();
  v.known = true;
  v.value = std::move(t);
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
  if (IsLoweredContribOp(node)) {
    for (const Node& lowered : LowerContribOp(st, node)) InferAndFoldNode(st, lowered);
    return;
  }
  if (IsLoweredFunctionOp(node)) {
    for (const Node& lowered : LowerFunctionOp(st, node)) InferAndFoldNode(st, lowered);
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
  const bool fused_steps = node.Has("_then");
  if (fused_steps) {  // a chain fused into an elementwise node (ops/activation.h), or a model claiming one
    (void)FusedSteps(node);
    if (ic.output_dtypes.size() != 1 || ic.output_dtypes[0] != DType::kF32)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": fused steps (_then) need one float32 output");
  }
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
  } else if (!std::all_of(outs.begin(), outs.end(), [](const Tensor& t) { return t.numel() == 0; })) {
    // (Outputs without elements have nothing to compute: see Step::no_output.)
    for (Tensor& t : outs) kc.outputs.push_back(&t);
    kernel(kc);
    if (fused_steps) ApplyFusedSteps(node, outs[0].data<float>(), outs[0].numel());
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

// The fusions made for the fast CPU kernels are on unless their variable is 0 (for comparisons):
// OSPREY_FUSE_1D (rank-3 convolutions and pools as rank-4 ones, LiftToRank4), OSPREY_FUSE_3D (unit-depth 3-D ones
// as 2-D ones, LiftToRank4), OSPREY_FUSE_DW (pointwise +
// depthwise convolution, FuseConvDepthwise), OSPREY_FUSE_PRELU (Conv + PRelu, FuseConvPRelu), OSPREY_FUSE_SCALE (a
// squeeze-and-excitation gate into the next 1x1 Conv, FuseConvInputScale), OSPREY_FUSE_VIEWS (an attention product
// reading its operands in place, FuseMatMulViews), OSPREY_FUSE_ATTENTION (the two attention products and the Softmax
// between them as one node, FuseAttentionViews), OSPREY_FUSE_CHAINS (unary steps into an elementwise node,
// FuseElementwiseChains), OSPREY_FUSE_INPUTS (a Concat and a BatchNormalization before a 1x1 Conv as its fused input,
// FuseConvInputs), OSPREY_FUSE_POOLS (a pool of a Concat as a Concat of pooled parts, PoolConcatParts),
// OSPREY_FUSE_CONV_POOL (a MaxPool after a first-layer Conv into it, FuseConvMaxPool); OSPREY_NDHWC (rank-5
// activations channels-last between 3-D layers, AssignLayouts).
bool FusionSwitchedOn(const char* variable) {
  const char* e = std::getenv(variable);
  return !(e && std::string(e) == "0");
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

// Plain loops converting NCHW <-> NHWC (or NCDHW <-> NDHWC); used when no fast reorder kernel is available.
class LayoutReorderRef : public Kernel {
 public:
  LayoutReorderRef(Shape shape, bool to_nhwc) : shape_(std::move(shape)), to_nhwc_(to_nhwc) {}
  const char* Name() const override { return "LayoutReorderRef"; }
  void Run(KernelContext& ctx) override {
    const int64_t n = shape_[0], c = shape_[1], hw = n * c > 0 ? NumElements(shape_) / (n * c) : 0;
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

// A step whose every output is a run of its input's bytes, output j starting `offsets[j]` bytes in: a Transpose
// between [N, C, H, W] stored channels-last and plain [N, H, W, C] (layout.cc), an op with OpTraits::same_bytes
// (Reshape, Flatten, ...), a Transpose moving only axes of extent 1, a Slice, Split or Gather taking one contiguous
// run per output (ByteRunsOf). The memory
// plan makes each output a view of its input where it can, and then there is nothing to copy.
class SameBytesCopy : public Kernel {
 public:
  SameBytesCopy(const char* name, std::vector<int64_t> offsets) : name_(name), offsets_(std::move(offsets)) {}
  const char* Name() const override { return name_; }
  void Run(KernelContext& ctx) override {
    for (size_t j = 0; j < offsets_.size(); ++j) {
      const int64_t n = static_cast<int64_t>(ctx.Out(static_cast<int>(j)).nbytes());
      OSPREY_CHECK(offsets_[j] + n <= static_cast<int64_t>(ctx.In(0).nbytes()));
      const char* src = static_cast<const char*>(ctx.In(0).raw()) + offsets_[j];
      char* dst = static_cast<char*>(ctx.Out(static_cast<int>(j)).raw());
      if (src == dst) continue;  // the memory plan made the output a view of the input
      constexpr int64_t kBlock = int64_t{1} << 16;
      const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= 64 * kBlock)
      for (int64_t b = 0; b < blocks; ++b)
        std::memcpy(dst + b * kBlock, src + b * kBlock, std::min(kBlock, n - b * kBlock));
    }
  }
  const std::vector<int64_t>& offsets() const { return offsets_; }

 private:
  const char* name_;
  std::vector<int64_t> offsets_;
};

// The same on a device: the memory plan makes its outputs views of its input in the device arena (no kernel at all);
// where it cannot (the input is a device constant), the bytes are copied on the device, on the step's stream.
class DeviceSameBytesCopy final : public SameBytesCopy {
 public:
  DeviceSameBytesCopy(DeviceBackend* backend, int ordinal, std::vector<int64_t> offsets)
      : SameBytesCopy("SameBytesOnDevice", std::move(offsets)), backend_(backend), ordinal_(ordinal) {}
  void Run(KernelContext& ctx) override {
    for (size_t j = 0; j < offsets().size(); ++j) {
      const size_t n = ctx.Out(static_cast<int>(j)).nbytes();
      OSPREY_CHECK(offsets()[j] + static_cast<int64_t>(n) <= static_cast<int64_t>(ctx.In(0).nbytes()));
      const char* src = static_cast<const char*>(ctx.In(0).raw()) + offsets()[j];
      void* dst = ctx.Out(static_cast<int>(j)).raw();
      if (src != dst && n > 0) backend_->CopyOnDevice(ordinal_, dst, src, n, ctx.stream);
    }
  }

 private:
  DeviceBackend* backend_;
  int ordinal_;
};

// Where each output of a live node lies in its input 0's bytes, when every output is one run of them: ops with
// OpTraits::same_bytes (offset 0), a Transpose that moves only axes of extent 1 (offset 0), a Slice with unit steps or a Split whose outputs are each one run (extent 1 on
// every axis before the output's first longer one, every axis after that one whole), a Gather of one known index
// along an axis with only single axes before it; on plain data of one type, at offsets that keep the arena's
// alignment. Empty otherwise.
std::vector<int64_t> ByteRunsOf(const CompileState& st, const Node& node) {
  if (node.inputs.empty() || node.inputs[0] < 0 || !node.domain.empty()) return {};
  const int in = node.inputs[0];
  for (int out : node.outputs)
    if (out < 0 || st.values[out].dtype != st.values[in].dtype || st.layouts[out] != st.layouts[in]) return {};
  if (OpRegistry::TraitsOf(node.op_type).same_bytes)
    return node.outputs.size() == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{};
  // A Cast to the type it already has (PyTorch exports of `x.to(torch.float32)` on float tensors: every LayerNorm of
  // Hugging Face's ConvNeXt V2) changes nothing.
  if ((node.op_type == "Cast" || node.op_type == "CastLike") && node.outputs.size() == 1) return {0};
  if (node.op_type == "Transpose" && node.outputs.size() == 1 && st.layouts[in] == Layout::kPlain) {
    // Moving only axes of extent 1 keeps every element where it was: ViT's [197, 1, 768] -> [1, 197, 768] around
    // its attention, tf2onnx's NHWC <-> NCHW Transposes of [N, 1, 1, C] gates.
    const Shape& shape = st.values[in].shape;
    const int64_t rank = static_cast<int64_t>(shape.size());
    const std::vector<int64_t> perm = TransposePerm(node, shape.size());
    if (static_cast<int64_t>(perm.size()) != rank) return {};
    int64_t last = -1;
    for (int64_t a : perm) {
      if (a < 0 || a >= rank) return {};
      if (shape[a] == 1) continue;
      if (a < last) return {};
      last = a;
    }
    return {0};
  }
  if ((node.op_type != "Slice" && node.op_type != "Split" && node.op_type != "Gather") ||
      st.layouts[in] != Layout::kPlain)
    return {};
  const Shape& shape = st.values[in].shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> stride(shape.size(), DTypeSize(st.values[in].dtype));
  for (int64_t a = rank - 2; a >= 0; --a) stride[a] = stride[a + 1] * shape[a + 1];
  // The first element of each output and the output's shape.
  std::vector<std::pair<std::vector<int64_t>, const Shape*>> boxes;
  if (node.op_type == "Slice") {
    SliceArgs args;
    const auto known = [&](int i) -> const Tensor* {
      const int v = i < static_cast<int>(node.inputs.size()) ? node.inputs[i] : -1;
      return v >= 0 && st.values[v].known ? &st.values[v].value : nullptr;
    };
    if (!ReadSliceArgs(node, st.opset, known, &args)) return {};
    const SliceRange range = ResolveSlice(shape, args, node);
    for (int64_t step : range.step)
      if (step != 1) return {};
    boxes.push_back({range.first, &st.values[node.outputs[0]].shape});
  } else if (node.op_type == "Gather") {  // one known index: the output is that index's block, reshaped
    const int v = node.inputs.size() == 2 ? node.inputs[1] : -1;
    if (v < 0 || !st.values[v].known || NumElements(st.values[v].shape) != 1) return {};
    const Tensor& index = st.values[v].value;
    if (index.dtype() != DType::kI64 && index.dtype() != DType::kI32) return {};
    int64_t axis = node.GetInt("axis", 0);
    int64_t at = index.dtype() == DType::kI64 ? index.data<int64_t>()[0] : index.data<int32_t>()[0];
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return {};
    if (at < 0) at += shape[axis];
    if (at < 0 || at >= shape[axis]) return {};  // the kernel reports it
    for (int64_t a = 0; a < axis; ++a)
      if (shape[a] != 1) return {};
    if (at * stride[axis] % static_cast<int64_t>(kArenaAlignment) != 0) return {};
    return {at * stride[axis]};
  } else {
    int64_t axis = node.GetInt("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return {};
    int64_t at = 0;
    for (int out : node.outputs) {
      std::vector<int64_t> first(shape.size(), 0);
      first[axis] = at;
      at += st.values[out].shape[axis];
      boxes.push_back({first, &st.values[out].shape});
    }
  }
  std::vector<int64_t> offsets;
  for (const auto& [first, out_shape] : boxes) {
    if (static_cast<int64_t>(out_shape->size()) != rank || NumElements(*out_shape) == 0) return {};
    // One run: the output has extent 1 on every axis before its first longer one, and all of every axis after it.
    int64_t longer = 0;
    while (longer < rank && (*out_shape)[longer] == 1) ++longer;
    for (int64_t a = longer + 1; a < rank; ++a)
      if ((*out_shape)[a] != shape[a]) return {};
    int64_t offset = 0;
    for (int64_t a = 0; a < rank; ++a) offset += first[a] * stride[a];
    if (offset % static_cast<int64_t>(kArenaAlignment) != 0) return {};
    offsets.push_back(offset);
  }
  return offsets;
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
  // The heap the plan's objects keep is charged to it (Plan::heap_bytes); a device plan's is not (a device backend
  // may take its memory from the heap, and the GPU budget counts that apart). The process-wide tuning choices are
  // read first, outside the measure.
  if (options.device.kind == Device::kHost && options.fast_kernels && options.tune) cpu::LoadKernelTuningChoices();
  const HeapMeasure measure(options.device.kind == Device::kHost, account, HeapMeasure::Phase::kCompile);
  const cpu::ThreadScratch::InUse scratch;  // kernel timings run kernels
  const FlushDenormals flush;  // constant folding and kernel timing compute as runs do
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
  if (options.fuse && options.fast_kernels && !on_device)
    LiftToRank4(st, FusionSwitchedOn("OSPREY_FUSE_1D"), FusionSwitchedOn("OSPREY_FUSE_3D"));
  if (options.fuse && options.fast_kernels && !on_device && bf16 == Bf16Use::kNo && FusionSwitchedOn("OSPREY_FUSE_DW"))
    FuseConvDepthwise(st, [&](const Node& n) {
      return CpuKernelFusesDepthwise(MakeBuildContext(st, n, nthreads, bf16, tune));
    });
  if (options.fuse && options.fast_kernels && !on_device && FusionSwitchedOn("OSPREY_FUSE_PRELU"))
    FuseConvPRelu(st,
                  [&](const Node& n) { return CpuKernelFusesPRelu(MakeBuildContext(st, n, nthreads, bf16, tune)); });
  if (options.fuse && options.fast_kernels && !on_device && FusionSwitchedOn("OSPREY_FUSE_SCALE"))
    FuseConvInputScale(st);
  if (options.fuse && options.fast_kernels && !on_device && bf16 == Bf16Use::kNo &&
      FusionSwitchedOn("OSPREY_FUSE_VIEWS"))
    FuseMatMulViews(st);
  if (options.fuse && options.fast_kernels && !on_device && bf16 == Bf16Use::kNo &&
      FusionSwitchedOn("OSPREY_FUSE_ATTENTION"))
    FuseAttentionViews(
        st, [&](const Node& n) { return CpuKernelTakesAttention(MakeBuildContext(st, n, nthreads, bf16, tune)); });
  if (options.fuse && options.fast_kernels && !on_device && FusionSwitchedOn("OSPREY_FUSE_CHAINS"))
    FuseElementwiseChains(st);
  if (options.fuse && options.fast_kernels && !on_device && FusionSwitchedOn("OSPREY_FUSE_POOLS")) PoolConcatParts(st);
  if (options.fast_kernels && !on_device) {
    AssignLayouts(
        st, [&](int i) { return CpuKernelSupportsNhwc(MakeBuildContext(st, st.nodes[i], nthreads, bf16, tune)); },
        FusionSwitchedOn("OSPREY_NDHWC"));
    if (options.fuse && bf16 == Bf16Use::kNo && FusionSwitchedOn("OSPREY_FUSE_INPUTS"))
      FuseConvInputs(
          st, [&](const Node& n) { return CpuKernelTakesFusedInput(MakeBuildContext(st, n, nthreads, bf16, tune)); });
    if (options.fuse && bf16 == Bf16Use::kNo && FusionSwitchedOn("OSPREY_FUSE_CONV_POOL"))
      FuseConvMaxPool(st,
                      [&](const Node& n) { return CpuKernelFusesPool(MakeBuildContext(st, n, nthreads, bf16, tune)); });
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

  std::set<int> made_on_device;  // slots written by device steps
  for (size_t ni = 0; ni < st.nodes.size(); ++ni) {
    Node& node = st.nodes[ni];
    Step step;
    step.threads = nthreads;
    for (int v : node.inputs) step.inputs.push_back(slot_for(v));
    for (int v : node.outputs) step.outputs.push_back(slot_for(v));
    step.no_output = !node.outputs.empty() && std::all_of(node.outputs.begin(), node.outputs.end(), [&](int v) {
      return v < 0 || NumElements(st.values[v].shape) == 0;
    });
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
      step.fast = std::make_unique<SameBytesCopy>("TransposeLayoutCopy", std::vector<int64_t>{0});
    } else if (std::vector<int64_t> runs = ByteRunsOf(st, node); !runs.empty()) {
      // On the device where its input is made there (then it is a view in the device arena), else on the host.
      if (on_device && step.inputs[0] >= 0 && made_on_device.count(step.inputs[0])) {
        step.fast = std::make_unique<DeviceSameBytesCopy>(backend, options.device.ordinal, std::move(runs));
        step.on_device = true;
      } else {
        step.fast = std::make_unique<SameBytesCopy>("SameBytesCopy", std::move(runs));
      }
    } else if (st.transparent[ni]) {
      // Elementwise kernel on physical shapes; plain operands are viewed as [N, H, W, C].
      step.reference = FindReferenceKernel(node.op_type);
      OSPREY_CHECK(step.reference != nullptr);
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        int v = node.inputs[k];
        bool view = v >= 0 && st.layouts[v] == Layout::kPlain && !(k > 0 && node.inputs.size() > 1 &&
                                                                   NumElements(st.values[v].shape) == 1 &&
                                                                   st.values[v].shape.size() <= 1);
        step.input_views.push_back(view ? ChannelsLastView(st.values[v].shape, st.values[node.outputs[0]].shape.size())
                                        : Shape{});
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
      if (options.fast_kernels && !step.fast && tune && KnownToRunOnOneThread(st, node, nthreads, bf16)) {
        step.fast = CreateCpuKernel(MakeBuildContext(st, node, 1, bf16, tune));
        if (step.fast) step.threads = 1;
      }
      if (options.fast_kernels && !step.fast)
        step.fast = CreateCpuKernel(MakeBuildContext(st, node, nthreads, bf16, tune));
      if (step.fast && !step.on_device && tune && nthreads > 1 && step.threads != 1) {
        std::unique_ptr<Kernel> serial = SingleThreadKernelIfFaster(st, node, *step.fast, nthreads, bf16, [&] {
          return CreateCpuKernel(MakeBuildContext(st, node, 1, bf16, tune));
        });
        if (serial) {
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
    if (step.on_device)
      for (int s : step.outputs)
        if (s >= 0) made_on_device.insert(s);
    step.fused_steps = node.Has("_then");
    step.node = std::move(node);
    impl->steps.push_back(std::move(step));
  }

  for (int id : graph.outputs) {
    int s = slot_for(id);
    impl->output_slots.push_back(s);
    impl->output_specs.push_back({impl->slots[s].dtype, impl->slots[s].shape});
  }
  if (on_device) PlaceOnDevice(*impl, weights);

  // Memory plan: arena offsets by liveness, first fit. The output of a SameBytesCopy step (a Transpose between
  // NHWC-stored [N, C, H, W] and plain [N, H, W, C], a Reshape, ...) shares its input's bytes when both live in the
  // arena: values are never written after their step, so the two slots are one buffer, freed when the last of them
  // dies, and the copy kernel finds nothing to do. Such an output of a graph input (a tf2onnx model's NHWC -> NCHW
  // Transpose) becomes a view of the caller's tensor (Slot::Kind::kView): the input outlives the run and is never
  // written either.
  std::vector<int> root(impl->slots.size());
  std::vector<size_t> delta(impl->slots.size(), 0);  // a view's bytes start this far into its root's
  for (size_t s = 0; s < root.size(); ++s) root[s] = static_cast<int>(s);
  for (size_t i = 0; i < impl->steps.size(); ++i) {
    const Step& step = impl->steps[i];
    const auto* copy = dynamic_cast<const SameBytesCopy*>(step.fast.get());
    if (!copy) continue;
    const int in = step.inputs[0];
    for (size_t j = 0; j < step.outputs.size(); ++j) {
      const int out = step.outputs[j];
      const Slot& from = impl->slots[root[in]];
      Slot& slot = impl->slots[out];
      const bool of_input = from.kind == Slot::Kind::kInput && from.device == Device::kHost &&
                            slot.device == Device::kHost && NumElements(slot.shape) > 0;
      if ((from.kind != Slot::Kind::kArena && !of_input) || slot.kind != Slot::Kind::kArena ||
          from.device != slot.device)
        continue;
      root[out] = root[in];
      delta[out] = delta[in] + static_cast<size_t>(copy->offsets()[j]);
      if (of_input) {
        slot.kind = Slot::Kind::kView;
        slot.view_of = root[in];
        slot.offset = delta[out];
      }
    }
  }
  std::vector<int> last_use(impl->slots.size(), -1);
  for (size_t i = 0; i < impl->steps.size(); ++i) {
    for (int s : impl->steps[i].inputs)
      if (s >= 0) last_use[root[s]] = std::max(last_use[root[s]], static_cast<int>(i));
    for (int s : impl->steps[i].outputs)
      if (last_use[root[s]] < static_cast<int>(i)) last_use[root[s]] = static_cast<int>(i);
  }
  // In place: a host step whose kernel may write output 0 over input k (Kernel::MayOverwriteInput: a convolution's
  // residual, which it would otherwise copy into its output before summing onto it) gets that input's buffer when the
  // input's bytes die at this step, no other input of the step reads them, and both are arena values of one size and
  // layout. The output's group (it and the views made of it later) joins the input's, whose life now lasts as long as
  // the output's.
  std::vector<std::vector<int>> group(impl->slots.size());  // per root: the slots sharing its bytes
  for (size_t t = 0; t < root.size(); ++t) group[root[t]].push_back(static_cast<int>(t));
  for (size_t i = 0; i < impl->steps.size(); ++i) {
    const Step& step = impl->steps[i];
    if (step.on_device || !step.fast || step.outputs.empty()) continue;
    const int out = step.outputs[0];
    const Slot& out_slot = impl->slots[out];
    if (root[out] != out || out_slot.kind != Slot::Kind::kArena || out_slot.device != Device::kHost) continue;
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int in = step.inputs[k];
      if (in < 0 || !step.fast->MayOverwriteInput(static_cast<int>(k))) continue;
      const int r = root[in];
      const Slot& in_slot = impl->slots[r];
      const int64_t bytes = NumBytes(out_slot.dtype, out_slot.shape);
      if (in_slot.kind != Slot::Kind::kArena || in_slot.device != Device::kHost || delta[in] != 0 ||
          last_use[r] != static_cast<int>(i) || impl->slots[in].layout != out_slot.layout ||
          NumBytes(in_slot.dtype, in_slot.shape) != bytes ||
          NumBytes(impl->slots[in].dtype, impl->slots[in].shape) != bytes)
        continue;
      bool shared = false;
      for (size_t j = 0; j < step.inputs.size(); ++j)
        shared |= j != k && step.inputs[j] >= 0 && root[step.inputs[j]] == r;
      if (shared) continue;
      for (int t : group[out]) root[t] = r;
      group[r].insert(group[r].end(), group[out].begin(), group[out].end());
      group[out].clear();
      last_use[r] = std::max(last_use[r], last_use[out]);
      break;
    }
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
                                 : impl->slots[root[s]].offset + delta[s];
    }
    // A step's workspace lives for that step only (steps run in order, device steps on one stream).
    Step& step = impl->steps[i];
    const size_t workspace = step.fast ? step.fast->WorkspaceBytes() : 0;
    ArenaPlanner& workspace_planner = step.on_device ? device_planner : host_planner;
    step.workspace_bytes = workspace;
    if (workspace) step.workspace_offset = workspace_planner.Allocate(workspace);
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
    if (workspace) workspace_planner.Free(step.workspace_offset, workspace);
  }
  impl->arena_bytes = host_planner.size();
  impl->device_arena_bytes = device_planner.size();
  impl->ChargeHeap(measure.Grown());
  return std::make_shared<const Plan>(std::move(impl));
}

}  // namespace osprey
