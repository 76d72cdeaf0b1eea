// The com.microsoft ops of ONNX Runtime's transformer optimiser (ops/contrib.cc) as default-domain ops, made when a
// model is compiled; each lowered node is then inferred and folded like any other (and fused: a Gelu after a MatMul,
// a LayerNormalization). The arithmetic is the contrib kernels': FastGelu's tanh form is ONNX Gelu's "tanh"
// approximation, SkipLayerNormalization's epsilon defaults to 1e-12 as ONNX Runtime's does. Also the com.microsoft ops
// of models ORT saved after optimising them (FusedConv, FusedGemm, FusedMatMul, DynamicQuantizeMatMul:
// LowerOrtFused).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/op_registry.h"
#include "runtime/lowering.h"

namespace osprey {
namespace {

Node Lowered(const Node& from, const char* op, const char* suffix, std::vector<int> inputs, int output) {
  return MakeNode(op, from.name + suffix, std::move(inputs), {output});
}

int Input(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }

// Scaled dot-product attention over heads, as default-domain nodes: the shared part of Attention and
// MultiHeadAttention. Q [B, S, N x h], K [B, L, N x h], V [B, L, N x hv] (each already projected) -> [B, S, N x hv]:
// per-head Reshape/Transpose, Q K^T * scale, the masks added (a raw 0/1 mask as (1 - mask) * mask_filter_value,
// unidirectional as that value above the diagonal, an attention bias as is), Softmax over the last axis, times V,
// heads merged.
class AttentionBuilder : public NodeBuilder {
 public:
  using NodeBuilder::NodeBuilder;

  // [B, T, N x h] -> [B, N, T, h] (or [B, N, h, T] with `keys_transposed`).
  int Heads(int x, int64_t batch, int64_t length, int64_t heads, int64_t head, bool keys_transposed,
            const std::string& name) {
    const int split = Add("Reshape", "/" + name + "_heads", {x, Ints({batch, length, heads, head})});
    const int out = Add("Transpose", "/" + name + "_transpose", {split});
    Last().attrs["perm"] =
        Attribute::Ints(keys_transposed ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3});
    return out;
  }
  // Q [B, N, S, h] and K^T [B, N, h, L] -> scaled scores [B, N, S, L].
  void Scores(int q, int kt, float scale) {
    scores_ = Add("Mul", "/scale", {Add("MatMul", "/qk", {q, kt}), Float(scale)});
  }
  // A raw 0/1 mask (any integer or float type) reshaped to `shape` (broadcast against [B, N, S, L]).
  void RawMask(int mask, std::vector<int64_t> shape, float filter) {
    const int as_float = Add("Cast", "/mask_float", {mask});
    Last().attrs["to"] = Attribute::Int(1);  // FLOAT
    const int inverted = Add("Sub", "/mask_invert", {Float(1.f), as_float});
    const int valued = Add("Mul", "/mask_value", {inverted, Float(filter)});
    AddToScores(Add("Reshape", "/mask_shape", {valued, Ints(std::move(shape))}), "/mask");
  }
  void Causal(int64_t seq, int64_t total, float filter) {
    if (seq > 8192 || total > 8192)  // the mask is a constant of seq x total floats, made here
      Fail("unidirectional attention over " + std::to_string(total) + " tokens is not supported (at most 8192)");
    Tensor causal(DType::kF32, {seq, total});
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < total; ++j) causal.data<float>()[i * total + j] = j > i + (total - seq) ? filter : 0.f;
    AddToScores(st_.AddConstant(std::move(causal)), "/causal");
  }
  void AddToScores(int term, const std::string& name) { scores_ = Add("Add", name, {scores_, term}); }
  // The node's masks: a raw 0/1 `mask` input [B, L] or [B, S, L] (`what` names it in errors), unidirectional, and an
  // attention bias input added as is.
  void Masks(int mask, int bias, int64_t batch, int64_t seq, int64_t total, const char* what) {
    const float filter = node_.GetFloat("mask_filter_value", -10000.f);
    if (mask >= 0) {
      const Shape ms = st_.values[mask].shape;
      if (ms == Shape{batch, total})
        RawMask(mask, {batch, 1, 1, total}, filter);
      else if (ms == Shape{batch, seq, total})
        RawMask(mask, {batch, 1, seq, total}, filter);
      else
        Fail(std::string(what) + " of shape " + ShapeToString(ms) + " is not supported; a raw 0/1 mask [" +
             std::to_string(batch) + ", " + std::to_string(total) + "] or [" + std::to_string(batch) + ", " +
             std::to_string(seq) + ", " + std::to_string(total) + "] is (sequence lengths are not)");
    }
    if (node_.GetInt("unidirectional", 0) != 0) Causal(seq, total, filter);
    if (bias >= 0) AddToScores(bias, "/attention_bias");
  }
  // Softmax, times V [B, N, L, hv], heads merged into `out` [B, S, N x hv].
  std::vector<Node> Finish(int v, int64_t batch, int64_t seq, int64_t hidden_v, int out) {
    const int probs = Add("Softmax", "/softmax", {scores_});
    Last().attrs["axis"] = Attribute::Int(-1);
    const int merged = Add("Transpose", "/merge", {Add("MatMul", "/context", {probs, v})});
    Last().attrs["perm"] = Attribute::Ints({0, 2, 1, 3});
    Add("Reshape", "", {merged, Ints({batch, seq, hidden_v})}, out);
    return Take();
  }

