// Pattern fusions for transformer-style graphs as exporters write them (PyTorch at opset 13 has no LayerNormalization
// or Gelu op, so both arrive decomposed into elementwise chains):
//   LayerNorm: ReduceMean(x) -> Sub(x, mean) -> Pow(d, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Div(d, std)
//              [-> Mul(gamma)] [-> Add(beta)]             => LayerNormalization(x, gamma, beta), axis -1
//              (also with a Transpose after the Sub moving the mean's axis last, as ONNX Runtime's optimiser writes it,
//              and Flax's form: E[x^2] - E[x]^2 [-> Max(0)] -> Add(eps) -> Sqrt -> Div(x - mean, .), jax2onnx's export;
//              and Keras 3's through tf2onnx: x * inv + (Neg(mean) * inv [+ beta]),
//              inv = 1 / Sqrt(var + eps) [* gamma])
//   GELU:      Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x, .) -> Mul(0.5)  (any operand order, 0.5 anywhere)
//                                                          => Gelu(x)
//              Pow(x, 3) -> Mul(0.044715) -> Add(x) -> Mul(sqrt(2 / pi)) -> Tanh -> Add(1) -> Mul(x, .) -> Mul(0.5)
//                                                          => Gelu(x), approximate "tanh"
//   GroupNorm: Reshape [N, C, ...] -> [N, G, L] -> InstanceNormalization(s[G], b[G]) -> Reshape [N, C, ...]
//              [-> Mul(gamma[C])] [-> Add(beta[C])]        => _GroupNorm(x, scale[C], bias[C]), num_groups G
//              (nn.GroupNorm as PyTorch's exporters write it: PoolFormer, diffusion U-Nets)
//   Bias:      MatMul(A, B) -> Add(., bias[N])             => MatMul(A, B, bias) with `_bias` = 1
//   Mean:      ReduceMean over every spatial axis, keeping dims => GlobalAveragePool
//   Einsum:    a two-input contraction                     => [Transpose, Reshape] x2 -> MatMul [-> Reshape, Transpose]
//   NaN guard: [Add(s, constant finite mask) ->] Softmax -> Where(IsNaN(p), 0, p) => Softmax [an all-zero mask dropped]
// and, for convolutional nets (FuseDataMovementPatterns):
//   Channel shuffle: Concat -> Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape [N, C, H, W]
//              [-> channel Slices]                     => _ChannelShuffle (src/ops/internal_ops.cc)
// A chain is rewritten only when every intermediate value has a single consumer and is not a graph output, and only
// when the constants have the values the pattern needs (checked by value, not by name). The fused node takes the
// position of the chain's last node: its inputs are all produced before the chain's first node.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/einsum.h"
#include "ops/op_registry.h"
#include "ops/slice.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

constexpr double kSqrt2 = 1.4142135623730951;

// Live nodes with their consumer lists and producers, and the nodes a pass has absorbed.
class NodeView {
 public:
  explicit NodeView(CompileState& st) : st_(st) {
    consumers_.assign(st.values.size(), {});
    producer_.assign(st.values.size(), -1);
    for (size_t i = 0; i < st.nodes.size(); ++i) {
      for (int v : st.nodes[i].inputs)  // a node reading a value twice (Mul(d, d)) is one consumer
        if (v >= 0 && (consumers_[v].empty() || consumers_[v].back() != static_cast<int>(i)))
          consumers_[v].push_back(static_cast<int>(i));
      for (int v : st.nodes[i].outputs)
        if (v >= 0) producer_[v] = static_cast<int>(i);
    }
    dead_.assign(st.nodes.size(), 0);
  }

  Node& node(int i) { return st_.nodes[i]; }
  bool dead(int i) const { return dead_[i] != 0; }
  void Kill(int i) { dead_[i] = 1; }

  // The node reading `v` when it is the only reader and `v` is not a graph output; else -1.
  int SoleConsumer(int v) const {
    if (v < 0 || st_.is_graph_output[v] || consumers_[v].size() != 1) return -1;
    int c = consumers_[v][0];
    return dead_[c] ? -1 : c;
  }
  const std::vector<int>& Consumers(int v) const { return consumers_[v]; }
  int Producer(int v) const {
    if (v < 0 || producer_[v] < 0 || dead_[producer_[v]]) return -1;
    return producer_[v];
  }

  // The live node `i` is an ONNX-domain `op` with one output.
  bool Is(int i, const char* op) const {
    if (i < 0 || dead_[i]) return false;
    const Node& n = st_.nodes[i];
    return n.op_type == op && n.domain.empty() && n.outputs.size() == 1 && n.outputs[0] >= 0;
  }

  // Drops absorbed nodes, keeping the order of the rest.
  void Compact() {
    std::vector<Node> kept;
    kept.reserve(st_.nodes.size());
    for (size_t i = 0; i < st_.nodes.size(); ++i)
      if (!dead_[i]) kept.push_back(std::move(st_.nodes[i]));
    st_.nodes = std::move(kept);
  }

 private:
  CompileState& st_;
  std::vector<std::vector<int>> consumers_;
  std::vector<int> producer_;
  std::vector<char> dead_;
};

bool IsF32(const CompileState& st, int v) { return v >= 0 && st.values[v].typed && st.values[v].dtype == DType::kF32; }

bool IsF32Constant(const CompileState& st, int v) {
  return IsF32(st, v) && st.values[v].known && st.values[v].value.raw() != nullptr;
}

// A float32 constant holding one element, returned in *value.
bool ScalarConstant(const CompileState& st, int v, float* value) {
  if (!IsF32Constant(st, v) || st.values[v].value.numel() != 1) return false;
  *value = st.values[v].value.data<float>()[0];
  return true;
}

bool ScalarNear(const CompileState& st, int v, double expected) {
  float value = 0;
  return ScalarConstant(st, v, &value) && std::fabs(value - expected) <= 1e-5 * std::fabs(expected);
}

// For a binary node reading `v`, the other input; -1 when `v` is not exactly one of its two inputs.
int OtherInput(const Node& n, int v) {
  if (n.inputs.size() != 2) return -1;
  if (n.inputs[0] == v && n.inputs[1] != v) return n.inputs[1];
  if (n.inputs[1] == v && n.inputs[0] != v) return n.inputs[0];
  return -1;
}

bool SameShape(const CompileState& st, int a, int b) { return st.values[a].shape == st.values[b].shape; }

// "/encoder/layer_0/ln_1/ReduceMean" -> "/encoder/layer_0/ln_1/LayerNormalization": the fused node keeps the scope of
// the chain it replaces, so profiles still say where it came from.
std::string FusedName(const std::string& base, const char* op) {
  if (base.empty()) return op;
  const size_t slash = base.rfind('/');
  return slash == std::string::npos ? base + "/" + op : base.substr(0, slash + 1) + op;
}

// A float32 constant that broadcasts along the last axis of a tensor with `channels` there: shape [..., 1, C] or a
// single element. Fills `out` with its C values (a single element repeated).
bool ChannelVector(const CompileState& st, int v, int64_t channels, std::vector<float>* out) {
  if (!IsF32Constant(st, v)) return false;
  const Tensor& t = st.values[v].value;
  const Shape& s = t.shape();
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] != 1) return false;
  const float* p = t.data<float>();
  if (t.numel() == channels) {
    out->assign(p, p + channels);
  } else if (t.numel() == 1) {
    out->assign(static_cast<size_t>(channels), p[0]);
  } else {
    return false;
  }
  return true;
}

