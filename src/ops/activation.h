#pragma once
// The fused activation (post-op) of a Conv, ConvTranspose, Gemm, MatMul or BatchNormalization: which activations
// exist, how the fusion pass reads one from an activation node, how a fused node carries it (the `_activation`,
// `_alpha` and `_beta` attributes, docs/architecture.md) and its reference formula. Every kernel library maps
// ActivationKind to its own form (oneDNN post-ops, the CUDA unary codes, the hand-written BatchNormalization).
#include <cstdint>
#include <string>
#include <vector>

namespace osprey {

struct Node;
class Tensor;

/// Selu's default alpha and gamma (ONNX), for every kernel of it.
inline constexpr float kSeluAlpha = 1.67326319217681884765625f, kSeluGamma = 1.05070102214813232421875f;
/// LeakyRelu's default alpha and HardSigmoid's default alpha and beta (ONNX; also the defaults of these activations
/// in RNN / GRU / LSTM nodes), for every kernel and fusion of them.
inline constexpr float kLeakyReluAlpha = 0.01f, kHardSigmoidAlpha = 0.2f, kHardSigmoidBeta = 0.5f;

enum class ActivationKind : uint8_t {
  kNone,         // no activation (`_activation` absent or "")
  kRelu,         // max(x, 0)
  kLeakyRelu,    // x >= 0 ? x : alpha * x
  kClip,         // min(max(x, alpha), beta): alpha = min, beta = max
  kSigmoid,      // 1 / (1 + exp(-x))
  kTanh,         // tanh(x)
  kHardSigmoid,  // min(max(alpha * x + beta, 0), 1)
  kHardSwish,    // x * min(max(x / 6 + 1/2, 0), 1)
  kSilu,         // x / (1 + exp(-x)): Mul(x, Sigmoid(x)) fused; no ONNX op of its own
  kGelu,         // 0.5 x (1 + erf(x / sqrt 2)) (Gelu with approximate = "none")
  kGeluTanh,     // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Gelu with approximate = "tanh")
};

struct Activation {
  ActivationKind kind = ActivationKind::kNone;
  float alpha = 0.f;
  float beta = 0.f;

  /// The fused activation of a node (`_activation`, `_alpha`, `_beta`). False when `_activation` names none.
  static bool FromFusedNode(const Node& node, Activation* out);
  /// Writes `_activation`, `_alpha` and `_beta` (the name "" for kNone).
  void WriteTo(Node& node) const;

  /// The activation's formula on one value (the reference kernels' numerics, which the fast kernels follow).
  float Apply(float x) const;
  /// Apply on data[0, n), in place.
  void Apply(float* data, int64_t n) const;
};

/// A Conv's fused PRelu (runtime/fusion.cc FuseConvPRelu; docs/architecture.md): `_prelu` = 1 and input
/// kPReluSlopeInput holding the slopes, float32 [C] (one per output channel) or [1] (one for all). It is the node's
/// activation, applied after the bias and the residual: the node has no `_activation` then (ops/nn.cc checks).
inline constexpr int kPReluSlopeInput = 6;
bool HasFusedPRelu(const Node& node);
/// PRelu on `planes` planes of `inner` values each (plane p has channel p % channels, as NCHW tensors lie), in place:
/// x < 0 ? slope * x : x, with slopes[0] for all when `num_slopes` is 1.
void ApplyPReluPlanes(const float* slopes, int64_t num_slopes, int64_t channels, float* data, int64_t planes,
                      int64_t inner);

/// A QuantizeLinear -> DequantizeLinear pair on one value: clip(round(x / scale), lo, hi) * scale (round half to
/// even; a division, not a product with 1 / scale, as the Div it replaces). The one formula of the reference kernels
/// (Round with `_quant_scale`, runtime/fusion_qdq.cc; fused steps below); the fast kernels compute the same bits.
float FakeQuantizeValue(float x, float scale, float lo, float hi);

/// One unary step of a chain fused into an elementwise node (runtime/fusion.cc FuseElementwiseChains): an activation
/// or a fake quantisation. A node carries its steps as `_then` (ints: ActivationKind codes, kFakeQuantizeStep for a
/// fake quantisation) and `_then_params` (floats, 3 per step: alpha, beta, 0 or scale, lo, hi), applied in order to
/// its output. Only Add, Sub, Mul, Div and the unary ops of kStepCarriers carry them (float32 only).
struct UnaryStep {
  static constexpr int64_t kFakeQuantizeStep = 100;
  static constexpr size_t kMaxSteps = 8;
  bool fake_quantize = false;
  Activation act;                         // when !fake_quantize
  float scale = 1.f, lo = 0.f, hi = 0.f;  // when fake_quantize

  float Apply(float x) const { return fake_quantize ? FakeQuantizeValue(x, scale, lo, hi) : act.Apply(x); }
};
/// Whether `op_type` (default domain) may carry fused steps.
bool CarriesFusedSteps(const std::string& op_type);
/// The fused steps of `node` (empty when it has no `_then`). Throws kInvalidArgument naming the node when they are
/// malformed (unknown code, wrong parameter count, a fake quantisation with a bad scale or bounds, more than
/// kMaxSteps) or the op cannot carry them.
std::vector<UnaryStep> FusedSteps(const Node& node);
void WriteFusedSteps(Node& node, const std::vector<UnaryStep>& steps);
/// Applies `node`'s fused steps to data[0, n), in place (reference numerics).
void ApplyFusedSteps(const Node& node, float* data, int64_t n);

/// The `_activation` name of a kind: the ONNX op's name ("Silu" for kSilu, "" for kNone).
const char* ActivationName(ActivationKind kind);
/// The kind named `name` (as ActivationName writes it); false for an unknown name.
bool ParseActivationName(const std::string& name, ActivationKind* kind);

/// The activation that unary node `n` (an op whose schema has OpTraits::fusable_activation) computes, its
/// parameters from its attributes (LeakyRelu alpha, HardSigmoid alpha and beta, Clip min and max before opset 11)
/// or, for Clip from opset 11 on, its min and max inputs: `values[k]` is input k's float32 value when it is known at
/// compile time, else null (or `values` shorter). False when the node is none or a Clip bound it has is not known.
bool ActivationOfNode(const Node& n, int opset, const std::vector<const Tensor*>& values, Activation* out);

}  // namespace osprey
