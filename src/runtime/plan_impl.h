#pragma once
#include <chrono>
// Internal layout of a compiled Plan, shared by compile.cc (builds it) and plan.cc (runs it).
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/kernel.h"
#include "osprey/runtime.h"
#include "runtime/arena_pool.h"

namespace osprey {

/// Where a value lives during a run.
struct Slot {
  // kView: `offset` bytes into graph input slot `view_of` (a Reshape or contiguous Slice of a graph input).
  enum class Kind { kConstant, kInput, kArena, kOutput, kView };
  Kind kind = Kind::kArena;
  DType dtype = DType::kF32;
  Shape shape;           // logical
  Layout layout = Layout::kPlain;  // kNhwc: stored as [N, H, W, C]
  Device device = Device::kHost;   // kArena slots on a device live in the run's device arena
  Tensor constant;       // kConstant
  int input_index = -1;  // kInput
  size_t offset = 0;     // kArena: byte offset in the arena; kView: in the input's bytes
  int view_of = -1;      // kView
};

struct Step {
  Node node;               // possibly rewritten by fusion passes
  std::vector<int> inputs;   // slot ids; -1 = omitted
  std::vector<int> outputs;  // slot ids
  // Layout-transparent steps (elementwise, Concat) on channels-last data run their reference kernel on physical
  // shapes: a plain input gets this view shape (empty = as stored). See layout.cc.
  std::vector<Shape> input_views;
  std::vector<char> has_view;
  ReferenceKernel reference = nullptr;
  // Every output has no elements: nothing to compute, so the step is skipped. A kernel looping over the outer dims of
  // an empty tensor ([2^40, 0] into LayerNormalization, Concat, CumSum, TopK or ReverseSequence: 2^40 empty rows)
  // would otherwise spin for hours on a request of zero bytes, and InstanceNormalization divided by N * C = 0.
  bool no_output = false;
  // The node carries fused steps (`_then`, ops/activation.h): applied to output 0 after the reference kernel (the
  // fast kernels apply them themselves).
  bool fused_steps = false;
  std::unique_ptr<Kernel> fast;
  // Runs on the plan's device (its fast kernel came from DeviceBackend::CreateKernel, or it is a copy to the device).
  bool on_device = false;
  // The fast kernel's workspace (Kernel::WorkspaceBytes): [workspace_offset, + workspace_bytes) of the run's arena on
  // the step's side (device or host).
  size_t workspace_offset = 0, workspace_bytes = 0;
  // OpenMP threads this step runs with (1 for steps too small to split: SerialWorkThreshold, compile.cc).
  int threads = 1;
};

/// Buffers of a plan's large graph outputs (at least Allocator::mmap_threshold() bytes), reused across runs: a fresh
/// mapped block is zeroed and faulted in page by page by the kernel, ~0.3 us per KB on the Zen 4 host (a 2.9 MB
/// logits tensor cost ~0.9 ms per run, more than the Softmax writing it). The handle `Take` returns gives its block
/// back to the pool when the caller drops the last tensor using it (or frees it, when the plan is gone); idle blocks
/// go with the plan's arenas (Plan::TrimArenas).
class OutputPool {
 public:
  static std::shared_ptr<Buffer> Take(const std::shared_ptr<OutputPool>& pool, int slot, size_t bytes,
                                      const std::shared_ptr<MemoryAccount>& account);
  size_t Trim(double idle_seconds);