// The value id of a [C] constant equal to `values`: `v` itself when it already has that shape, else a new constant.
int ChannelConstant(CompileState& st, int v, const std::vector<float>& values) {
  const int64_t channels = static_cast<int64_t>(values.size());
  if (v >= 0 && st.values[v].shape == Shape{channels}) return v;
  return st.AddConstant(Tensor::FromVector<float>({channels}, values));
}

// The axes of a ReduceMean keeping dims (opset < 18: `axes` attribute; opset 18: `axes` input), each in [0, rank), in
// the node's order; false when they are not known, dims are dropped, or the node reduces nothing (no axes with
// noop_with_empty_axes). No axes at all means every axis.
bool KeptMeanAxes(const CompileState& st, const Node& n, int64_t rank, std::vector<int64_t>* axes) {
  if (n.op_type != "ReduceMean" || !n.domain.empty() || n.GetInt("keepdims", 1) != 1) return false;
  if (n.inputs.size() > 1 && n.inputs[1] >= 0) {
    const CompileValue& a = st.values[n.inputs[1]];
    if (!a.known || a.dtype != DType::kI64) return false;
    *axes = a.value.ToInt64Vector();
  } else if (n.Has("axes")) {
    *axes = n.GetInts("axes");
  } else {
    if (n.GetInt("noop_with_empty_axes", 0) != 0) return false;
    axes->clear();
    for (int64_t d = 0; d < rank; ++d) axes->push_back(d);
    return true;
  }
  for (int64_t& a : *axes) {
    if (a < -rank || a >= rank) return false;
    if (a < 0) a += rank;
  }
  return !axes->empty();
}

// ReduceMean over the last axis only, keeping dims.
bool IsLastAxisMean(const CompileState& st, const Node& n, int64_t rank) {
  std::vector<int64_t> axes;
  return KeptMeanAxes(st, n, rank, &axes) && axes == std::vector<int64_t>{rank - 1};
}

// ReduceMean over every spatial axis of a float32 [N, C, spatial...] tensor, keeping dims (Paddle and TF exports
// write global average pooling so: PP-OCRv6's detector, SE blocks) => GlobalAveragePool, which has a fast kernel and
// runs on channels-last data (the reference ReduceMean took 1.2 ms of PP-OCRv6 tiny's 23).
void SpatialMeanToGlobalAveragePool(CompileState& st) {
  for (Node& n : st.nodes) {
    if (n.inputs.empty() || n.inputs[0] < 0 || n.outputs.size() != 1 || !IsF32(st, n.inputs[0])) continue;
    const int64_t rank = static_cast<int64_t>(st.values[n.inputs[0]].shape.size());
    std::vector<int64_t> axes;
    if (rank < 3 || !KeptMeanAxes(st, n, rank, &axes)) continue;
    std::sort(axes.begin(), axes.end());
    std::vector<int64_t> spatial;
    for (int64_t d = 2; d < rank; ++d) spatial.push_back(d);
    if (axes != spatial) continue;
    Node gap;
    gap.op_type = "GlobalAveragePool";
    gap.name = n.name;
    gap.inputs = {n.inputs[0]};
    gap.outputs = n.outputs;
    n = std::move(gap);
  }
}

// ---------------------------------------------------------------- LayerNorm

// The end of a decomposed LayerNorm over the last axis of `x`, whose normalised value `div` computes: its optional
// affine part, Mul(gamma) then Add(beta) with per-channel constants, taken in; the last node of it becomes
// LayerNormalization(x, gamma, beta) and the `absorbed` nodes go.
void ReplaceWithLayerNorm(CompileState& st, NodeView& g, int x, float epsilon, int div, std::vector<int> absorbed) {
  const int64_t channels = st.values[x].shape.back();
  std::vector<float> gamma(static_cast<size_t>(channels), 1.f), beta(static_cast<size_t>(channels), 0.f);
  int gamma_id = -1, beta_id = -1, last = div;
  const struct {
    const char* op;
    std::vector<float>* values;
    int* id;
  } affine[] = {{"Mul", &gamma, &gamma_id}, {"Add", &beta, &beta_id}};
  for (const auto& part : affine) {  // Mul(gamma), then Add(beta); either may be absent
    const int next = g.SoleConsumer(g.node(last).outputs[0]);
    if (!g.Is(next, part.op)) continue;
    const int other = OtherInput(g.node(next), g.node(last).outputs[0]);
    if (!ChannelVector(st, other, channels, part.values) || !SameShape(st, g.node(next).outputs[0], x)) continue;
    *part.id = other;
    last = next;
    absorbed.push_back(next);
  }
  Node ln;
  ln.op_type = "LayerNormalization";
  ln.name = FusedName(g.node(absorbed.front()).name, "LayerNormalization");
  ln.inputs = {x, ChannelConstant(st, gamma_id, gamma), ChannelConstant(st, beta_id, beta)};
  ln.outputs = {g.node(last).outputs[0]};
  ln.attrs["axis"] = Attribute::Int(-1);
  ln.attrs["epsilon"] = Attribute::Float(epsilon);
  for (int n : absorbed)
    if (n != last) g.Kill(n);
  g.node(last) = std::move(ln);
}

// Node i as the start of a decomposed LayerNorm: a ReduceMean keeping dims of a float32 tensor of rank >= 1 over known
// axes. Returns its input (-1 otherwise) and fills *rank and *axes.
int MeanStart(const CompileState& st, NodeView& g, int i, int64_t* rank, std::vector<int64_t>* axes) {
  if (!g.Is(i, "ReduceMean") || g.node(i).inputs.empty()) return -1;
  const int x = g.node(i).inputs[0];
  if (!IsF32(st, x) || st.values[x].shape.empty()) return -1;
  *rank = static_cast<int64_t>(st.values[x].shape.size());
  return KeptMeanAxes(st, g.node(i), *rank, axes) ? x : -1;
}

