#pragma once
// Op schemas: arity, attribute checks and the shape/dtype function of each op. Kernels live in src/kernels/.
#include <functional>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// What InferContext::Value throws (kUnsupported) for an input whose value is not known when the model is compiled: it
/// names the node and the input, so that a graph runner run on the host can compile the graph again with the small
/// integer inputs that value follows from compiled in (runtime/segments.cc: a Slice's end that a host-run Loop's
/// step count gives).
class ValueNotKnown : public Error {
 public:
  ValueNotKnown(const std::string& message, std::string node_name, int input)
      : Error(ErrorCode::kUnsupported, message), node_name_(std::move(node_name)), input_(input) {}
  const std::string& node_name() const { return node_name_; }
  int input() const { return input_; }

 private:
  std::string node_name_;
  int input_;
};

/// What shape inference sees of one node when input shapes are concrete. Input values are known when the input is
/// a constant (or was folded to one), which lets shape arithmetic (Shape -> Gather -> Div -> Concat -> Reshape) resolve.
struct InferContext {
  const Node& node;
  int opset = 17;
  std::vector<bool> present;            // input i given (not omitted)
  std::vector<DType> input_dtypes;      // valid where present
  std::vector<Shape> input_shapes;      // valid where present
  std::vector<const Tensor*> input_values;  // non-null where the value is known at compile time
  // Filled by the infer function, one per node output:
  std::vector<DType> output_dtypes;
  std::vector<Shape> output_shapes;

  int num_inputs() const { return static_cast<int>(present.size()); }
  bool Has(int i) const { return i < num_inputs() && present[i]; }
  /// Known value of input i; throws kUnsupported naming the node when it is only known at run time.
  const Tensor& Value(int i) const;
  /// Sets output i.
  void SetOutput(int i, DType dtype, Shape shape);
  /// Throws kInvalidArgument "<node>: <message>".
  [[noreturn]] void Fail(const std::string& message) const;
};

using InferFn = std::function<void(InferContext&)>;

/// What compile passes may assume about an op without naming it; set where the op is registered (src/ops/*.cc).
struct OpTraits {
  /// Elementwise on input 0, any further inputs being scalar parameters (Clip's min and max): the value at each
  /// position depends on the input at that position only, so the op runs as is on any memory layout. The layout pass
  /// keeps channels-last data through it (runtime/layout.cc) and a channel Transpose sinks below it (fusion_tf.cc).
  bool layout_transparent = false;
  /// Elementwise over all its inputs with numpy broadcasting (Add, Max, Sum, Pow, ...): exact on channels-last data
  /// when every operand is viewed the same way (runtime/layout.cc).
  bool layout_transparent_broadcast = false;
  /// May become the fused activation (post-op) of the Conv, Gemm, MatMul or BatchNormalization that feeds it, as the
  /// ops/activation.h Activation that ActivationOfNode reads from it (runtime/fusion.cc).
  bool fusable_activation = false;
  /// The output depends on the input's shape only (Shape, Size): computed when the model is compiled even when the
  /// input's value is not known (runtime/compile.cc).
  bool shape_only = false;
  /// Output 0 is input 0's bytes unchanged, only its shape may differ (Reshape, Flatten, Squeeze, Unsqueeze,
  /// Identity): in a host plan the memory plan gives both one buffer and the step copies nothing (runtime/compile.cc).
  bool same_bytes = false;
  /// Its output shapes depend on its input values (NonZero, NonMaxSuppression, Compress): a model is cut there into
  /// plans compiled for the shapes each run produces (runtime/segments.cc); the op runs between them on the host
  /// (kernels/reference/data_dependent.cc). Its infer function refuses it where no cut can be made (in a subgraph).
  bool data_dependent = false;
};

struct OpSchema {
  std::string op_type;
  int min_inputs = 1;
  int max_inputs = 1;
  int min_outputs = 1;
  int max_outputs = 1;
  InferFn infer;
  OpTraits traits;
};