 private:
  static constexpr size_t kMaxIdlePerSlot = 4;
  void Give(int slot, std::shared_ptr<Buffer> buffer);
  std::mutex mu_;
  std::map<int, std::vector<IdleBuffer>> idle_;
};

struct Plan::Impl {
  int opset = 17;
  int num_threads = 1;
  std::vector<Slot> slots;
  std::vector<Step> steps;
  std::vector<int> output_slots;  // per graph output
  std::vector<TensorSpec> output_specs;
  size_t arena_bytes = 0;
  std::shared_ptr<MemoryAccount> account;
  // Heap held by the plan's objects (Plan::heap_bytes), charged to `account` until the plan is freed: measured around
  // its compile (CompileSubgraph) and its first run (first_run).
  mutable std::atomic<int64_t> heap_bytes{0};
  mutable std::atomic<bool> first_run{true};
  void ChargeHeap(int64_t bytes) const {
    if (bytes <= 0) return;
    heap_bytes.fetch_add(bytes);
    if (account) account->Add(bytes);
  }
  ~Impl() {
    if (account && heap_bytes.load() > 0) account->Add(-heap_bytes.load());
  }
  // The host arena of a run comes from the process's ArenaPool (runtime/arena_pool.h), shared by every plan.
  mutable std::mutex arena_mu;
  // Device plans (CompileOptions::device): the device, its backend and one device arena per concurrent run (values on
  // the device and device steps' workspaces), pooled and trimmed like the host arenas.
  DeviceSpec device;
  DeviceBackend* backend = nullptr;
  size_t device_arena_bytes = 0;
  mutable std::vector<IdleBuffer> free_device_arenas;
  // CUDA Graphs: steps [graph_begin, graph_end) are device kernels only (PlaceOnDevice puts uploads before them and
  // downloads after); each device arena gets its own graph of them (the addresses differ), captured at the arena's
  // second run (the first warms the libraries up) and replayed after. Empty range: no graphs. Under arena_mu.
  size_t graph_begin = 0, graph_end = 0;
  struct ArenaGraph {
    int runs = 0;
    std::shared_ptr<void> graph;
  };
  mutable std::map<const Buffer*, ArenaGraph> arena_graphs;
  mutable std::atomic<bool> graphs_off{false};  // a capture failed: run step by step from now on
  std::shared_ptr<OutputPool> output_pool = std::make_shared<OutputPool>();
  // The plans of If branches chosen at run time (runtime_if.cc), for TrimArenas and KernelCounts.
  std::vector<std::shared_ptr<const Plan>> sub_plans;
  void ReturnDeviceArena(std::shared_ptr<Buffer> arena) const {
    std::lock_guard<std::mutex> lock(arena_mu);
    free_device_arenas.push_back({std::move(arena), std::chrono::steady_clock::now()});
  }
};

/// How much the heap no account sees (Allocator::UntrackedHeapBytes) grew over a scope: a host plan's compile and its
/// first run. Only the outermost measure on a thread measures (a compile's sub-plans and their first runs are inside
/// their parent's), and none where the C library cannot count.
///
/// glibc's count (mallinfo2) walks every free chunk of the heap: 0.05 ms in a fresh process, 3 ms once a process had
/// compiled ~100 shapes of an OCR recogniser (17,000 free chunks), four times per new shape: a quarter of its first
/// call. So a model's (`account`'s) first kSampled compiles and first runs are measured, then one in
/// kEstimatesPerMeasure + 1, and the others are charged the mean of its last kSampled measures (plans of one model at
/// other shapes hold the same kernels and primitives; the later measures follow what a plan adds once the process's
/// caches are full: PP-OCRv4's recogniser 3.5 MB for its first shapes, 1.7 after ~100).
class HeapMeasure {
 public:
  enum class Phase { kCompile, kFirstRun };
  static constexpr int kSampled = 4;
  static constexpr int kEstimatesPerMeasure = 15;
  HeapMeasure(bool wanted, const std::shared_ptr<MemoryAccount>& account, Phase phase);
  ~HeapMeasure();
  HeapMeasure(const HeapMeasure&) = delete;
  HeapMeasure& operator=(const HeapMeasure&) = delete;
  /// Bytes grown since construction, or the account's mean (0 when shrunk, or when this measure does not measure).
  int64_t Grown() const;
  /// Readings of the C library's count so far in this process (two per measure taken), for tests.
  static int64_t Readings();