// With a Transpose between the Sub and the rest that moves the mean's axis last (ONNX Runtime's transpose optimiser
// writes ConvNeXt's channels LayerNorm so: ReduceMean(axis 1) -> Sub -> Transpose(0, 2, 3, 1) -> the rest), the
// Transpose is hoisted to read x and the LayerNormalization reads it, as in the model before ORT optimised it.
void FuseLayerNorm(CompileState& st) {
  NodeView g(st);
  for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
    int64_t rank = 0;
    std::vector<int64_t> mean_axes;
    const int x = MeanStart(st, g, i, &rank, &mean_axes);
    if (x < 0 || mean_axes.size() != 1) continue;
    const int mean = g.node(i).outputs[0];

    const int sub = g.SoleConsumer(mean);
    if (!g.Is(sub, "Sub") || g.node(sub).inputs.size() != 2 || g.node(sub).inputs[0] != x ||
        g.node(sub).inputs[1] != mean)
      continue;
    int d = g.node(sub).outputs[0];
    if (!IsF32(st, d) || !SameShape(st, d, x) || st.is_graph_output[d]) continue;
    int hoisted = -1;  // the Transpose after the Sub, when the mean is not over the last axis
    if (mean_axes[0] != rank - 1) {
      hoisted = g.SoleConsumer(d);
      if (!g.Is(hoisted, "Transpose") || g.node(hoisted).outputs.size() != 1) continue;
      const std::vector<int64_t> perm = TransposePerm(g.node(hoisted), static_cast<size_t>(rank));
      if (static_cast<int64_t>(perm.size()) != rank || perm.back() != mean_axes[0]) continue;
      d = g.node(hoisted).outputs[0];
      if (!IsF32(st, d) || st.is_graph_output[d]) continue;
    }
    const int ln_in = hoisted >= 0 ? d : x;  // the value the LayerNormalization reads (x, or x transposed)
    const int64_t channels = st.values[ln_in].shape.back();
    if (channels <= 0) continue;
    const std::vector<int>& d_readers = g.Consumers(d);
    if (d_readers.size() != 2) continue;

    // d is read by the square (Pow(d, 2) or Mul(d, d)) and by the final Div.
    int square = -1, div = -1;
    for (int c : d_readers) {
      if (g.Is(c, "Pow") && g.node(c).inputs.size() == 2 && g.node(c).inputs[0] == d &&
          ScalarNear(st, g.node(c).inputs[1], 2.0))
        square = c;
      else if (g.Is(c, "Mul") && g.node(c).inputs.size() == 2 && g.node(c).inputs[0] == d && g.node(c).inputs[1] == d)
        square = c;
      else if (g.Is(c, "Div") && g.node(c).inputs.size() == 2 && g.node(c).inputs[0] == d)
        div = c;
    }
    if (square < 0 || div < 0) continue;
    const int var_mean = g.SoleConsumer(g.node(square).outputs[0]);
    if (!g.Is(var_mean, "ReduceMean") || !IsLastAxisMean(st, g.node(var_mean), rank)) continue;
    const int add_eps = g.SoleConsumer(g.node(var_mean).outputs[0]);
    if (!g.Is(add_eps, "Add")) continue;
    float epsilon = 0;
    if (!ScalarConstant(st, OtherInput(g.node(add_eps), g.node(var_mean).outputs[0]), &epsilon) || !(epsilon >= 0))
      continue;
    const int sqrt = g.SoleConsumer(g.node(add_eps).outputs[0]);
    if (!g.Is(sqrt, "Sqrt")) continue;
    const int std_dev = g.node(sqrt).outputs[0];
    if (g.SoleConsumer(std_dev) != div || g.node(div).inputs[1] != std_dev) continue;
    Shape stat_shape = st.values[ln_in].shape;
    stat_shape.back() = 1;
    if (st.values[g.node(var_mean).outputs[0]].shape != stat_shape || st.values[std_dev].shape != stat_shape) continue;
    if (!SameShape(st, g.node(div).outputs[0], ln_in)) continue;
    if (hoisted >= 0) g.node(hoisted).inputs[0] = x;  // it now gives x transposed, which ln_in names
    ReplaceWithLayerNorm(st, g, ln_in, epsilon, div, {i, sub, square, var_mean, add_eps, sqrt, div});
  }
  g.Compact();
}

// Flax's LayerNorm (use_fast_variance, its default; jax2onnx writes it so): the variance as E[x^2] - E[x]^2 clamped
// at zero, x - mean divided by its root. ReduceMean(x) feeds Sub(x, mean) and Mul(mean, mean); Mul(x, x) ->
// ReduceMean -> Sub(., mean^2) [-> Max(., 0)] -> Add(eps) -> Sqrt -> Div(x - mean, .) [-> Mul(gamma)] [-> Add(beta)]
// => LayerNormalization, whose two-pass variance is the exact value the formula approximates.
void FuseFastVarianceLayerNorm(CompileState& st) {
  NodeView g(st);
  for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
    int64_t rank = 0;
    std::vector<int64_t> mean_axes;
    const int x = MeanStart(st, g, i, &rank, &mean_axes);
    if (x < 0 || mean_axes != std::vector<int64_t>{rank - 1} || st.values[x].shape.back() <= 0) continue;
    const int mean = g.node(i).outputs[0];
    if (st.is_graph_output[mean] || g.Consumers(mean).size() != 2) continue;
    int sub = -1, mean_sq = -1;
    for (int c : g.Consumers(mean)) {
      const Node& n = g.node(c);
      if (g.Is(c, "Sub") && n.inputs.size() == 2 && n.inputs[0] == x && n.inputs[1] == mean) sub = c;
      if (g.Is(c, "Mul") && n.inputs.size() == 2 && n.inputs[0] == mean && n.inputs[1] == mean) mean_sq = c;
    }
    if (sub < 0 || mean_sq < 0) continue;
    int square = -1;
    for (int c : g.Consumers(x))
      if (g.Is(c, "Mul") && g.node(c).inputs.size() == 2 && g.node(c).inputs[0] == x && g.node(c).inputs[1] == x)
        square = c;
    if (square < 0) continue;
    const int second = g.SoleConsumer(g.node(square).outputs[0]);
    if (!g.Is(second, "ReduceMean") || !IsLastAxisMean(st, g.node(second), rank)) continue;
    const int var = g.SoleConsumer(g.node(second).outputs[0]);
    if (!g.Is(var, "Sub") || g.node(var).inputs.size() != 2 || g.node(var).inputs[0] != g.node(second).outputs[0] ||
        g.node(var).inputs[1] != g.node(mean_sq).outputs[0] || g.SoleConsumer(g.node(mean_sq).outputs[0]) != var)
      continue;
    std::vector<int> absorbed = {i, sub, mean_sq, square, second, var};
    int next = g.SoleConsumer(g.node(var).outputs[0]);
    if (g.Is(next, "Max") && g.node(next).inputs.size() == 2 &&
        ScalarNear(st, OtherInput(g.node(next), g.node(var).outputs[0]), 0.0)) {
      absorbed.push_back(next);
      next = g.SoleConsumer(g.node(next).outputs[0]);
    }
    if (!g.Is(next, "Add")) continue;
    float epsilon = 0;
    const int before_eps = g.node(absorbed.back()).outputs[0];
    if (!ScalarConstant(st, OtherInput(g.node(next), before_eps), &epsilon) || !(epsilon > 0)) continue;
    absorbed.push_back(next);
    const int sqrt = g.SoleConsumer(g.node(next).outputs[0]);
    if (!g.Is(sqrt, "Sqrt")) continue;
    const int centered = g.node(sub).outputs[0];
    const int div = g.SoleConsumer(centered);
    if (!g.Is(div, "Div") || g.node(div).inputs.size() != 2 || g.node(div).inputs[0] != centered ||
        g.node(div).inputs[1] != g.node(sqrt).outputs[0] || g.SoleConsumer(g.node(sqrt).outputs[0]) != div ||
        st.is_graph_output[centered] || !SameShape(st, g.node(div).outputs[0], x))
      continue;
    bool escapes = false;
    for (int n : absorbed)
      for (int v : g.node(n).outputs) escapes = escapes || st.is_graph_output[v];
    if (escapes) continue;
    absorbed.push_back(sqrt);
    absorbed.push_back(div);
    ReplaceWithLayerNorm(st, g, x, epsilon, div, absorbed);
  }
  g.Compact();
}

// ---------------------------------------------------------------- GroupNorm

