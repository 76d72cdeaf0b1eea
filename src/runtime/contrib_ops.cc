// The com.microsoft ops of ONNX Runtime's transformer optimiser (ops/contrib.cc) as default-domain ops, made when a
// model is compiled; each lowered node is then inferred and folded like any other (and fused: a Gelu after a MatMul,
// a LayerNormalization). The arithmetic is the contrib kernels': FastGelu's tanh form is ONNX Gelu's "tanh"
// approximation, SkipLayerNormalization's epsilon defaults to 1e-12 as ONNX Runtime's does.
#include <cmath>
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

Node Lowered(const Node& from, const char* op, const char* suffix, std::vector<int> inputs, int output) {
  return MakeNode(op, from.name + suffix, std::move(inputs), {output});
}

int Input(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }

// com.microsoft.Attention (BERT- and ViT-style self-attention as ORT's optimiser fuses it): input [B, S, I], merged
// weights [I, Hq + Hk + Hv] (constant), bias [Hq + Hk + Hv], mask_index, attention_bias -> [B, S, Hv]. Lowered to
// three projections (the constant weights and bias split here), per-head Reshape/Transpose, Q K^T * scale, the masks
// added (a raw 0/1 mask of shape [B, T] or [B, S, T] as (1 - mask) * mask_filter_value, unidirectional as that value
// above the diagonal, attention_bias as is), Softmax over the last axis, times V, heads merged. Refused by name: past /
// present state, rotary embedding, and mask_index as sequence lengths ([B], [2B], [3B + 2]).
std::vector<Node> LowerAttention(CompileState& st, const Node& node) {
  auto fail = [&](const std::string& what) { throw Error(ErrorCode::kUnsupported, node.Describe() + ": " + what); };
  if (Input(node, 4) >= 0 || (node.outputs.size() > 1 && node.outputs[1] >= 0 && st.is_graph_output[node.outputs[1]]))
    fail("past and present key/value state are not supported (an encoder's Attention has neither)");
  if (node.GetInt("do_rotary", 0) != 0) fail("rotary embedding (do_rotary) is not supported");
  if (node.GetInt("past_present_share_buffer", 0) != 0 || Input(node, 6) >= 0)
    fail("past_present_share_buffer / past_sequence_length are not supported");
  const int x = node.inputs[0], w = node.inputs[1];
  const Shape xs = st.values[x].shape;
  if (xs.size() != 3 || st.values[x].dtype != DType::kF32)
    fail("input must be float32 [batch, sequence, hidden], got " + ShapeToString(xs));
  if (!st.values[w].known || st.values[w].dtype != DType::kF32 || st.values[w].shape.size() != 2 ||
      st.values[w].shape[0] != xs[2])
    fail("weights must be a constant float32 [" + std::to_string(xs[2]) + ", 3 x hidden]");
  const int64_t heads = node.GetInt("num_heads", 0), total = st.values[w].shape[1];
  std::vector<int64_t> sizes = node.GetInts("qkv_hidden_sizes", {total / 3, total / 3, total - 2 * (total / 3)});
  if (heads <= 0 || sizes.size() != 3 || sizes[0] != sizes[1] || sizes[0] + sizes[1] + sizes[2] != total ||
      sizes[0] % heads != 0 || sizes[2] % heads != 0 || sizes[0] <= 0 || sizes[2] <= 0)
    fail("num_heads " + std::to_string(heads) + " and qkv_hidden_sizes " + ShapeToString(sizes) +
         " do not divide the merged weights' " + std::to_string(total) + " columns");
  const int bias = Input(node, 2);
  if (bias >= 0 &&
      (!st.values[bias].known || st.values[bias].dtype != DType::kF32 || NumElements(st.values[bias].shape) != total))
    fail("bias must be a constant float32 [" + std::to_string(total) + "]");
  const int64_t batch = xs[0], seq = xs[1], head_qk = sizes[0] / heads, head_v = sizes[2] / heads;
  const Tensor weights = st.values[w].value;  // copies: AddConstant grows st.values
  const Tensor bias_values = bias >= 0 ? st.values[bias].value : Tensor();
  std::vector<Node> nodes;
  auto temp = [&st]() { return st.AddValue(DType::kF32, {}); };
  auto ints = [&](std::vector<int64_t> v) {
    return st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v));
  };
  // One projection: columns [begin, begin + width) of the weights and bias, then [B, S, N, h] -> `perm`.
  auto project = [&](int64_t begin, int64_t width, int64_t head, std::vector<int64_t> perm, const char* name) {
    Tensor wp(DType::kF32, {xs[2], width});
    for (int64_t r = 0; r < xs[2]; ++r)
      for (int64_t c = 0; c < width; ++c)
        wp.data<float>()[r * width + c] = weights.data<float>()[r * total + begin + c];
    int y = temp();
    nodes.push_back(Lowered(node, "MatMul", (std::string("/") + name).c_str(), {x, st.AddConstant(std::move(wp))}, y));
    if (bias >= 0) {
      Tensor bp(DType::kF32, {width});
      for (int64_t c = 0; c < width; ++c) bp.data<float>()[c] = bias_values.data<float>()[begin + c];
      const int biased = temp();
      nodes.push_back(Lowered(node, "Add", (std::string("/") + name + "_bias").c_str(),
                               {y, st.AddConstant(std::move(bp))}, biased));
      y = biased;
    }
    const int split = temp(), out = temp();
    nodes.push_back(Lowered(node, "Reshape", (std::string("/") + name + "_heads").c_str(),
                             {y, ints({batch, seq, heads, head})}, split));
    Node t = Lowered(node, "Transpose", (std::string("/") + name + "_transpose").c_str(), {split}, out);
    t.attrs["perm"] = Attribute::Ints(std::move(perm));
    nodes.push_back(std::move(t));
    return out;
  };
  const int q = project(0, sizes[0], head_qk, {0, 2, 1, 3}, "q");            // [B, N, S, h]
  const int k = project(sizes[0], sizes[1], head_qk, {0, 2, 3, 1}, "k");     // [B, N, h, S]
  const int v = project(2 * sizes[0], sizes[2], head_v, {0, 2, 1, 3}, "v");  // [B, N, S, hv]
  int scores = temp();
  nodes.push_back(Lowered(node, "MatMul", "/qk", {q, k}, scores));
  const float scale = node.GetFloat("scale", 1.f / std::sqrt(static_cast<float>(head_qk)));
  const int scaled = temp();
  nodes.push_back(Lowered(node, "Mul", "/scale", {scores, st.AddConstant(Tensor::Scalar<float>(scale))}, scaled));
  scores = scaled;
  const float filter = node.GetFloat("mask_filter_value", -10000.f);
  auto add = [&](int term, const char* name) {
    const int sum = temp();
    nodes.push_back(Lowered(node, "Add", name, {scores, term}, sum));
    scores = sum;
  };
  if (const int mask = Input(node, 3); mask >= 0) {
    const Shape ms = st.values[mask].shape;
    const bool raw2 = ms == Shape{batch, seq}, raw3 = ms == Shape{batch, seq, seq};
    if (!raw2 && !raw3)
      fail("mask_index of shape " + ShapeToString(ms) +
           " is not supported; a raw 0/1 mask [batch, sequence] or "
           "[batch, sequence, sequence] is (sequence lengths are not)");
    const int as_float = temp(), inverted = temp(), scaled_mask = temp(), shaped = temp();
    Node cast = Lowered(node, "Cast", "/mask_float", {mask}, as_float);
    cast.attrs["to"] = Attribute::Int(1);  // FLOAT
    nodes.push_back(std::move(cast));
    nodes.push_back(
        Lowered(node, "Sub", "/mask_invert", {st.AddConstant(Tensor::Scalar<float>(1.f)), as_float}, inverted));
    nodes.push_back(
        Lowered(node, "Mul", "/mask_value", {inverted, st.AddConstant(Tensor::Scalar<float>(filter))}, scaled_mask));
    nodes.push_back(Lowered(
        node, "Reshape", "/mask_shape",
        {scaled_mask, ints(raw2 ? std::vector<int64_t>{batch, 1, 1, seq} : std::vector<int64_t>{batch, 1, seq, seq})},
        shaped));
    add(shaped, "/mask");
  }
  if (node.GetInt("unidirectional", 0) != 0) {
    if (seq > 8192)  // the mask is a constant of seq x seq floats, made here
      fail("unidirectional attention over " + std::to_string(seq) + " tokens is not supported (at most 8192)");
    Tensor causal(DType::kF32, {seq, seq});
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < seq; ++j) causal.data<float>()[i * seq + j] = j > i ? filter : 0.f;
    add(st.AddConstant(std::move(causal)), "/causal");
  }
  if (const int extra = Input(node, 5); extra >= 0) add(extra, "/attention_bias");
  const int probs = temp(), context = temp(), merged = temp();
  Node softmax = Lowered(node, "Softmax", "/softmax", {scores}, probs);
  softmax.attrs["axis"] = Attribute::Int(-1);
  nodes.push_back(std::move(softmax));
  nodes.push_back(Lowered(node, "MatMul", "/context", {probs, v}, context));
  Node t = Lowered(node, "Transpose", "/merge", {context}, merged);
  t.attrs["perm"] = Attribute::Ints({0, 2, 1, 3});
  nodes.push_back(std::move(t));
  nodes.push_back(Lowered(node, "Reshape", "", {merged, ints({batch, seq, sizes[2]})}, node.outputs[0]));
  return nodes;
}

}  // namespace

bool IsLoweredContribOp(const Node& node) {
  return node.domain == kMicrosoftDomain &&
         (node.op_type == "Gelu" || node.op_type == "FastGelu" || node.op_type == "BiasGelu" ||
          node.op_type == "QuickGelu" || node.op_type == "SkipLayerNormalization" || node.op_type == "Attention");
}

std::vector<Node> LowerContribOp(CompileState& st, const Node& node) {
  const std::string& op = node.op_type;
  const int out = node.outputs.empty() ? -1 : node.outputs[0];
  if (out < 0) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": output 0 is required");
  if (op == "Attention") return LowerAttention(st, node);
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