 private:
  int64_t before_ = -1;
  int64_t estimate_ = -1;  // the account's mean, when it had kSampled measures of this phase
  std::shared_ptr<MemoryAccount> account_;
  Phase phase_ = Phase::kCompile;
};

/// Compile() for a subgraph of a model being compiled: `*subgraph_nodes` is the model-wide count of subgraph nodes
/// (CompileState::subgraph_nodes), read at the start and updated at the end, so that a model's loops and branches
/// share one bound however they nest.
std::shared_ptr<const Plan> CompileSubgraph(const Graph& graph, const std::vector<TensorSpec>& inputs,
                                            const CompileOptions& options, WeightStore* weights,
                                            std::shared_ptr<MemoryAccount> account, int64_t* subgraph_nodes);

/// Device placement (device_plan.cc): after kernels are created, every input a step reads on the other side gets a
/// copy — constants uploaded once at compile time (shared through `weights` when given), other values by a copy step
/// inserted before their first reader there — and a device step's graph output is written to the device and copied
/// back into the host output slot. Steps' order is otherwise kept.
void PlaceOnDevice(Plan::Impl& impl, WeightStore* weights);

/// Whether a step is one of the copies PlaceOnDevice inserts.
bool IsDeviceCopy(const Step& step);

struct RuntimeIf;  // inline_if.h

/// A value during compilation: its type, and its contents when known at compile time.
struct CompileValue {
  bool typed = false;
  DType dtype = DType::kF32;
  Shape shape;
  bool known = false;
  Tensor value;
};

/// Mutable compile-time graph: nodes still to run (not folded) and every value's type/value.
struct CompileState {
  const Graph* graph = nullptr;
  int opset = 17;
  std::vector<CompileValue> values;
  std::vector<Node> nodes;  // live (unfolded) nodes, in execution order
  std::vector<char> is_graph_output;
  WeightStore* weights = nullptr;
  // Nodes copied by unrolling Loops and Scans and compiled in If branches so far, nested ones and those of branch
  // compiles included (bounded by kMaxLoopNodes, inline_loop.h: one budget for the whole model).
  int64_t subgraph_nodes = 0;
  // For an If whose condition is known only at run time (runtime_if.cc): this compile's options and memory account,
  // with which its branches are compiled, and the compiled branches (a live If node's kRuntimeIfAttr indexes them).
  CompileOptions options;
  std::shared_ptr<MemoryAccount> account;
  std::vector<std::shared_ptr<const RuntimeIf>> runtime_ifs;
  // Filled by AssignLayouts: per value, and per live node whether it runs on physical (channels-last) shapes
  // (kTransparentElementwise), or is a Transpose between NHWC-stored [N, C, H, W] and plain [N, H, W, C], which are
  // the same bytes (kTransparentCopy).
  std::vector<Layout> layouts;
  std::vector<char> transparent;
  static constexpr char kTransparentElementwise = 1, kTransparentCopy = 2;
  int AddConstant(Tensor t);
  /// AddConstant for a tensor the weight store already holds (WeightStore::Derive): not interned again.
  int AddStoredConstant(Tensor t);
  /// A new value of the given type, not known at compile time.
  int AddValue(DType dtype, Shape shape);
};

/// After AssignLayouts: a Concat and/or an inference BatchNormalization (its ReLU too) read only by a 1x1 Conv on
/// channels-last values, as the Conv's fused input parts and affine (ops/conv_input_scale.h), where
/// `fast_kernel_takes` the fused node (fusion.cc).
void FuseConvInputs(CompileState& state, const std::function<bool(const Node&)>& fast_kernel_takes);

/// After AssignLayouts: a MaxPool reading only a first-layer Conv's channels-last output, as the Conv's fused pool
/// (ops/fused_pool.h), where `fast_kernel_takes` the fused node (fusion.cc).
void FuseConvMaxPool(CompileState& state, const std::function<bool(const Node&)>& fast_kernel_takes);

/// Internal op inserted by AssignLayouts: converts input 0 (layout attr "from") to output 0 (layout attr "to").
inline constexpr const char* kLayoutReorderOp = "_LayoutReorder";

/// Channels-last layout assignment (layout.cc): keeps rank-4 float32 activations NHWC between kernels that take it,
/// runs elementwise ops and Concat on them in place of reorders, and inserts reorders where plain data is needed.
/// `supports_nhwc(node index)` says whether that node's fast kernel takes NHWC; `rank5`: rank-5 values may be
/// channels-last too (NDHWC).
void AssignLayouts(CompileState& state, const std::function<bool(int)>& supports_nhwc, bool rank5);

/// View of a plain operand (rank <= `rank`, right-aligned to it) as [N, spatial..., C], for transparent steps of
/// that rank.
Shape ChannelsLastView(const Shape& logical, size_t rank);

/// Rewrites decomposed LayerNorm / GELU / MatMul+bias into single nodes (fusion_patterns.cc).
void FuseTransformerPatterns(CompileState& state);

/// Rewrites the channel shuffle (Concat -> Reshape -> Transpose -> Reshape [-> channel Slices]) into one
/// _ChannelShuffle node (fusion_patterns.cc).
void FuseDataMovementPatterns(CompileState& state);

/// MaxPool / AveragePool of a channel Concat => Concat of the pooled parts, where the pool shrinks its input
/// (fusion_patterns.cc; CPU fast plans, `OSPREY_FUSE_POOLS=0` off).
void PoolConcatParts(CompileState& state);

/// Fusion passes on live nodes (docs/architecture.md): BN folding into Conv, Conv + Add residual, activation fusion.
/// TensorFlow-export patterns (fusion_tf.cc): Keras hard-swish/hard-sigmoid chains to one node; NCHW -> NHWC
/// Transposes sunk below elementwise ops and cancelled against their inverse; chains of Transposes and unit-dim
/// Reshapes with elementwise ops between that leave x in its order collapsed into the ops on x.
void FuseTfExportPatterns(CompileState& state);

/// Quantised models (fusion_qdq.cc): a QLinearConv with constant weights becomes DequantizeLinear -> fp32 Conv ->
/// QuantizeLinear; then a per-tensor QuantizeLinear -> DequantizeLinear pair on a float activation becomes
/// Div -> Round -> Clip -> Mul, bit-identical, vectorised and channels-last capable.
void FuseQuantizeDequantizePairs(CompileState& state);

void RunFusionPasses(CompileState& state);

/// Conv / MaxPool / AveragePool / BatchNormalization nodes as rank-4 ones on the same bytes, with the elementwise ops
/// between them: `rank3`, those on [N, C, W] as [N, C, 1, W], so that 1-D networks reach the channels-last kernels;
/// `unit_depth`, 3-D ones with a 1 x kh x kw window on [N, C, 1, H, W] as 2-D ones on [N, C, H, W] (fusion_1d.cc;
/// CPU fast plans, `OSPREY_FUSE_1D=0` and `OSPREY_FUSE_3D=0` off).
void LiftToRank4(CompileState& state, bool rank3, bool unit_depth);

/// A pointwise Conv whose output only a 3x3 depthwise Conv (stride 1 or 2, pads 1) reads becomes one Conv carrying
/// the depthwise part (ops/fused_depthwise.h), where `fast_kernel_takes(fused node)`; for plans on the CPU's fast
/// kernels (fusion.cc).
void FuseConvDepthwise(CompileState& state, const std::function<bool(const Node&)>& fast_kernel_takes);
/// Conv -> PRelu (per-channel constant slopes) as one Conv with `_prelu` (ops/activation.h) where `fast_kernel_takes`
/// the fused node (fusion.cc).
void FuseConvPRelu(CompileState& state, const std::function<bool(const Node&)>& fast_kernel_takes);
/// Mul(x, s) -> 1x1 Conv, s one factor per image and input channel computed at run time (a squeeze-and-excitation
/// gate), as one Conv with `_input_scale` (ops/conv_input_scale.h); for plans on the CPU's fast kernels.
void FuseConvInputScale(CompileState& state);
/// MatMuls of two computed operands (attention products) read their operands through the Transposes, Reshapes and
/// unit-step Slices that made them, and write through a Transpose after them, as one _MatMulViews node
/// (ops/matmul_views.h), a scalar Div or Mul of an operand folded in; for plans on the CPU's fast kernels (fusion.cc).
void FuseMatMulViews(CompileState& state);
/// A product of views (or MatMul), a Softmax over its last axis and the product of that with a third operand, each
/// read by the next alone, as one _AttentionViews node (ops/matmul_views.h) where `fast_kernel_takes` it (fusion.cc).
void FuseAttentionViews(CompileState& state, const std::function<bool(const Node&)>& fast_kernel_takes);
/// Chains of unary activations and fake quantisations after an elementwise node as its fused steps (`_then`,
/// ops/activation.h; fusion.cc).
void FuseElementwiseChains(CompileState& state);

/// Whether a step of a multi-thread plan is already known to run on one thread (OSPREY_STEP_THREADS=1, or a verdict
/// SingleThreadKernelIfFaster remembered for its description): then only its one-thread kernel is built (a new input
/// shape builds every kernel again).
bool KnownToRunOnOneThread(const CompileState& state, const Node& node, int threads, Bf16Use bf16);

/// For a step of a multi-thread plan whose fast kernel is `parallel`: the kernel `build_serial` makes (for one
/// thread) when the step is a small Gemm/MatMul/LSTM/GRU/RNN and one thread is clearly faster on this machine
/// (timed once per step description and process; OSPREY_STEP_THREADS=0/1 forces never/always), else null
/// (step_threads.cc).
std::unique_ptr<Kernel> SingleThreadKernelIfFaster(const CompileState& state, const Node& node, Kernel& parallel,
                                                   int threads, Bf16Use bf16,
                                                   const std::function<std::unique_ptr<Kernel>()>& build_serial);

/// com.microsoft.DynamicQuantizeLSTM node `node` as the ONNX LSTM it approximates, its int8/uint8 weights (which must
/// be constants) dequantized and transposed into new constants of `state` (dynamic_quantize_lstm.cc).
Node DequantizedLstm(CompileState& state, const Node& node);

/// Whether every dim of a compile-time shape is known (no -1 of a dynamic dim): the passes that write shapes as
/// constants need it.
inline bool ConcreteShape(const Shape& s) {
  for (int64_t d : s)
    if (d < 0) return false;
  return true;
}

/// A node of `op` named `name` reading `inputs` and writing `outputs`, for the passes that make nodes.
inline Node MakeNode(std::string op, std::string name, std::vector<int> inputs, std::vector<int> outputs) {
  Node n;
  n.op_type = std::move(op);
  n.name = std::move(name);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

/// Whether `node` is one of ONNX Runtime's com.microsoft ops osprey lowers (its transformer optimiser's Gelu, FastGelu,
/// BiasGelu, QuickGelu, SkipLayerNormalization, Attention, MultiHeadAttention; QLinearMul/Softmax/Concat; a saved
/// optimised model's FusedConv, FusedGemm, FusedMatMul, DynamicQuantizeMatMul), and those default-domain nodes
/// (contrib_ops.cc).
bool IsLoweredContribOp(const Node& node);
std::vector<Node> LowerContribOp(CompileState& state, const Node& node);
/// Whether `node` is one of ONNX's function ops osprey lowers to the ops that define them (Attention,
/// RMSNormalization, RotaryEmbedding, Swish, SwiGLU; ORT's SimplifiedLayerNormalization; function_ops.cc), and those
/// nodes.
bool IsLoweredFunctionOp(const Node& node);
std::vector<Node> LowerFunctionOp(CompileState& state, const Node& node);

struct Activation;  // ops/activation.h
/// The activation a live unary node computes when it may be fused into its producer (OpTraits::fusable_activation
/// and ActivationOfNode, with the compile-time values of its inputs), else false (fusion.cc).
bool FusableActivationOf(const CompileState& state, const Node& node, Activation* act);
/// The values of constant k per channel of a tensor of shape ys (rank >= 3, channels on axis 1), when k broadcasts
/// against it along the channel axis only ([C, 1, 1], [1, C, 1, 1] or a single value); false otherwise (fusion.cc).
bool PerChannelConstant(const CompileState& st, int k, const Shape& ys, std::vector<float>* values);

}  // namespace osprey