void FuseGroupNorm(CompileState& st) {
  NodeView g(st);
  for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
    if (!g.Is(i, "InstanceNormalization") || g.node(i).inputs.size() != 3) continue;
    const Node& norm = g.node(i);
    const int grouped = norm.inputs[0];
    const int reshape_in = g.Producer(grouped);
    if (!g.Is(reshape_in, "Reshape") || g.SoleConsumer(grouped) != i) continue;
    const int x = g.node(reshape_in).inputs[0];
    if (!IsF32(st, x) || !IsF32(st, grouped)) continue;
    const Shape& xs = st.values[x].shape;
    const Shape& gs = st.values[grouped].shape;
    if (xs.size() < 3 || gs.size() != 3 || gs[0] != xs[0] || gs[1] < 1 || xs[1] % gs[1] != 0 ||
        NumElements(gs) != NumElements(xs))
      continue;
    const int64_t channels = xs[1], groups = gs[1];
    if (!IsF32Constant(st, norm.inputs[1]) || !IsF32Constant(st, norm.inputs[2]) ||
        st.values[norm.inputs[1]].value.numel() != groups || st.values[norm.inputs[2]].value.numel() != groups)
      continue;
    const int reshape_out = g.SoleConsumer(norm.outputs[0]);
    if (!g.Is(reshape_out, "Reshape") || st.values[g.node(reshape_out).outputs[0]].shape != xs) continue;
    const float* s = st.values[norm.inputs[1]].value.data<float>();
    const float* b = st.values[norm.inputs[2]].value.data<float>();
    std::vector<float> scale(static_cast<size_t>(channels)), bias(scale.size());
    for (int64_t c = 0; c < channels; ++c) {
      scale[c] = s[c / (channels / groups)];
      bias[c] = b[c / (channels / groups)];
    }
    // Optional per-channel affine: ((n * s + b) * gamma) + beta = n * (s * gamma) + (b * gamma + beta).
    std::vector<int> absorbed = {reshape_in, i, reshape_out};
    int last = reshape_out;
    int next = g.SoleConsumer(g.node(last).outputs[0]);
    std::vector<float> k;
    if (g.Is(next, "Mul") && PerChannelConstant(st, OtherInput(g.node(next), g.node(last).outputs[0]), xs, &k) &&
        st.values[g.node(next).outputs[0]].shape == xs) {
      for (int64_t c = 0; c < channels; ++c) scale[c] *= k[c], bias[c] *= k[c];
      last = next;
      absorbed.push_back(next);
      next = g.SoleConsumer(g.node(last).outputs[0]);
    }
    if (g.Is(next, "Add") && PerChannelConstant(st, OtherInput(g.node(next), g.node(last).outputs[0]), xs, &k) &&
        st.values[g.node(next).outputs[0]].shape == xs) {
      for (int64_t c = 0; c < channels; ++c) bias[c] += k[c];
      last = next;
      absorbed.push_back(next);
    }
    Node fused;
    fused.op_type = kGroupNormOp;
    fused.name = FusedName(norm.name, "GroupNorm");
    fused.inputs = {x, st.AddConstant(Tensor::FromVector<float>({channels}, scale)),
                    st.AddConstant(Tensor::FromVector<float>({channels}, bias))};
    fused.outputs = {g.node(last).outputs[0]};
    fused.attrs["num_groups"] = Attribute::Int(groups);
    fused.attrs["epsilon"] = Attribute::Float(norm.GetFloat("epsilon", 1e-5f));
    for (int n : absorbed)
      if (n != last) g.Kill(n);
    g.node(last) = std::move(fused);
  }
  g.Compact();
}

// Node i as a mean over the last axis keeping dims: ReduceMean so, or GlobalAveragePool on a rank-3 tensor (tf2onnx
// writes the mean over the last of three axes so). Returns its float32 input, else -1.
int LastAxisMeanOf(const CompileState& st, NodeView& g, int i) {
  if (i < 0 || g.node(i).inputs.empty()) return -1;
  const int x = g.node(i).inputs[0];
  if (!IsF32(st, x) || st.values[x].shape.empty()) return -1;
  const int64_t rank = static_cast<int64_t>(st.values[x].shape.size());
  if (g.Is(i, "GlobalAveragePool")) return rank == 3 ? x : -1;
  return g.Is(i, "ReduceMean") && IsLastAxisMean(st, g.node(i), rank) ? x : -1;
}

// Keras 3's LayerNormalization as tf2onnx writes it: mean = E[x], var = E[(x - mean)^2] (Sub, then Mul(d, d)),
// inv = Reciprocal(Sqrt(var + eps)) [* gamma], out = x * inv + (Neg(mean) * inv [+ beta]) => LayerNormalization.
void FuseKerasLayerNorm(CompileState& st) {
  NodeView g(st);
  for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
    const int x = LastAxisMeanOf(st, g, i);
    if (x < 0) continue;
    const int64_t channels = st.values[x].shape.back();
    const int mean = g.node(i).outputs[0];
    if (channels <= 0 || st.is_graph_output[mean] || g.Consumers(mean).size() != 2) continue;
    int sub = -1, neg = -1;
    for (int c : g.Consumers(mean)) {
      if (g.Is(c, "Sub") && g.node(c).inputs.size() == 2 && g.node(c).inputs[0] == x && g.node(c).inputs[1] == mean)
        sub = c;
      else if (g.Is(c, "Neg"))
        neg = c;
    }
    if (sub < 0 || neg < 0) continue;
    const int d = g.node(sub).outputs[0];
    const int square = g.SoleConsumer(d);
    if (!g.Is(square, "Mul") || g.node(square).inputs != std::vector<int>{d, d}) continue;
    const int var_mean = g.SoleConsumer(g.node(square).outputs[0]);
    if (LastAxisMeanOf(st, g, var_mean) != g.node(square).outputs[0]) continue;
    const int add_eps = g.SoleConsumer(g.node(var_mean).outputs[0]);
    float epsilon = 0;
    if (!g.Is(add_eps, "Add") ||
        !ScalarConstant(st, OtherInput(g.node(add_eps), g.node(var_mean).outputs[0]), &epsilon) || !(epsilon >= 0))
      continue;
    const int sqrt = g.SoleConsumer(g.node(add_eps).outputs[0]);
    const int recip = g.Is(sqrt, "Sqrt") ? g.SoleConsumer(g.node(sqrt).outputs[0]) : -1;
    if (!g.Is(recip, "Reciprocal")) continue;
    std::vector<int> absorbed = {i, sub, square, var_mean, add_eps, sqrt, recip, neg};
    // inv: the reciprocal, or it times gamma.
    std::vector<float> gamma(static_cast<size_t>(channels), 1.f), beta(static_cast<size_t>(channels), 0.f);
    int gamma_id = -1, beta_id = -1, inv = g.node(recip).outputs[0];
    const int scale = g.SoleConsumer(inv);
    if (g.Is(scale, "Mul") && ChannelVector(st, OtherInput(g.node(scale), inv), channels, &gamma)) {
      gamma_id = OtherInput(g.node(scale), inv);
      inv = g.node(scale).outputs[0];
      absorbed.push_back(scale);
    }
    if (st.is_graph_output[inv] || g.Consumers(inv).size() != 2) continue;
    int times_x = -1, times_neg = -1;
    for (int c : g.Consumers(inv)) {
      if (!g.Is(c, "Mul")) continue;
      const int other = OtherInput(g.node(c), inv);
      if (other == x) times_x = c;
      if (other == g.node(neg).outputs[0] && g.SoleConsumer(other) == c) times_neg = c;
    }
    if (times_x < 0 || times_neg < 0) continue;
    absorbed.insert(absorbed.end(), {times_x, times_neg});
    // The shift: Neg(mean) * inv, plus beta when the layer centres.
    int shift = g.node(times_neg).outputs[0];
    const int center = g.SoleConsumer(shift);
    if (g.Is(center, "Add") && ChannelVector(st, OtherInput(g.node(center), shift), channels, &beta)) {
      beta_id = OtherInput(g.node(center), shift);
      shift = g.node(center).outputs[0];
      absorbed.push_back(center);
    }
    const int last = g.SoleConsumer(shift);
    const int scaled = g.node(times_x).outputs[0];
    if (!g.Is(last, "Add") || OtherInput(g.node(last), shift) != scaled || g.SoleConsumer(scaled) != last ||
        !SameShape(st, g.node(last).outputs[0], x))
      continue;
    Shape stat_shape = st.values[x].shape;
    stat_shape.back() = 1;
    if (st.values[mean].shape != stat_shape || st.values[g.node(var_mean).outputs[0]].shape != stat_shape) continue;
    Node ln;
    ln.op_type = "LayerNormalization";
    ln.name = FusedName(g.node(i).name, "LayerNormalization");
    ln.inputs = {x, ChannelConstant(st, gamma_id, gamma), ChannelConstant(st, beta_id, beta)};
    ln.outputs = {g.node(last).outputs[0]};
    ln.attrs["axis"] = Attribute::Int(-1);
    ln.attrs["epsilon"] = Attribute::Float(epsilon);
    for (int n : absorbed) g.Kill(n);
    g.node(last) = std::move(ln);
  }
  g.Compact();
}