 private:
  int scores_ = -1;
};

// Whether output i of `node` is read (a graph output; the optional outputs osprey does not produce are refused only
// then, since exporters leave unused ones named).
bool OutputUsed(const CompileState& st, const Node& node, size_t i) {
  return i < node.outputs.size() && node.outputs[i] >= 0 && st.is_graph_output[node.outputs[i]];
}

// com.microsoft.Attention (BERT- and ViT-style self-attention as ORT's optimiser fuses it): input [B, S, I], merged
// weights [I, Hq + Hk + Hv] (constant), bias [Hq + Hk + Hv], mask_index, attention_bias -> [B, S, Hv]: three
// projections (the constant weights and bias split here), then AttentionBuilder. Refused by name: past / present
// state, rotary embedding, and mask_index as sequence lengths ([B], [2B], [3B + 2]).
std::vector<Node> LowerAttention(CompileState& st, const Node& node) {
  AttentionBuilder b(st, node);
  if (Input(node, 4) >= 0 || OutputUsed(st, node, 1))
    b.Fail("past and present key/value state are not supported (an encoder's Attention has neither)");
  if (node.GetInt("do_rotary", 0) != 0) b.Fail("rotary embedding (do_rotary) is not supported");
  if (node.GetInt("past_present_share_buffer", 0) != 0 || Input(node, 6) >= 0)
    b.Fail("past_present_share_buffer / past_sequence_length are not supported");
  const int x = node.inputs[0], w = node.inputs[1];
  const Shape xs = st.values[x].shape;
  if (xs.size() != 3 || st.values[x].dtype != DType::kF32)
    b.Fail("input must be float32 [batch, sequence, hidden], got " + ShapeToString(xs));
  if (!st.values[w].known || st.values[w].dtype != DType::kF32 || st.values[w].shape.size() != 2 ||
      st.values[w].shape[0] != xs[2])
    b.Fail("weights must be a constant float32 [" + std::to_string(xs[2]) + ", 3 x hidden]");
  const int64_t heads = node.GetInt("num_heads", 0), total = st.values[w].shape[1];
  std::vector<int64_t> sizes = node.GetInts("qkv_hidden_sizes", {total / 3, total / 3, total - 2 * (total / 3)});
  if (heads <= 0 || sizes.size() != 3 || sizes[0] != sizes[1] || sizes[0] + sizes[1] + sizes[2] != total ||
      sizes[0] % heads != 0 || sizes[2] % heads != 0 || sizes[0] <= 0 || sizes[2] <= 0)
    b.Fail("num_heads " + std::to_string(heads) + " and qkv_hidden_sizes " + ShapeToString(sizes) +
           " do not divide the merged weights' " + std::to_string(total) + " columns");
  const int bias = Input(node, 2);
  if (bias >= 0 &&
      (!st.values[bias].known || st.values[bias].dtype != DType::kF32 || NumElements(st.values[bias].shape) != total))
    b.Fail("bias must be a constant float32 [" + std::to_string(total) + "]");
  const int64_t batch = xs[0], seq = xs[1], head_qk = sizes[0] / heads, head_v = sizes[2] / heads;
  const Tensor weights = st.values[w].value;  // copies: AddConstant grows st.values
  const Tensor bias_values = bias >= 0 ? st.values[bias].value : Tensor();
  // One projection: columns [begin, begin + width) of the weights and bias.
  auto project = [&](int64_t begin, int64_t width, const std::string& name) {
    Tensor wp(DType::kF32, {xs[2], width});
    for (int64_t r = 0; r < xs[2]; ++r)
      for (int64_t c = 0; c < width; ++c)
        wp.data<float>()[r * width + c] = weights.data<float>()[r * total + begin + c];
    int y = b.Add("MatMul", "/" + name, {x, st.AddConstant(std::move(wp))});
    if (bias >= 0) {
      Tensor bp(DType::kF32, {width});
      for (int64_t c = 0; c < width; ++c) bp.data<float>()[c] = bias_values.data<float>()[begin + c];
      y = b.Add("Add", "/" + name + "_bias", {y, st.AddConstant(std::move(bp))});
    }
    return y;
  };
  const int q = b.Heads(project(0, sizes[0], "q"), batch, seq, heads, head_qk, false, "q");
  const int k = b.Heads(project(sizes[0], sizes[1], "k"), batch, seq, heads, head_qk, true, "k");
  const int v = b.Heads(project(2 * sizes[0], sizes[2], "v"), batch, seq, heads, head_v, false, "v");
  b.Scores(q, k, node.GetFloat("scale", 1.f / std::sqrt(static_cast<float>(head_qk))));
  b.Masks(Input(node, 3), Input(node, 5), batch, seq, seq, "mask_index");
  return b.Finish(v, batch, seq, sizes[2], node.outputs[0]);
}

