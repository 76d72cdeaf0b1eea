// Spatial layers of rank 3 and 5 as rank-4 ones (LiftToRank4, docs/architecture.md, compile pipeline).
//
// One-dimensional: PyTorch exports a Conv1d, MaxPool1d or BatchNorm1d as a rank-3 node on [N, C, W]; the layout pass
// keeps rank-3 values plain, so these ran on oneDNN's plain 1-D kernels (a MaxPool1d on its reference kernel: 2.3 ms
// where the whole network took ORT 4.8) and never reached the channels-last kernels (osprey's depthwise and
// first-layer convolutions, oneDNN's nhwc ones). Viewed as [N, C, 1, W] (the same bytes), a Conv with window k becomes
// a Conv with window 1 x k (weight [M, C/g, 1, k], pads [0, b, 0, e], strides, dilations and kernel_shape with a
// leading 1), a pool likewise, and the layout pass then keeps the network channels-last.
//
// Three-dimensional with a unit depth: a Conv3d with a 1 x kh x kw window over a one-frame video [N, C, 1, H, W] (as
// RivaGAN's watermark networks are written) is a 2-D Conv on [N, C, H, W], the same bytes; oneDNN ran its first such
// layer (3 input channels, 11 x 11) on its GEMM fallback, 8x slower than ORT. Viewed as rank 4, the depth axis dropped
// (weight [M, C/g, 1, kh, kw] -> [M, C/g, kh, kw], the first of kernel_shape, strides and dilations and the depth
// pads removed), it takes the 2-D kernels.
//
// Elementwise ops between such nodes (layout_transparent traits: ReLU, a residual Add, a per-channel scale) are viewed
// with them, their operands viewed the same way (right-aligned to the node's rank, then a unit axis inserted at or
// removed from axis 2), so that values pass from layer to layer as rank 4; a Reshape back is written only where
// something else reads a value (and for graph outputs).
#include <map>

#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

// What a lifted node's values are viewed from: [N, C, W] (rank 3) or [N, C, 1, H, W] (rank 5, unit depth).
enum class Lift : char { kNo, kRank3, kUnitDepth };

int RankOf(Lift k) { return k == Lift::kRank3 ? 3 : 5; }

// A shape of rank <= RankOf(k) right-aligned to it, then viewed as rank 4: a unit axis inserted before the last
// ([N, C, W] -> [N, C, 1, W]) or the unit depth removed ([N, C, 1, H, W] -> [N, C, H, W]).
Shape Lifted(const Shape& s, Lift k) {
  Shape r(RankOf(k) - s.size(), 1);
  r.insert(r.end(), s.begin(), s.end());
  if (k == Lift::kRank3)
    r.insert(r.begin() + 2, 1);
  else
    r.erase(r.begin() + 2);
  return r;
}

// The kind of view a float value of concrete shape allows (rank 5 only with a unit depth).
Lift ViewOf(const CompileState& st, int v) {
  if (v < 0 || !st.values[v].typed || st.values[v].dtype != DType::kF32 || !ConcreteShape(st.values[v].shape))
    return Lift::kNo;
  const Shape& s = st.values[v].shape;
  if (s.size() == 3) return Lift::kRank3;
  if (s.size() == 5 && s[2] == 1) return Lift::kUnitDepth;
  return Lift::kNo;
}

// A window attribute's depth entries are 1 (kernel_shape) or its depth pads 0; absent attributes count as such.
bool UnitDepthWindow(const Node& n) {
  if (n.Has("kernel_shape") && n.GetInts("kernel_shape").size() == 3 && n.GetInts("kernel_shape")[0] != 1) return false;
  if (n.Has("pads")) {
    const std::vector<int64_t> p = n.GetInts("pads");
    if (p.size() != 6 || p[0] != 0 || p[3] != 0) return false;
  }
  return true;
}

// Convolutions, pools and batch normalisations of rank 3, or of rank 5 over a unit depth with a unit depth window,
// with their window attributes; fused parts that are not defined there (an int8 convolution) keep a node as it is.
Lift LiftableSpatial(const CompileState& st, const Node& n) {
  if (!n.domain.empty() || n.inputs.empty() || n.outputs.empty() || n.outputs[0] < 0) return Lift::kNo;
  const bool conv = n.op_type == "Conv", pool = n.op_type == "MaxPool" || n.op_type == "AveragePool";
  if (!conv && !pool && n.op_type != "BatchNormalization") return Lift::kNo;
  if (n.outputs.size() != 1 || n.Has("_int8")) return Lift::kNo;
  const Lift k = ViewOf(st, n.inputs[0]);
  if (k == Lift::kNo || ViewOf(st, n.outputs[0]) != k) return Lift::kNo;
  if (k == Lift::kUnitDepth && !UnitDepthWindow(n)) return Lift::kNo;
  if (conv) {
    if (n.inputs.size() < 2 || n.inputs[1] < 0) return Lift::kNo;
    const Shape& ws = st.values[n.inputs[1]].shape;
    if (ws.size() != static_cast<size_t>(RankOf(k)) || (k == Lift::kUnitDepth && ws[2] != 1)) return Lift::kNo;
    if (n.inputs.size() > 3 && n.inputs[3] >= 0 && ViewOf(st, n.inputs[3]) != k) return Lift::kNo;  // _residual
  }
  return k;
}