// ---------------------------------------------------------------- GELU

// Mul(q, 0.5) or Div(q, 2) reading `q`: multiplies by one half.
bool IsHalving(const CompileState& st, NodeView& g, int n, int q) {
  if (g.Is(n, "Mul")) return ScalarNear(st, OtherInput(g.node(n), q), 0.5);
  if (g.Is(n, "Div"))
    return g.node(n).inputs.size() == 2 && g.node(n).inputs[0] == q && g.node(n).inputs[1] != q &&
           ScalarNear(st, g.node(n).inputs[1], 2.0);
  return false;
}

// The product of binary node `n` with scalar constant `k` (either side): its other input, else -1.
int TimesScalar(const CompileState& st, NodeView& g, int n, double k) {
  if (!g.Is(n, "Mul") || g.node(n).inputs.size() != 2) return -1;
  for (int side = 0; side < 2; ++side)
    if (ScalarNear(st, g.node(n).inputs[1 - side], k)) return g.node(n).inputs[side];
  return -1;
}

// Erf node `e` reading x / sqrt(2) or x * (1 / sqrt(2)): x, with the scaling node added to `inside`; else -1.
int ErfGeluInput(const CompileState& st, NodeView& g, int e, std::vector<int>* inside) {
  const int t = g.node(e).inputs[0];
  const int scale = g.Producer(t);
  if (g.SoleConsumer(t) != e) return -1;
  int x = -1;
  if (g.Is(scale, "Div") && g.node(scale).inputs.size() == 2 && ScalarNear(st, g.node(scale).inputs[1], kSqrt2))
    x = g.node(scale).inputs[0];
  else
    x = TimesScalar(st, g, scale, 1.0 / kSqrt2);
  if (!IsF32(st, x) || !SameShape(st, t, x)) return -1;
  inside->push_back(scale);
  return x;
}

// Tanh node `e` reading sqrt(2 / pi) * (x + 0.044715 * x^3), the cube as Pow(x, 3) or (x * x) * x in either order:
// x, with the nodes computing the argument added to `inside`; else -1.
int TanhGeluInput(const CompileState& st, NodeView& g, int e, std::vector<int>* inside) {
  const int arg = g.node(e).inputs[0];
  const int outer = g.Producer(arg);
  const int sum = TimesScalar(st, g, outer, 0.7978845608028654);
  const int add = g.Producer(sum);
  if (g.SoleConsumer(arg) != e || g.SoleConsumer(sum) != outer || !g.Is(add, "Add") || g.node(add).inputs.size() != 2)
    return -1;
  for (int side = 0; side < 2; ++side) {
    const int x = g.node(add).inputs[side], term = g.node(add).inputs[1 - side];
    const int scale = g.Producer(term);
    const int cube = TimesScalar(st, g, scale, 0.044715);
    if (!IsF32(st, x) || !SameShape(st, arg, x) || g.SoleConsumer(term) != add || g.SoleConsumer(cube) != scale)
      continue;
    std::vector<int> nodes = {outer, add, scale};
    const int c = g.Producer(cube);
    if (g.Is(c, "Pow") && g.node(c).inputs.size() == 2 && g.node(c).inputs[0] == x &&
        ScalarNear(st, g.node(c).inputs[1], 3.0)) {
      nodes.push_back(c);
    } else if (g.Is(c, "Mul") && g.node(c).inputs.size() == 2) {  // x * (x * x) or (x * x) * x
      const int square = OtherInput(g.node(c), x);
      const int sq = g.Producer(square);
      if (square < 0 || g.SoleConsumer(square) != c || !g.Is(sq, "Mul") || g.node(sq).inputs.size() != 2 ||
          g.node(sq).inputs[0] != x || g.node(sq).inputs[1] != x)
        continue;
      nodes.push_back(c);
      nodes.push_back(sq);
    } else {
      continue;
    }
    inside->insert(inside->end(), nodes.begin(), nodes.end());
    return x;
  }
  return -1;
}

// 0.5 x (1 + erf(x / sqrt 2)) => Gelu; 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) => Gelu with approximate =
// "tanh" (PyTorch's gelu(approximate="tanh") and Hugging Face's gelu_new as exported, Keras's gelu(approximate=True)
// through tf2onnx).
void FuseGelu(CompileState& st) {
  NodeView g(st);
  for (int e = 0; e < static_cast<int>(st.nodes.size()); ++e) {
    const bool erf = g.Is(e, "Erf"), tanh = g.Is(e, "Tanh");
    if ((!erf && !tanh) || g.node(e).inputs.size() != 1) continue;
    std::vector<int> inside;
    const int x = erf ? ErfGeluInput(st, g, e, &inside) : TanhGeluInput(st, g, e, &inside);
    if (x < 0) continue;
    const int f = g.node(e).outputs[0];  // erf(...) or tanh(...)
    const int add_one = g.SoleConsumer(f);
    if (!g.Is(add_one, "Add") || !ScalarNear(st, OtherInput(g.node(add_one), f), 1.0)) continue;
    const int a = g.node(add_one).outputs[0];
    if (!SameShape(st, a, x)) continue;
    const int m1 = g.SoleConsumer(a);
    if (!g.Is(m1, "Mul")) continue;
    const int o1 = OtherInput(g.node(m1), a);
    if (o1 < 0) continue;
    const int q = g.node(m1).outputs[0];
    if (!SameShape(st, q, x)) continue;

    // The rest computes x * a * 0.5 in one of three orders.
    std::vector<int> absorbed = inside;
    absorbed.insert(absorbed.end(), {e, add_one, m1});
    int last = -1;
    if (o1 == x) {  // (x * a) * 0.5
      const int m2 = g.SoleConsumer(q);
      if (IsHalving(st, g, m2, q)) last = m2;
    } else if (ScalarNear(st, o1, 0.5)) {  // (a * 0.5) * x
      const int m2 = g.SoleConsumer(q);
      if (g.Is(m2, "Mul") && OtherInput(g.node(m2), q) == x) last = m2;
    } else {  // (x * 0.5) * a
      const int half = g.Producer(o1);
      if (g.SoleConsumer(o1) == m1 && IsHalving(st, g, half, x) && SameShape(st, o1, x)) {
        absorbed.push_back(half);
        last = m1;
      }
    }
    if (last < 0 || !SameShape(st, g.node(last).outputs[0], x)) continue;
    if (last != m1) absorbed.push_back(last);

    Node gelu;
    gelu.op_type = "Gelu";
    gelu.name = FusedName(g.node(e).name, "Gelu");
    gelu.inputs = {x};
    gelu.outputs = {g.node(last).outputs[0]};
    if (tanh) gelu.attrs["approximate"] = Attribute::String("tanh");
    for (int n : absorbed)
      if (n != last) g.Kill(n);
    g.node(last) = std::move(gelu);
  }
  g.Compact();
}