// com.microsoft.MultiHeadAttention with separate, already projected query [B, S, D], key [B, L, D] and value
// [B, L, Dv] (what ORT's optimiser writes for CLIP- and ViT-style encoders and cross-attention), an optional bias
// [D + D + Dv] added to the three, key_padding_mask as a raw 0/1 mask [B, L] or [B, S, L], attention_bias,
// unidirectional, scale: AttentionBuilder. Refused by name: packed Q/K/V or K/V, key and value in the
// [B, N, L, h] cache form, past / present state, cache_indirection, and key_padding_mask as sequence lengths.
std::vector<Node> LowerMultiHeadAttention(CompileState& st, const Node& node) {
  AttentionBuilder b(st, node);
  const int query = node.inputs[0], key = Input(node, 1), value = Input(node, 2), bias = Input(node, 3);
  if (Input(node, 6) >= 0 || Input(node, 7) >= 0 || Input(node, 8) >= 0 || Input(node, 9) >= 0 ||
      OutputUsed(st, node, 1) || OutputUsed(st, node, 2) || OutputUsed(st, node, 3))
    b.Fail(
        "past / present key and value, cache_indirection and the qk output are not supported (an encoder's "
        "attention has none)");
  if (key < 0 || value < 0) b.Fail("packed query/key/value (key or value absent) is not supported");
  const Shape qs = st.values[query].shape, ks = st.values[key].shape, vs = st.values[value].shape;
  if (qs.size() != 3 || ks.size() != 3 || vs.size() != 3 || st.values[query].dtype != DType::kF32 ||
      st.values[key].dtype != DType::kF32 || st.values[value].dtype != DType::kF32 || ks[0] != qs[0] ||
      vs[0] != qs[0] || vs[1] != ks[1] || ks[2] != qs[2])
    b.Fail("query [B, S, D], key [B, L, D] and value [B, L, Dv] (float32) are supported, got " + ShapeToString(qs) +
           ", " + ShapeToString(ks) + ", " + ShapeToString(vs));
  const int64_t heads = node.GetInt("num_heads", 0), batch = qs[0], seq = qs[1], total = ks[1], d = qs[2], dv = vs[2];
  if (heads <= 0 || d % heads != 0 || dv % heads != 0)
    b.Fail("num_heads " + std::to_string(heads) + " does not divide the hidden sizes " + std::to_string(d) + " and " +
           std::to_string(dv));
  int q = query, k = key, v = value;
  if (bias >= 0) {
    if (NumElements(st.values[bias].shape) != 2 * d + dv || st.values[bias].dtype != DType::kF32)
      b.Fail("bias must be float32 [" + std::to_string(2 * d + dv) + "], got " + ShapeToString(st.values[bias].shape));
    if (st.opset < 10) b.Fail("a bias needs opset 10 or later (Slice with inputs)");
    const int flat = b.Add("Reshape", "/bias_flat", {bias, b.Ints({2 * d + dv})});
    auto part_of_flat = [&](int x, int64_t begin, int64_t width, const std::string& name) {
      const int piece =
          b.Add("Slice", "/" + name + "_bias_part", {flat, b.Ints({begin}), b.Ints({begin + width}), b.Ints({0})});
      return b.Add("Add", "/" + name + "_bias", {x, piece});
    };
    q = part_of_flat(q, 0, d, "q");
    k = part_of_flat(k, d, d, "k");
    v = part_of_flat(v, 2 * d, dv, "v");
  }
  q = b.Heads(q, batch, seq, heads, d / heads, false, "q");
  k = b.Heads(k, batch, total, heads, d / heads, true, "k");
  v = b.Heads(v, batch, total, heads, dv / heads, false, "v");
  b.Scores(q, k, node.GetFloat("scale", 1.f / std::sqrt(static_cast<float>(d / heads))));
  b.Masks(Input(node, 4), Input(node, 5), batch, seq, total, "key_padding_mask");
  return b.Finish(v, batch, seq, dv, node.outputs[0]);
}

