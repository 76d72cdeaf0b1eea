// One-dimensional layers as two-dimensional ones (LiftOneDimensional, docs/architecture.md, compile pipeline). PyTorch
// exports a Conv1d, MaxPool1d or BatchNorm1d as a rank-3 node on [N, C, W]; the layout pass keeps rank-3 values plain,
// so these ran on oneDNN's plain 1-D kernels (a MaxPool1d on its reference kernel: 2.3 ms where the whole network took
// ORT 4.8) and never reached the channels-last kernels (osprey's depthwise and first-layer convolutions, oneDNN's
// nhwc ones). Viewed as [N, C, 1, W] (the same bytes), a Conv with window k becomes a Conv with window 1 x k (weight
// [M, C/g, 1, k], pads [0, b, 0, e], strides, dilations and kernel_shape with a leading 1), a pool likewise, and the
// layout pass then keeps the network channels-last. Elementwise ops between such nodes (layout_transparent traits:
// ReLU, a residual Add, a per-channel scale) are lifted with them, their operands viewed the same way (right-aligned to
// rank 3, a unit axis inserted before the last), so that values pass from layer to layer as rank 4; a Reshape back to
// rank 3 is written only where something else reads a value (and for graph outputs).
#include <map>

#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

// A shape of rank <= 3 right-aligned to rank 3, with a unit axis inserted before the last: [N, C, W] -> [N, C, 1, W].
Shape Lifted(const Shape& s) {
  Shape r(3 - s.size(), 1);
  r.insert(r.end(), s.begin(), s.end());
  r.insert(r.begin() + 2, 1);
  return r;
}

bool IsF32Rank3(const CompileState& st, int v) {
  return v >= 0 && st.values[v].typed && st.values[v].dtype == DType::kF32 && st.values[v].shape.size() == 3 &&
         ConcreteShape(st.values[v].shape);
}

// Rank-3 convolutions, pools and batch normalisations with their window attributes; fused parts that are not defined
// on rank 3 (an int8 convolution) keep a node 1-D.
bool LiftableSpatial(const CompileState& st, const Node& n) {
  if (!n.domain.empty() || n.inputs.empty() || n.outputs.empty() || n.outputs[0] < 0) return false;
  const bool conv = n.op_type == "Conv", pool = n.op_type == "MaxPool" || n.op_type == "AveragePool";
  if (!conv && !pool && n.op_type != "BatchNormalization") return false;
  if (n.outputs.size() != 1 || n.Has("_int8") || !IsF32Rank3(st, n.inputs[0]) || !IsF32Rank3(st, n.outputs[0]))
    return false;
  if (conv) {
    if (n.inputs.size() < 2 || n.inputs[1] < 0 || st.values[n.inputs[1]].shape.size() != 3) return false;
    if (n.inputs.size() > 3 && n.inputs[3] >= 0 && !IsF32Rank3(st, n.inputs[3])) return false;  // _residual
  }
  return true;
}

// Elementwise nodes on rank-3 float values whose operands can all be viewed as Lifted (scalar parameters stay).
bool LiftableElementwise(const CompileState& st, const Node& n) {
  if (!n.domain.empty() || n.inputs.empty() || n.outputs.size() != 1 || !IsF32Rank3(st, n.outputs[0])) return false;
  const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
  if (traits.layout_transparent) return IsF32Rank3(st, n.inputs[0]);
  if (!traits.layout_transparent_broadcast) return false;
  for (int v : n.inputs)
    if (v >= 0 && (st.values[v].shape.size() > 3 || !ConcreteShape(st.values[v].shape))) return false;
  return true;
}

void LiftWindowAttributes(Node& n) {
  for (const char* name : {"kernel_shape", "strides", "dilations"})
    if (n.Has(name)) {
      std::vector<int64_t> v = n.GetInts(name);
      v.insert(v.begin(), 1);
      n.attrs[name] = Attribute::Ints(std::move(v));
    }
  if (n.Has("pads")) {
    const std::vector<int64_t> p = n.GetInts("pads");
    if (p.size() == 2) n.attrs["pads"] = Attribute::Ints({0, p[0], 0, p[1]});
  }
}

}  // namespace