// Elementwise nodes whose output allows a view and whose operands can all be viewed the same way (scalar parameters
// stay).
Lift LiftableElementwise(const CompileState& st, const Node& n) {
  if (!n.domain.empty() || n.inputs.empty() || n.outputs.size() != 1) return Lift::kNo;
  const Lift k = ViewOf(st, n.outputs[0]);
  if (k == Lift::kNo) return Lift::kNo;
  const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
  if (traits.layout_transparent) return ViewOf(st, n.inputs[0]) == k ? k : Lift::kNo;
  if (!traits.layout_transparent_broadcast) return Lift::kNo;
  for (int v : n.inputs) {
    if (v < 0) continue;
    const Shape& s = st.values[v].shape;
    if (s.size() > static_cast<size_t>(RankOf(k)) || !ConcreteShape(s)) return Lift::kNo;
    // The depth removed must be a unit axis of every operand too (broadcasting to a unit output axis makes it one).
    if (k == Lift::kUnitDepth && s.size() >= 3 && s[s.size() - 3] != 1) return Lift::kNo;
  }
  return k;
}

void LiftWindowAttributes(Node& n, Lift k) {
  for (const char* name : {"kernel_shape", "strides", "dilations"})
    if (n.Has(name)) {
      std::vector<int64_t> v = n.GetInts(name);
      if (k == Lift::kRank3)
        v.insert(v.begin(), 1);
      else
        v.erase(v.begin());
      n.attrs[name] = Attribute::Ints(std::move(v));
    }
  if (n.Has("pads")) {
    const std::vector<int64_t> p = n.GetInts("pads");
    if (k == Lift::kRank3 && p.size() == 2) n.attrs["pads"] = Attribute::Ints({0, p[0], 0, p[1]});
    if (k == Lift::kUnitDepth && p.size() == 6) n.attrs["pads"] = Attribute::Ints({p[1], p[2], p[4], p[5]});
  }
}

}  // namespace