// The QOperator ops ONNX Runtime's quantiser writes around transformers' elementwise steps, as
// DequantizeLinear -> the float op -> QuantizeLinear (the arithmetic ORT's own fallback uses; the pairs then fuse
// like a QDQ model's): QLinearMul (A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp?), QLinearSoftmax (X, X_scale,
// X_zp, Y_scale, Y_zp; axis, opset), QLinearConcat (Y_scale, Y_zp, then (X, X_scale, X_zp) per input; axis).
std::vector<Node> LowerQLinear(CompileState& st, const Node& node) {
  auto fail = [&](const std::string& what) { throw Error(ErrorCode::kUnsupported, node.Describe() + ": " + what); };
  std::vector<Node> nodes;
  auto dequantize = [&](size_t at) {
    const int x = node.inputs[at];
    if (x < 0 || Input(node, at + 1) < 0) fail("input " + std::to_string(at) + " and its scale are required");
    const int out = st.AddValue(DType::kF32, {});
    std::vector<int> inputs = {x, node.inputs[at + 1]};
    if (Input(node, at + 2) >= 0) inputs.push_back(node.inputs[at + 2]);
    nodes.push_back(MakeNode("DequantizeLinear", node.name + "/dequantize_" + std::to_string(at), inputs, {out}));
    return out;
  };
  // y (float) -> the node's output, quantised with scale input `at` and zero point `at + 1` (absent: a zero of the
  // type input `like` has, so an int8 op stays int8).
  auto quantize = [&](int y, size_t at, size_t like) {
    int zp = Input(node, at + 1);
    if (zp < 0) {
      const DType t = st.values[node.inputs[like]].dtype;
      zp = st.AddConstant(t == DType::kI8 ? Tensor::Scalar<int8_t>(0) : Tensor::Scalar<uint8_t>(0));
    }
    nodes.push_back(MakeNode("QuantizeLinear", node.name + "/quantize", {y, node.inputs[at], zp}, {node.outputs[0]}));
  };
  const int y = st.AddValue(DType::kF32, {});
  if (node.op_type == "QLinearMul") {
    const int a = dequantize(0), b = dequantize(3);
    nodes.push_back(MakeNode("Mul", node.name, {a, b}, {y}));
    quantize(y, 6, 0);
  } else if (node.op_type == "QLinearSoftmax") {
    const int64_t rank = static_cast<int64_t>(st.values[node.inputs[0]].shape.size());
    const int64_t axis = node.GetInt("axis", -1);
    if (axis != -1 && axis != rank - 1)  // the last axis: opset 13's Softmax and the older one agree there
      fail("axis " + std::to_string(axis) + " is not supported (the last axis is)");
    const int x = dequantize(0);
    Node softmax = MakeNode("Softmax", node.name, {x}, {y});
    softmax.attrs["axis"] = Attribute::Int(rank - 1);
    nodes.push_back(std::move(softmax));
    quantize(y, 3, 0);
  } else {  // QLinearConcat
    if (node.inputs.size() < 5 || (node.inputs.size() - 2) % 3 != 0)
      fail("inputs must be Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got " +
           std::to_string(node.inputs.size()));
    std::vector<int> parts;
    for (size_t at = 2; at < node.inputs.size(); at += 3) parts.push_back(dequantize(at));
    Node concat = MakeNode("Concat", node.name, parts, {y});
    concat.attrs["axis"] = Attribute::Int(node.GetInt("axis", 0));
    nodes.push_back(std::move(concat));
    quantize(y, 0, 2);
  }
  return nodes;
}