void LiftOneDimensional(CompileState& st) {
  constexpr int kMinLayers = 3;
  const size_t num_nodes = st.nodes.size();
  std::vector<char> lift(num_nodes, 0);
  std::vector<char> lifted_value(st.values.size(), 0);  // written by a lifted node
  bool any_spatial = false;
  for (size_t i = 0; i < num_nodes; ++i) {
    const Node& n = st.nodes[i];
    if (LiftableSpatial(st, n)) {
      lift[i] = any_spatial = true;
    } else if (LiftableElementwise(st, n)) {
      const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
      for (size_t k = 0; k < (traits.layout_transparent ? 1 : n.inputs.size()); ++k)
        if (n.inputs[k] >= 0 && lifted_value[n.inputs[k]]) lift[i] = 1;  // only next to lifted layers
    }
    if (lift[i]) lifted_value[n.outputs[0]] = 1;
  }
  if (!any_spatial) return;
  // Lifted nodes joined by the values they pass form regions; a region pays a reorder to channels-last at each plain
  // value it reads and one back at each it writes. Regions of fewer than kMinLayers convolutions and pools stay 1-D
  // (a depthwise + pointwise pair between plain graph input and output ran 2.2x slower lifted).
  std::vector<int> region(num_nodes);
  for (size_t i = 0; i < num_nodes; ++i) region[i] = static_cast<int>(i);
  const auto find = [&](int i) {
    while (region[i] != i) i = region[i] = region[region[i]];
    return i;
  };
  std::vector<int> writer(st.values.size(), -1);
  for (size_t i = 0; i < num_nodes; ++i) {
    if (!lift[i]) continue;
    for (int v : st.nodes[i].inputs)
      if (v >= 0 && writer[v] >= 0) region[find(writer[v])] = find(static_cast<int>(i));
    writer[st.nodes[i].outputs[0]] = static_cast<int>(i);
  }
  std::vector<int> layers(num_nodes, 0);
  for (size_t i = 0; i < num_nodes; ++i)
    if (lift[i] && LiftableSpatial(st, st.nodes[i])) ++layers[find(static_cast<int>(i))];
  bool any = false;
  for (size_t i = 0; i < num_nodes; ++i) {
    if (lift[i] && layers[find(static_cast<int>(i))] < kMinLayers) lift[i] = 0;
    any = any || lift[i];
  }
  if (!any) return;

  // Values read as rank 3 after the rewrite: graph outputs and the inputs of nodes that stay.
  std::vector<char> read_as_3d(st.values.size(), 0);
  for (size_t i = 0; i < num_nodes; ++i)
    if (!lift[i])
      for (int v : st.nodes[i].inputs)
        if (v >= 0) read_as_3d[v] = 1;
  for (size_t v = 0; v < st.is_graph_output.size(); ++v) read_as_3d[v] |= st.is_graph_output[v];

  std::map<int, int> as_4d;  // rank-3 value -> its [N, C, 1, W] view
  std::vector<Node> nodes;
  nodes.reserve(num_nodes + 8);
  const auto reshape_to = [&](int from, const Shape& shape, int to, const std::string& name) {
    const int s = st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(shape.size())}, shape));
    nodes.push_back(MakeNode("Reshape", name, {from, s}, {to}));
  };
  // The rank-4 view of operand v (rank <= 3): the lifted value, a constant re-shaped, or a Reshape written before.
  const auto view = [&](int v, const std::string& name) {
    if (auto it = as_4d.find(v); it != as_4d.end()) return it->second;
    const Shape shape = Lifted(st.values[v].shape);
    int w;
    if (st.values[v].known) {
      w = st.AddStoredConstant(st.values[v].value.Reshaped(shape));
    } else {
      w = st.AddValue(st.values[v].dtype, shape);
      reshape_to(v, shape, w, name + "/as_2d");
    }
    as_4d[v] = w;
    return w;
  };
  for (size_t i = 0; i < num_nodes; ++i) {
    if (!lift[i]) {
      nodes.push_back(std::move(st.nodes[i]));
      continue;
    }
    Node n = std::move(st.nodes[i]);
    const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
    if (n.op_type == "Conv") {
      n.inputs[0] = view(n.inputs[0], n.name);
      const Tensor* w = st.values[n.inputs[1]].known ? &st.values[n.inputs[1]].value : nullptr;
      const Shape ws = st.values[n.inputs[1]].shape;
      const Shape w4 = {ws[0], ws[1], 1, ws[2]};
      if (w != nullptr) {
        n.inputs[1] = st.AddStoredConstant(w->Reshaped(w4));
      } else {
        const int w_view = st.AddValue(DType::kF32, w4);
        reshape_to(n.inputs[1], w4, w_view, n.name + "/weight_as_2d");
        n.inputs[1] = w_view;
      }
      if (n.inputs.size() > 3 && n.inputs[3] >= 0) n.inputs[3] = view(n.inputs[3], n.name + "/residual");
      LiftWindowAttributes(n);
    } else if (n.op_type == "MaxPool" || n.op_type == "AveragePool" || n.op_type == "BatchNormalization") {
      n.inputs[0] = view(n.inputs[0], n.name);
      LiftWindowAttributes(n);
    } else {
      for (size_t k = 0; k < (traits.layout_transparent ? 1 : n.inputs.size()); ++k) {
        const int v = n.inputs[k];
        if (v >= 0 && !(st.values[v].shape.empty() && st.values[v].known)) n.inputs[k] = view(v, n.name);
      }
    }
    const int y = n.outputs[0];
    const int y4 = st.AddValue(DType::kF32, Lifted(st.values[y].shape));
    n.outputs[0] = y4;
    as_4d[y] = y4;
    const std::string name = n.name;
    nodes.push_back(std::move(n));
    if (read_as_3d[y]) reshape_to(y4, st.values[y].shape, y, name + "/as_1d");
  }
  st.nodes = std::move(nodes);
}

}  // namespace osprey