/// Immutable table of every op osprey knows. Built once on first use from the per-family Register* functions.
class OpRegistry {
 public:
  static const OpRegistry& Get();
  const OpSchema* Find(const std::string& op_type) const;
  std::vector<std::string> Names() const;
  void Add(OpSchema schema);
  /// Adds `op_type` taking min..max inputs and outputs, its shapes from `infer`.
  void Add(std::string op_type, int min_inputs, int max_inputs, int min_outputs, int max_outputs, InferFn infer,
           OpTraits traits = {}) {
    Add(OpSchema{std::move(op_type), min_inputs, max_inputs, min_outputs, max_outputs, std::move(infer), traits});
  }
  /// The traits of `op_type`; all false for an op osprey does not know.
  static const OpTraits& TraitsOf(const std::string& op_type);

 private:
  std::vector<OpSchema> schemas_;
};

// Per-family registration, one per src/ops/<family>.cc. Called by OpRegistry::Get().
void RegisterElementwiseOps(OpRegistry& r);   // unary, binary, variadic, Where, Clip, Cast, comparisons
void RegisterNnOps(OpRegistry& r);            // Conv, ConvTranspose, pools, norms, MatMul, Gemm, softmaxes
void RegisterEinsumOps(OpRegistry& r);        // Einsum (einsum.cc; two-input contractions become MatMul)
void RegisterGridSampleOps(OpRegistry& r);    // GridSample, 2-D (grid_sample.cc)
void RegisterReductionOps(OpRegistry& r);     // Reduce*, ArgMax/ArgMin, TopK
void RegisterShapeOps(OpRegistry& r);         // Reshape ... Resize, Shape, Constant*, Range, Identity, Dropout
void RegisterImageOps(OpRegistry& r);         // osprey-domain image ops (docs/image-ops.md)
void RegisterAugmentOps(OpRegistry& r);       // osprey-domain augmentation image ops (docs/augment.md)
void RegisterInternalOps(OpRegistry& r);      // ops made by fusion passes: _ChannelShuffle (internal_ops.cc)
void RegisterRecurrentOps(OpRegistry& r);     // RNN, GRU, LSTM (recurrent.cc)
void RegisterControlFlowOps(OpRegistry& r);   // If, folded when the model is compiled (control_flow.cc)
void RegisterContribOps(OpRegistry& r);       // FastGelu, BiasGelu, QuickGelu, SkipLayerNormalization (contrib.cc)
void RegisterQuantizeOps(OpRegistry& r);      // QuantizeLinear, DequantizeLinear, QLinearConv, ... (quantize.cc)
void RegisterSignalOps(OpRegistry& r);        // DFT, STFT, MelWeightMatrix (signal.cc)
void RegisterFoldOps(OpRegistry& r);          // Col2Im, MaxUnpool (fold.cc)
void RegisterLinalgOps(OpRegistry& r);        // Det (linalg.cc)
void RegisterDeformConvOps(OpRegistry& r);    // DeformConv, 2-D (deform_conv.cc)
void RegisterFunctionOps(OpRegistry& r);      // RMSNormalization, RotaryEmbedding, Swish, SwiGLU (function_ops.cc)

/// The infer function of an op lowered to other ops when a model is compiled (runtime/contrib_ops.cc,
/// runtime/function_ops.cc), which never reaches inference itself: throws kInternal.
void LoweredWhenCompiled(InferContext& c);

/// ONNX domain of osprey's own ops (image ops). Nodes in this domain are looked up in the same registry.
inline constexpr const char* kOspreyDomain = "osprey";

/// ONNX Runtime's contrib domain. Only the ops its quantiser and its transformer optimiser write are known there
/// (ops/contrib.cc): IsMicrosoftDomainOp. Those of them that ONNX's default domain does not have (IsContribOnlyOp) are
/// refused there.
inline constexpr const char* kMicrosoftDomain = "com.microsoft";
bool IsMicrosoftDomainOp(const std::string& op_type);
bool IsContribOnlyOp(const std::string& op_type);