void LiftToRank4(CompileState& st, bool rank3, bool unit_depth) {
  const size_t num_nodes = st.nodes.size();
  std::vector<Lift> lift(num_nodes, Lift::kNo);
  std::vector<char> spatial(num_nodes, 0);
  std::vector<Lift> lifted_value(st.values.size(), Lift::kNo);  // written by a lifted node, and how
  const auto wanted = [&](Lift k) { return (k == Lift::kRank3 && rank3) || (k == Lift::kUnitDepth && unit_depth); };
  bool any_spatial = false;
  for (size_t i = 0; i < num_nodes; ++i) {
    const Node& n = st.nodes[i];
    if (const Lift k = LiftableSpatial(st, n); wanted(k)) {
      lift[i] = k;
      spatial[i] = any_spatial = true;
    } else if (const Lift e = LiftableElementwise(st, n); wanted(e)) {
      // Only next to lifted layers, and only where every lifted operand was viewed the same way.
      const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
      bool next_to = false, mixed = false;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const int v = n.inputs[k];
        if (v < 0 || lifted_value[v] == Lift::kNo) continue;
        mixed = mixed || lifted_value[v] != e;
        next_to = next_to || k < (traits.layout_transparent ? 1u : n.inputs.size());
      }
      if (next_to && !mixed) lift[i] = e;
    }
    if (lift[i] != Lift::kNo) lifted_value[n.outputs[0]] = lift[i];
  }
  if (!any_spatial) return;
  // Lifted nodes joined by the values they pass form regions; a region pays a reorder to channels-last at each plain
  // value it reads and one back at each it writes. Rank-3 regions of fewer than three convolutions and pools stay 1-D
  // (a depthwise + pointwise pair between plain graph input and output ran 2.2x slower lifted); unit-depth 3-D layers
  // always go (oneDNN's 3-D kernels reorder to channels-last themselves, and lack the 2-D ones' first-layer kernels).
  std::vector<int> region(num_nodes);
  for (size_t i = 0; i < num_nodes; ++i) region[i] = static_cast<int>(i);
  const auto find = [&](int i) {
    while (region[i] != i) i = region[i] = region[region[i]];
    return i;
  };
  std::vector<int> writer(st.values.size(), -1);
  for (size_t i = 0; i < num_nodes; ++i) {
    if (lift[i] == Lift::kNo) continue;
    for (int v : st.nodes[i].inputs)
      if (v >= 0 && writer[v] >= 0) region[find(writer[v])] = find(static_cast<int>(i));
    writer[st.nodes[i].outputs[0]] = static_cast<int>(i);
  }
  std::vector<int> layers(num_nodes, 0);
  for (size_t i = 0; i < num_nodes; ++i)
    if (spatial[i]) ++layers[find(static_cast<int>(i))];
  bool any = false;
  for (size_t i = 0; i < num_nodes; ++i) {
    const int min_layers = lift[i] == Lift::kRank3 ? 3 : 1;
    if (lift[i] != Lift::kNo && layers[find(static_cast<int>(i))] < min_layers) lift[i] = Lift::kNo;
    any = any || lift[i] != Lift::kNo;
  }
  if (!any) return;

  // Values read as written after the rewrite: graph outputs and the inputs of nodes that stay.
  std::vector<char> read_as_is(st.values.size(), 0);
  for (size_t i = 0; i < num_nodes; ++i)
    if (lift[i] == Lift::kNo)
      for (int v : st.nodes[i].inputs)
        if (v >= 0) read_as_is[v] = 1;
  for (size_t v = 0; v < st.is_graph_output.size(); ++v) read_as_is[v] |= st.is_graph_output[v];

  std::map<std::pair<int, Lift>, int> as_4d;  // value and view -> the viewed value
  std::vector<Node> nodes;
  nodes.reserve(num_nodes + 8);
  const auto reshape_to = [&](int from, const Shape& shape, int to, const std::string& name) {
    const int s = st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(shape.size())}, shape));
    nodes.push_back(MakeNode("Reshape", name, {from, s}, {to}));
  };
  // The rank-4 view of operand v: the lifted value, a constant re-shaped, or a Reshape written before.
  const auto view = [&](int v, Lift k, const std::string& name) {
    if (auto it = as_4d.find({v, k}); it != as_4d.end()) return it->second;
    const Shape shape = Lifted(st.values[v].shape, k);
    int w;
    if (st.values[v].known) {
      w = st.AddStoredConstant(st.values[v].value.Reshaped(shape));
    } else {
      w = st.AddValue(st.values[v].dtype, shape);
      reshape_to(v, shape, w, name + "/as_2d");
    }
    as_4d[{v, k}] = w;
    return w;
  };
  for (size_t i = 0; i < num_nodes; ++i) {
    const Lift k = lift[i];
    if (k == Lift::kNo) {
      nodes.push_back(std::move(st.nodes[i]));
      continue;
    }
    Node n = std::move(st.nodes[i]);
    const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
    if (spatial[i]) {
      n.inputs[0] = view(n.inputs[0], k, n.name);
      if (n.op_type == "Conv") {
        const Shape w4 = Lifted(st.values[n.inputs[1]].shape, k);
        if (st.values[n.inputs[1]].known) {
          n.inputs[1] = st.AddStoredConstant(st.values[n.inputs[1]].value.Reshaped(w4));
        } else {
          const int w_view = st.AddValue(DType::kF32, w4);
          reshape_to(n.inputs[1], w4, w_view, n.name + "/weight_as_2d");
          n.inputs[1] = w_view;
        }
        if (n.inputs.size() > 3 && n.inputs[3] >= 0) n.inputs[3] = view(n.inputs[3], k, n.name + "/residual");
      }
      LiftWindowAttributes(n, k);
    } else {
      for (size_t j = 0; j < (traits.layout_transparent ? 1 : n.inputs.size()); ++j) {
        const int v = n.inputs[j];
        if (v >= 0 && !(st.values[v].shape.empty() && st.values[v].known)) n.inputs[j] = view(v, k, n.name);
      }
    }
    const int y = n.outputs[0];
    const int y4 = st.AddValue(DType::kF32, Lifted(st.values[y].shape, k));
    n.outputs[0] = y4;
    as_4d[{y, k}] = y4;
    const std::string name = n.name;
    nodes.push_back(std::move(n));
    if (read_as_is[y]) reshape_to(y4, st.values[y].shape, y, name + (k == Lift::kRank3 ? "/as_1d" : "/as_3d"));
  }
  st.nodes = std::move(nodes);
}

}  // namespace osprey