// The activation of ORT's FusedConv (`activation` with `activation_params`: LeakyRelu [alpha], Clip [min, max],
// HardSigmoid [alpha, beta]) or FusedGemm (`activation_alpha`, `activation_beta`, `activation_gamma`) as a
// default-domain node from `x` to `out`; without one, an Identity.
void AppendActivation(NodeBuilder& b, const CompileState& st, const Node& node, int x, int out) {
  const std::string act = node.GetString("activation", "");
  const std::vector<float> params = node.GetFloats("activation_params", {});
  const bool conv = node.op_type == "FusedConv";
  // Parameter i: FusedConv's activation_params[i], FusedGemm's activation_alpha / beta / gamma.
  auto param = [&](size_t i, float fallback) {
    static const char* const kGemmNames[] = {"activation_alpha", "activation_beta", "activation_gamma"};
    if (conv) return i < params.size() ? params[i] : fallback;
    return node.GetFloat(kGemmNames[i], fallback);
  };
  if (act.empty()) {
    b.Add("Identity", "/activation", {x}, out);
    return;
  }
  if (act == "Relu" || act == "Tanh" || act == "Sigmoid" || act == "Softsign" || act == "Softplus" ||
      act == "HardSwish") {
    b.Add(act.c_str(), "/" + act, {x}, out);
  } else if (act == "LeakyRelu" || act == "Elu" || act == "ThresholdedRelu") {
    b.Add(act.c_str(), "/" + act, {x}, out);
    b.Last().attrs["alpha"] = Attribute::Float(param(0, act == "LeakyRelu" ? kLeakyReluAlpha : 1.f));
  } else if (act == "HardSigmoid") {
    b.Add("HardSigmoid", "/HardSigmoid", {x}, out);
    b.Last().attrs["alpha"] = Attribute::Float(param(0, kHardSigmoidAlpha));
    b.Last().attrs["beta"] = Attribute::Float(param(1, kHardSigmoidBeta));
  } else if (act == "Selu") {
    b.Add("Selu", "/Selu", {x}, out);
    b.Last().attrs["alpha"] = Attribute::Float(param(0, kSeluAlpha));
    b.Last().attrs["gamma"] = Attribute::Float(conv ? param(1, kSeluGamma) : param(2, kSeluGamma));
  } else if (act == "Clip") {
    const float lo = param(0, -std::numeric_limits<float>::max()), hi = param(1, std::numeric_limits<float>::max());
    if (st.opset < 11) {
      b.Add("Clip", "/Clip", {x}, out);
      b.Last().attrs["min"] = Attribute::Float(lo);
      b.Last().attrs["max"] = Attribute::Float(hi);
    } else {
      b.Add("Clip", "/Clip", {x, b.Float(lo), b.Float(hi)}, out);
    }
  } else {
    b.Fail("activation '" + act + "' is not supported");
  }
}