// ---------------------------------------------------------------- MatMul + bias

void FuseMatMulBias(CompileState& st) {
  NodeView g(st);
  for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
    if (!g.Is(i, "MatMul")) continue;
    Node& mm = g.node(i);
    if (mm.NumInputs() != 2 || mm.inputs.size() != 2 || mm.Has("_bias") || mm.Has("_activation")) continue;
    const int b = mm.inputs[1], y = mm.outputs[0];
    if (!IsF32(st, mm.inputs[0]) || !IsF32(st, b) || !IsF32(st, y)) continue;
    if (st.values[b].shape.size() < 2 || st.values[b].shape.back() <= 0) continue;
    const int64_t n = st.values[b].shape.back();
    const int add = g.SoleConsumer(y);
    if (!g.Is(add, "Add")) continue;
    const int c = OtherInput(g.node(add), y);
    std::vector<float> bias;
    if (!ChannelVector(st, c, n, &bias) || !SameShape(st, g.node(add).outputs[0], y)) continue;
    mm.inputs.push_back(ChannelConstant(st, c, bias));
    mm.attrs["_bias"] = Attribute::Int(1);
    mm.outputs[0] = g.node(add).outputs[0];
    g.Kill(add);
  }
  g.Compact();
}

// ---------------------------------------------------------------- Channel shuffle

// Perm [0, 2, 1, 3, 4] of a rank-5 Transpose.
bool IsGroupSwap(const Node& transpose) { return transpose.GetInts("perm") == std::vector<int64_t>{0, 2, 1, 3, 4}; }

// The channel range [*first, *first + *count) a live Slice of `z` (its input 0) keeps, when it cuts only axis 1 of
// the rank-4 `z` with step 1 and known bounds. Other axes must keep their full extent.
bool ChannelSliceOf(const CompileState& st, const Node& slice, int z, int64_t* first, int64_t* count) {
  if (slice.inputs.empty() || slice.inputs[0] != z) return false;
  for (size_t k = 1; k < slice.inputs.size(); ++k)
    if (slice.inputs[k] == z || (slice.inputs[k] >= 0 && !st.values[slice.inputs[k]].known)) return false;
  const Shape& in = st.values[z].shape;
  const Shape& out = st.values[slice.outputs[0]].shape;
  if (in.size() != 4 || out.size() != 4 || out[0] != in[0] || out[2] != in[2] || out[3] != in[3]) return false;
  SliceArgs args;
  auto input = [&](int k) -> const Tensor* {
    return k < static_cast<int>(slice.inputs.size()) && slice.inputs[k] >= 0 ? &st.values[slice.inputs[k]].value
                                                                               : nullptr;
  };
  if (!ReadSliceArgs(slice, st.opset, input, &args)) return false;
  for (int64_t s : args.steps)
    if (s != 1) return false;
  const SliceRange range = ResolveSlice(in, args, slice);
  const int64_t start = range.first[1];
  *first = start;
  *count = out[1];
  return start + out[1] <= in[1];
}