/// Internal op made by the channel-shuffle fusion (schema and semantics: src/ops/internal_ops.cc).
inline constexpr const char* kChannelShuffleOp = "_ChannelShuffle";
/// Internal op made by the group-norm fusion (runtime/fusion_patterns.cc): GroupNormalization with scale and bias per
/// channel whatever the model's opset (opset 21's form; schema and reference kernel beside GroupNormalization's).
inline constexpr const char* kGroupNormOp = "_GroupNorm";

/// Gather attribute set by the one-hot fusion (runtime/fusion_tf.cc): an index outside [0, dim) gives a zero slice
/// (what a one-hot product gives) where ONNX's Gather wraps negative indices and rejects the others; 1: as is,
/// 2: a negative index wraps once first (OneHot's rule), then the same.
inline constexpr const char* kGatherZeroOutside = "_zero_outside";
/// Gather's index `v` into an axis of `dim` elements (`zero_outside`: the node's kGatherZeroOutside): its position in
/// [0, dim), or -1 for a zero slice; throws kInvalidArgument naming `node` for an index ONNX's Gather rejects. Shared
/// by the reference kernel and the fast one (kernels/cpu/channel_kernels.cc).
int64_t GatherIndex(const Node& node, int64_t v, int64_t dim, int64_t zero_outside);

/// Checks every node's op is known (ONNX default domain) and its arity fits. Throws kUnsupported with ONE message
/// listing every unsupported op with its node name, or kInvalidArgument for a bad arity.
void ValidateOps(const Graph& graph);

// ---- helpers shared by op schemas and kernels ----
/// Normalises a possibly-negative axis against `rank`; throws kInvalidArgument naming `node` when out of range.
int64_t NormalizeAxis(int64_t axis, int64_t rank, const Node& node);
/// Numpy-style multidirectional broadcast; throws kInvalidArgument naming `node` on mismatch.
Shape BroadcastShapes(const Shape& a, const Shape& b, const Node& node);
/// Whether a tensor of shape `from` broadcasts to `to` alone (numpy rules, `from` aligned to the right, each of its
/// dims equal or 1), so `to` is the result.
bool BroadcastsTo(const Shape& from, const Shape& to);
/// A Transpose node's permutation for an input of `rank` axes: its `perm`, or the axes reversed where it has none
/// (ONNX's default). Unchecked.
std::vector<int64_t> TransposePerm(const Node& node, size_t rank);

// ---- augmentation op helpers (src/ops/augment_ops.cc), shared by the schemas and both kernel libraries ----
/// OpenCV's GaussianBlur size rule: `ksize` when > 0, else cvRound(sigma * (uint8 ? 3 : 4) * 2 + 1) | 1 (0 when
/// sigma <= 0 too).
int64_t GaussianBlurKernelSize(int64_t ksize, double sigma, bool is_u8);
/// cv::getGaussianKernel(size, sigma, CV_64F) of OpenCV 4.x: fixed tables for size <= 9 with sigma <= 0; sums to 1.
std::vector<double> GaussianKernel1D(int64_t size, double sigma);
/// Horizontal (x) and vertical (y) taps of a validated GaussianBlur node.
struct GaussianBlurTaps {
  std::vector<double> x, y;
};
/// OpenCV's 8-bit GaussianBlur taps: `taps` (odd count, sum 1) in whole 1/256ths, rounded with error diffusion from
/// the ends inward, the centre making the sum exactly 1.
std::vector<double> FixedPointTaps256(const std::vector<double>& taps);
/// The separable taps of a validated GaussianBlur node (OpenCV's rules; uint8 images get FixedPointTaps256, as
/// cv2.GaussianBlur computes 8-bit images in fixed point) or BoxBlur node (equal taps, cv2.blur): the one place both
/// blurs' reference and fast kernels get them.
GaussianBlurTaps GaussianBlurKernels(const Node& node, bool is_u8);
/// The 'fill' values of a validated FillRects node (written as floats or ints).
std::vector<float> FillRectsValues(const Node& node);

}  // namespace osprey