// ONNX Runtime's saved optimised models (ORT_ENABLE_EXTENDED): FusedConv (X, W, B?, Z?) = act(Conv(X, W, B) + Z);
// FusedGemm (A, B, C?) = act(Gemm); FusedMatMul / TransposeMatMul (A, B) = alpha * op(A) op(B), transBatchA/B reading
// an operand stored [d0, batch.., d_last] as [batch.., d0, d_last] (ORT's MatmulTransposeFusion writes it for
// attention's K and V kept [T, B x N, h]), then transA/B swapping the last two;
// DynamicQuantizeMatMul (A, B int8/uint8, b_scale, b_zero_point?, bias?) = A quantized to uint8 as
// DynamicQuantizeLinear does, times B in integers, scaled by both scales, plus bias (ORT's arithmetic).
std::vector<Node> LowerOrtFused(CompileState& st, const Node& node) {
  NodeBuilder b(st, node);
  const std::string& op = node.op_type;
  const int out = node.outputs[0];
  if (op == "FusedConv" || op == "FusedGemm") {
    Node inner = node;
    inner.domain.clear();
    inner.op_type = op == "FusedConv" ? "Conv" : "Gemm";
    inner.name = node.name + "/" + inner.op_type;
    for (const char* a : {"activation", "activation_params", "activation_alpha", "activation_beta", "activation_gamma"})
      inner.attrs.erase(a);
    int y = b.Temp();
    if (op == "FusedConv" && node.inputs.size() > 3) inner.inputs.resize(3);
    inner.outputs = {y};
    std::vector<Node> nodes = {inner};
    if (op == "FusedConv" && Input(node, 3) >= 0) y = b.Add("Add", "/sum", {y, node.inputs[3]});
    AppendActivation(b, st, node, y, out);
    for (Node& n : b.Take()) nodes.push_back(std::move(n));
    return nodes;
  }
  if (op == "DynamicQuantizeMatMul") {
    const int a = node.inputs[0], w = node.inputs[1], w_scale = node.inputs[2];
    if (st.values[a].dtype != DType::kF32) b.Fail("input A must be float32");
    const int aq = b.Temp(), a_scale = b.Temp(), a_zero = b.Temp();
    b.Add("DynamicQuantizeLinear", "/quantize_a", {a}, aq);
    b.Last().outputs = {aq, a_scale, a_zero};
    std::vector<int> mm_inputs = {aq, w, a_zero};
    if (Input(node, 3) >= 0) mm_inputs.push_back(node.inputs[3]);
    const int product = b.Add("MatMulInteger", "/integer", mm_inputs);
    const int as_float = b.Add("Cast", "/float", {product});
    b.Last().attrs["to"] = Attribute::Int(1);  // FLOAT
    const int scaled =
        b.Add("Mul", "/scale", {as_float, b.Add("Mul", "/scales", {a_scale, w_scale})}, Input(node, 4) >= 0 ? -1 : out);
    if (Input(node, 4) >= 0) b.Add("Add", "/bias", {scaled, node.inputs[4]}, out);
    return b.Take();
  }
  // FusedMatMul / TransposeMatMul
  const float alpha = node.GetFloat("alpha", 1.f);
  auto operand = [&](int x, const char* batch_attr, const char* trans_attr, const std::string& name) {
    const int64_t rank = static_cast<int64_t>(st.values[x].shape.size());
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < rank; ++d) perm.push_back(d);
    // transBatch: stored [d0, b1, .., bk, d_last], read as [b1, .., bk, d0, d_last].
    if (node.GetInt(batch_attr, 0) != 0 && rank > 2) std::rotate(perm.begin(), perm.begin() + 1, perm.end() - 1);
    if (node.GetInt(trans_attr, 0) != 0) {
      if (rank < 2) b.Fail(std::string(trans_attr) + " needs a matrix, got rank " + std::to_string(rank));
      std::swap(perm[rank - 2], perm[rank - 1]);
    }
    bool identity = true;
    for (int64_t d = 0; d < rank; ++d) identity = identity && perm[d] == d;
    if (identity) return x;
    const int t = b.Add("Transpose", "/" + name + "_transpose", {x});
    b.Last().attrs["perm"] = Attribute::Ints(perm);
    return t;
  };
  const int a = operand(node.inputs[0], "transBatchA", "transA", "a");
  const int w = operand(node.inputs[1], "transBatchB", "transB", "b");
  const int product = b.Add("MatMul", "/matmul", {a, w}, alpha == 1.f ? out : -1);
  if (alpha != 1.f) b.Add("Mul", "/alpha", {product, b.Float(alpha)}, out);
  return b.Take();
}

}  // namespace