// Concat(x_0..x_k, axis 1) -> Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape [N, C, H, W]
//   [-> Slices of channel ranges that together cover the C channels once]
// => _ChannelShuffle(x_0..x_k, groups g[, split]) with the Slices' outputs (or the shuffled tensor) as outputs.
// Without a Concat in front, the shuffled tensor itself is the one input. The fused node takes the place of the
// second Reshape: its inputs come before the chain, and the Slices (and their readers) after it.
void FuseChannelShuffle(CompileState& st) {
  NodeView g(st);
  for (int r1 = 0; r1 < static_cast<int>(st.nodes.size()); ++r1) {
    if (!g.Is(r1, "Reshape") || g.node(r1).inputs.empty()) continue;
    const int x = g.node(r1).inputs[0];
    const Shape& xs = st.values[x].shape;
    const Shape& grouped = st.values[g.node(r1).outputs[0]].shape;
    if (xs.size() != 4 || grouped.size() != 5 || grouped[0] != xs[0] || grouped[3] != xs[2] || grouped[4] != xs[3] ||
        grouped[1] < 1 || grouped[1] * grouped[2] != xs[1])
      continue;
    const int64_t groups = grouped[1];
    const int t = g.SoleConsumer(g.node(r1).outputs[0]);
    if (!g.Is(t, "Transpose") || !IsGroupSwap(g.node(t))) continue;
    const int r2 = g.SoleConsumer(g.node(t).outputs[0]);
    if (!g.Is(r2, "Reshape") || g.node(r2).inputs[0] != g.node(t).outputs[0]) continue;
    const int z = g.node(r2).outputs[0];
    if (st.values[z].shape != xs) continue;

    std::vector<int> inputs = {x};
    const int concat = g.Producer(x);
    if (g.Is(concat, "Concat") && g.SoleConsumer(x) == r1) {
      const int64_t axis = g.node(concat).GetInt("axis", 0);
      bool all_present = !g.node(concat).inputs.empty();
      for (int v : g.node(concat).inputs) all_present = all_present && v >= 0;
      if ((axis == 1 || axis == -3) && all_present) inputs = g.node(concat).inputs;
    }

    // Slices reading disjoint channel ranges that cover z once become the fused node's outputs.
    std::vector<std::pair<int64_t, int>> ranges;  // (first channel, slice node)
    std::vector<int64_t> counts;
    bool absorb = !st.is_graph_output[z] && !g.Consumers(z).empty();
    for (int c : g.Consumers(z)) {
      int64_t first = 0, count = 0;
      if (!absorb || !g.Is(c, "Slice") || !ChannelSliceOf(st, g.node(c), z, &first, &count) || count <= 0) {
        absorb = false;
        break;
      }
      ranges.push_back({first, c});
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t covered = 0;
    for (size_t i = 0; absorb && i < ranges.size(); ++i) {
      const int64_t count = st.values[g.node(ranges[i].second).outputs[0]].shape[1];
      absorb = ranges[i].first == covered;
      covered += count;
      counts.push_back(count);
    }
    absorb = absorb && covered == xs[1];

    Node shuffle;
    shuffle.op_type = kChannelShuffleOp;
    shuffle.name = FusedName(g.node(r1).name, "ChannelShuffle");
    shuffle.inputs = inputs;
    shuffle.attrs["groups"] = Attribute::Int(groups);
    if (absorb) {
      for (const auto& [first, slice] : ranges) {
        shuffle.outputs.push_back(g.node(slice).outputs[0]);
        g.Kill(slice);
      }
      shuffle.attrs["split"] = Attribute::Ints(counts);
    } else {
      shuffle.outputs = {z};
    }
    if (inputs.size() > 1 || inputs[0] != x) g.Kill(concat);
    g.Kill(r1);
    g.Kill(t);
    g.node(r2) = std::move(shuffle);
  }
  g.Compact();
}

// ---- Einsum -> MatMul --------------------------------------------------------------------------------------------
// A two-input float32 Einsum whose every label is in both inputs or in the output, without repeated labels or
// broadcast ellipsis dims, is a batched matrix product: labels in A, B and the output are batch dims, in A and the
// output M, in B and the output N, in A and B only K (summed). It becomes Transpose(A) -> Reshape [batch.., M, K],
// Transpose(B) -> Reshape [batch.., K, N], MatMul, Reshape [batch.., M.., N..], Transpose to the output's order
// (identity transposes and reshapes left out: attention's "bhid,bhjd->bhij" is one Transpose and a MatMul).
// OSPREY_EINSUM_MATMUL=0 keeps every Einsum on the reference kernel (tests compare the two).
bool EinsumLoweringEnabled() {
  const char* v = std::getenv("OSPREY_EINSUM_MATMUL");
  return !(v && std::string(v) == "0");
}

bool IsIdentity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// The nodes computing `node` (an Einsum) as a MatMul, or none when it is not such a contraction.
std::vector<Node> LowerEinsum(CompileState& st, const Node& node) {
  if (node.inputs.size() != 2 || node.outputs.size() != 1 || node.inputs[0] < 0 || node.inputs[1] < 0) return {};
  const CompileValue& a = st.values[node.inputs[0]];
  const CompileValue& b = st.values[node.inputs[1]];
  if (a.dtype != DType::kF32 || b.dtype != DType::kF32) return {};
  EinsumSpec spec;
  try {
    spec = ParseEinsum(node.GetString("equation", ""), {a.shape, b.shape}, node.Describe());
  } catch (const Error&) {
    return {};  // the schema has reported it already
  }
  const size_t labels = spec.sizes.size();
  std::vector<int> where(labels, 0);  // bit 0: in A, bit 1: in B, bit 2: in the output
  for (int k = 0; k < 2; ++k) {
    const Shape& shape = k == 0 ? a.shape : b.shape;
    for (size_t d = 0; d < spec.inputs[k].size(); ++d) {
      const int l = spec.inputs[k][d];
      if ((where[l] & (1 << k)) || shape[d] != spec.sizes[l]) return {};  // a diagonal, or a broadcast dim
      where[l] |= 1 << k;
    }
  }
  for (int l : spec.output) where[l] |= 4;
  std::vector<int> batch, m, n, k;
  for (int l : spec.output) {
    if (where[l] == 7) batch.push_back(l);
    if (where[l] == 5) m.push_back(l);
    if (where[l] == 6) n.push_back(l);
  }
  for (int l : spec.inputs[0])
    if (where[l] == 3) k.push_back(l);
  for (size_t l = 0; l < labels; ++l)
    if (where[l] == 1 || where[l] == 2) return {};  // summed inside one input alone
  auto product = [&](const std::vector<int>& ls) {
    int64_t p = 1;
    for (int l : ls) p *= spec.sizes[l];
    return p;
  };
  std::vector<Node> out;
  // Appends `op_type` (a Transpose by `perm`, or a Reshape to `shape`) of value `in`, writing `to` (-1: a new value of
  // `shape`); returns the value written.
  auto add = [&](const char* op_type, int in, const std::vector<int64_t>& perm, const Shape& shape, int to = -1) {
    Node n;
    n.op_type = op_type;
    n.name = node.name + "/einsum_" + std::to_string(out.size());
    n.inputs = {in};
    if (!perm.empty()) n.attrs["perm"] = Attribute::Ints(perm);
    if (n.op_type == "Reshape")
      n.inputs.push_back(st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(shape.size())}, shape)));
    n.outputs = {to >= 0 ? to : st.AddValue(DType::kF32, shape)};
    out.push_back(std::move(n));
    return out.back().outputs[0];
  };
  // Transposes input `in` (labels `have`) to the order `want` and reshapes it to [batch.., rows, cols].
  auto arrange = [&](int in, const std::vector<int>& have, const std::vector<std::vector<int>>& want) {
    std::vector<int64_t> perm;
    Shape shape;
    for (const auto& group : want)
      for (int l : group) {
        perm.push_back(std::find(have.begin(), have.end(), l) - have.begin());
        shape.push_back(spec.sizes[l]);
      }
    int v = in;
    if (!IsIdentity(perm)) v = add("Transpose", v, perm, shape);
    Shape matrix;
    for (int l : batch) matrix.push_back(spec.sizes[l]);
    matrix.push_back(product(want[1]));
    matrix.push_back(product(want[2]));
    if (matrix != shape) v = add("Reshape", v, {}, matrix);
    return v;
  };
  const int a2 = arrange(node.inputs[0], spec.inputs[0], {batch, m, k});
  const int b2 = arrange(node.inputs[1], spec.inputs[1], {batch, k, n});
  Shape product_shape;
  for (int l : batch) product_shape.push_back(spec.sizes[l]);
  product_shape.push_back(product(m));
  product_shape.push_back(product(n));
  // [batch.., M.., N..] in that order, then the output's order.
  std::vector<int> grouped = batch;
  grouped.insert(grouped.end(), m.begin(), m.end());
  grouped.insert(grouped.end(), n.begin(), n.end());
  Shape grouped_shape;
  for (int l : grouped) grouped_shape.push_back(spec.sizes[l]);
  std::vector<int64_t> perm;
  for (int l : spec.output) perm.push_back(std::find(grouped.begin(), grouped.end(), l) - grouped.begin());
  const int y = node.outputs[0];
  const bool reshape = grouped_shape != product_shape, transpose = !IsIdentity(perm);
  Node mm;
  mm.op_type = "MatMul";
  mm.name = node.name;
  mm.inputs = {a2, b2};
  mm.outputs = {reshape || transpose ? st.AddValue(DType::kF32, product_shape) : y};
  out.push_back(std::move(mm));
  int v = out.back().outputs[0];
  if (reshape) v = add("Reshape", v, {}, grouped_shape, transpose ? -1 : y);
  if (transpose) add("Transpose", v, perm, st.values[y].shape, y);
  return out;
}

void EinsumToMatMul(CompileState& st) {
  if (!EinsumLoweringEnabled()) return;
  if (std::none_of(st.nodes.begin(), st.nodes.end(), [](const Node& n) { return n.op_type == "Einsum"; })) return;
  std::vector<Node> nodes;
  for (Node& node : st.nodes) {
    std::vector<Node> lowered;
    if (node.op_type == "Einsum") lowered = LowerEinsum(st, node);
    if (lowered.empty()) nodes.push_back(std::move(node));
    for (Node& n : lowered) nodes.push_back(std::move(n));
  }
  st.nodes = std::move(nodes);
}

}  // namespace

void FuseDataMovementPatterns(CompileState& st) { FuseChannelShuffle(st); }

// MaxPool or AveragePool(Concat(x_0..x_k, axis 1)), the Concat read by the pool alone => Concat(Pool(x_0)..Pool(x_k)):
// a pool works channel by channel, so pooling the parts gives the same channels. Made only where the pool shrinks its
// input (a stride above 1): the Concat then copies the smaller tensor, and FuseConvInputs can take it into the next 1x1
// Conv. SqueezeNet's two Fire-module Concats before a MaxPool are this (the two Concats FuseConvInputs left it).
// The pools take the Concat's place, the new Concat the pool's.
void PoolConcatParts(CompileState& st) {
  NodeView g(st);
  std::vector<std::vector<Node>> replace(st.nodes.size());  // node index -> the nodes taking its place
  std::vector<char> replaced(st.nodes.size(), 0);
  for (int p = 0; p < static_cast<int>(st.nodes.size()); ++p) {
    const bool max_pool = g.Is(p, "MaxPool");
    if (!max_pool && !g.Is(p, "AveragePool")) continue;
    const Node& pool = g.node(p);
    if (pool.inputs.size() != 1 || replaced[p]) continue;  // MaxPool's Indices output: Is() asks for one output
    const int x = pool.inputs[0], y = pool.outputs[0];
    const int c = g.Producer(x);
    if (!g.Is(c, "Concat") || replaced[c] || g.SoleConsumer(x) != p || !IsF32(st, x)) continue;
    const Node& concat = g.node(c);
    const Shape xs = st.values[x].shape;  // copies: AddValue below grows st.values
    const Shape ys = st.values[y].shape;
    const int64_t rank = static_cast<int64_t>(xs.size());
    const int64_t axis = concat.GetInt("axis", 0);
    if (rank < 3 || ys.size() != xs.size() || (axis != 1 && axis != 1 - rank) || concat.inputs.size() < 2) continue;
    if (NumElements(ys) >= NumElements(xs)) continue;
    bool parts_ok = true;
    for (int v : concat.inputs)
      parts_ok = parts_ok && IsF32(st, v) && !st.values[v].known && st.values[v].shape.size() == xs.size();
    if (!parts_ok) continue;
    Node joined = concat;
    joined.name = pool.name + "/Concat";
    joined.inputs.clear();
    joined.outputs = {y};
    for (size_t k = 0; k < concat.inputs.size(); ++k) {
      Shape part_shape = ys;
      part_shape[1] = st.values[concat.inputs[k]].shape[1];
      Node part = pool;
      part.name = pool.name + "/part" + std::to_string(k);
      part.inputs = {concat.inputs[k]};
      part.outputs = {st.AddValue(DType::kF32, part_shape)};
      joined.inputs.push_back(part.outputs[0]);
      replace[c].push_back(std::move(part));
    }
    replace[p].push_back(std::move(joined));
    replaced[c] = replaced[p] = 1;
  }
  std::vector<Node> nodes;
  nodes.reserve(st.nodes.size());
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    if (!replaced[i]) {
      nodes.push_back(std::move(st.nodes[i]));
      continue;
    }
    for (Node& n : replace[i]) nodes.push_back(std::move(n));
  }
  st.nodes = std::move(nodes);
}

// Run before activation fusion, which can then fold the Gelu into the MatMul that feeds it.
// ---------------------------------------------------------------- attention's NaN guard

// A constant whose every element is finite (for `zeros`, zero).
bool FiniteConstant(const CompileState& st, int v, bool zeros) {
  if (!IsF32Constant(st, v)) return false;
  const Tensor& t = st.values[v].value;
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(p[i]) || (zeros && p[i] != 0.f)) return false;
  return true;
}

// PyTorch's dynamo exporter writes scaled_dot_product_attention with a mask as
//   Add(scores, mask) -> Softmax -> Where(IsNaN(probs), 0, probs)
// (onnxscript's decomposition: a row masked everywhere gives NaN, the Where makes it zeros). Hugging Face's ViT,
// DeiT, DINOv2, DETR and Depth Anything pass a mask that is a constant once folded (all zeros: every position
// attends). With a constant mask of finite values, finite activations give finite scores and the guard changes
// nothing, so it goes, and an all-zero mask goes too: the Softmax then meets its products and FuseAttentionViews
// makes one kernel of the three (Depth Anything's 1370-token attention wrote and read three [6, 1370, 1370] tensors
// per layer). A mask that is not a constant, or holds an infinity, keeps the guard: a row masked everywhere is real.
// Only NaN or infinite activations, which make the model's output NaN anyway, would see the difference.
void DropSoftmaxNanGuard(CompileState& st) {
  NodeView g(st);
  for (int w = 0; w < static_cast<int>(st.nodes.size()); ++w) {
    if (!g.Is(w, "Where") || g.node(w).inputs.size() != 3) continue;
    const Node& where = g.node(w);
    const int cond = where.inputs[0], zero = where.inputs[1], probs = where.inputs[2];
    const int isnan = g.Producer(cond), sm = g.Producer(probs);
    if (!g.Is(isnan, "IsNaN") || g.node(isnan).inputs[0] != probs || g.SoleConsumer(cond) != w ||
        !g.Is(sm, "Softmax") || !FiniteConstant(st, zero, /*zeros=*/true) || st.values[zero].value.numel() != 1 ||
        st.is_graph_output[probs] || g.Consumers(probs).size() != 2 || !SameShape(st, probs, where.outputs[0]))
      continue;
    // The scores: a product (anything but an Add), or an Add of a finite constant mask to one.
    const int scores = g.node(sm).inputs[0];
    const int add = g.Producer(scores);
    int drop_add = -1;
    if (g.Is(add, "Add")) {
      const Node& a = g.node(add);
      if (a.inputs.size() != 2) continue;
      const int mask = IsF32Constant(st, a.inputs[1]) ? a.inputs[1] : a.inputs[0], other = OtherInput(a, mask);
      if (other < 0 || !FiniteConstant(st, mask, false) || IsF32Constant(st, other)) continue;
      if (FiniteConstant(st, mask, true) && SameShape(st, other, scores) && g.SoleConsumer(scores) == sm)
        drop_add = add;  // softmax(x + 0) = softmax(x)
    }
    if (drop_add >= 0) {
      g.node(sm).inputs[0] =
          OtherInput(g.node(drop_add), IsF32Constant(st, g.node(drop_add).inputs[1]) ? g.node(drop_add).inputs[1]
                                                                                     : g.node(drop_add).inputs[0]);
      g.Kill(drop_add);
    }
    g.node(sm).outputs[0] = where.outputs[0];
    g.Kill(isnan);
    g.Kill(w);
  }
  g.Compact();
}

void FuseTransformerPatterns(CompileState& st) {
  EinsumToMatMul(st);  // first: its MatMuls then take a bias like any other
  FuseLayerNorm(st);  // before the rewrite below: its ReduceMeans are over the last axis, never spatial-only
  FuseFastVarianceLayerNorm(st);
  FuseKerasLayerNorm(st);
  FuseGroupNorm(st);
  SpatialMeanToGlobalAveragePool(st);
  FuseGelu(st);
  FuseMatMulBias(st);
  DropSoftmaxNanGuard(st);
}

}  // namespace osprey