bool IsLoweredContribOp(const Node& node) {
  return node.domain == kMicrosoftDomain &&
         (node.op_type == "Gelu" || node.op_type == "FastGelu" || node.op_type == "BiasGelu" ||
          node.op_type == "QuickGelu" || node.op_type == "SkipLayerNormalization" || node.op_type == "Attention" ||
          node.op_type == "MultiHeadAttention" || node.op_type == "QLinearMul" || node.op_type == "QLinearSoftmax" ||
          node.op_type == "QLinearConcat" || node.op_type == "FusedConv" || node.op_type == "FusedGemm" ||
          node.op_type == "FusedMatMul" || node.op_type == "TransposeMatMul" ||
          node.op_type == "DynamicQuantizeMatMul");
}

std::vector<Node> LowerContribOp(CompileState& st, const Node& node) {
  const std::string& op = node.op_type;
  const int out = node.outputs.empty() ? -1 : node.outputs[0];
  if (out < 0) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": output 0 is required");
  if (op == "Attention") return LowerAttention(st, node);
  if (op == "MultiHeadAttention") return LowerMultiHeadAttention(st, node);
  if (op == "QLinearMul" || op == "QLinearSoftmax" || op == "QLinearConcat") return LowerQLinear(st, node);
  if (op == "FusedConv" || op == "FusedGemm" || op == "FusedMatMul" || op == "TransposeMatMul" ||
      op == "DynamicQuantizeMatMul")
    return LowerOrtFused(st, node);
  auto temp = [&st]() { return st.AddValue(DType::kF32, {}); };  // typed by inference
  if (op == "Gelu") {
    Node g = node;
    g.domain.clear();
    g.attrs.clear();
    return {g};
  }
  if (op == "QuickGelu") {
    const int scaled = temp(), gate = temp();
    const int alpha = st.AddConstant(Tensor::Scalar<float>(node.GetFloat("alpha", 1.702f)));
    return {Lowered(node, "Mul", "/scale", {node.inputs[0], alpha}, scaled),
            Lowered(node, "Sigmoid", "/sigmoid", {scaled}, gate),
            Lowered(node, "Mul", "/gate", {node.inputs[0], gate}, out)};
  }
  std::vector<Node> nodes;
  if (op == "FastGelu" || op == "BiasGelu") {
    int x = node.inputs[0];
    if (Input(node, 1) >= 0) {
      const int sum = temp();
      nodes.push_back(Lowered(node, "Add", "/bias", {x, node.inputs[1]}, sum));
      x = sum;
    }
    Node g = Lowered(node, "Gelu", "", {x}, out);
    if (op == "FastGelu") g.attrs["approximate"] = Attribute::String("tanh");
    nodes.push_back(std::move(g));
    return nodes;
  }
  // SkipLayerNormalization: its mean and inv_std_var outputs are LayerNormalization's ([..., 1], axis -1).
  const int sum_out = node.outputs.size() > 3 ? node.outputs[3] : -1;
  const bool bias = Input(node, 4) >= 0;
  const int skipped = !bias && sum_out >= 0 ? sum_out : temp();
  nodes.push_back(Lowered(node, "Add", "/skip", {node.inputs[0], node.inputs[1]}, skipped));
  int sum = skipped;
  if (bias) {
    sum = sum_out >= 0 ? sum_out : temp();
    nodes.push_back(Lowered(node, "Add", "/bias", {skipped, node.inputs[4]}, sum));
  }
  Node ln = Lowered(node, "LayerNormalization", "", {sum, node.inputs[2]}, out);
  if (Input(node, 3) >= 0) ln.inputs.push_back(node.inputs[3]);
  for (size_t i = 1; i < 3 && i < node.outputs.size(); ++i) ln.outputs.push_back(node.outputs[i]);
  ln.attrs["axis"] = Attribute::Int(-1);
  ln.attrs["epsilon"] = Attribute::Float(node.GetFloat("epsilon", 1e-12f));
  nodes.push_back(std::move(ln));
  return nodes;
}

}  // namespace osprey
