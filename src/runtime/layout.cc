// Channels-last layout assignment. oneDNN's fastest convolutions on this CPU read and write NHWC; reordering around
// every convolution costs as much as a depthwise convolution itself. So rank-4 float32 activations stay NHWC from
// one layout-capable kernel (conv, pool, batchnorm) to the next, and rank-5 ones NDHWC (3-D convolutions of video
// and volume networks; `OSPREY_NDHWC=0` keeps those plain). Elementwise ops between them are "transparent" (their
// schemas have OpTraits::layout_transparent or layout_transparent_broadcast): they run their reference kernel on
// physical shapes ([N, H, W, C]), which is exact because elementwise maths does not care about memory order as long
// as every operand is viewed the same way. Data-movement nodes along the channel axis (Concat on axis 1, channel
// Slice/Split, _ChannelShuffle) "follow": when all their tensor inputs are channels-last, so are their outputs, and
// their fast kernel (kernels/cpu/channel_kernels.cc) copies channel runs pixel by pixel. A reorder is inserted only
// where channels-last data meets a node that needs plain data.
#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {

int CompileState::AddValue(DType dtype, Shape shape) {
  CompileValue v;
  v.typed = true;
  v.dtype = dtype;
  v.shape = std::move(shape);
  values.push_back(std::move(v));
  is_graph_output.push_back(0);
  if (!layouts.empty()) layouts.push_back(Layout::kPlain);
  return static_cast<int>(values.size()) - 1;
}

namespace {

// Rank 4, or 5 when `rank5`, with more than one pixel (no spatial extent 0, one above 1).
bool IsNhwcCandidate(const CompileValue& v, bool rank5) {
  if (v.dtype != DType::kF32 || !ChannelsLastRank(v.shape.size()) || (v.shape.size() == 5 && !rank5)) return false;
  const auto spatial_begin = v.shape.begin() + 2;
  return std::none_of(spatial_begin, v.shape.end(), [](int64_t d) { return d == 0; }) &&
         std::any_of(spatial_begin, v.shape.end(), [](int64_t d) { return d > 1; });
}

// A plain operand can join a channels-last elementwise op of rank `rank` when viewing it channels-last keeps its
// memory order: when, right-aligned to that rank, it has C == 1 or every spatial extent 1.
bool PlainOperandCompatible(const Shape& s, size_t rank) {
  if (s.size() > rank) return false;
  Shape r(rank - s.size(), 1);
  r.insert(r.end(), s.begin(), s.end());
  return r[1] == 1 || std::all_of(r.begin() + 2, r.end(), [](int64_t d) { return d == 1; });
}

// Tensor inputs of a following node: every input of Concat/_ChannelShuffle, input 0 of Slice/Split/Resize/Upsample
// (the rest are index, scale or size constants).
size_t NumDataInputs(const Node& n) {
  const bool first_only =
      n.op_type == "Slice" || n.op_type == "Split" || n.op_type == "Resize" || n.op_type == "Upsample" ||
      n.op_type == "Pad";
  return first_only ? std::min<size_t>(1, n.inputs.size()) : n.inputs.size();
}

// Whether the node's fast kernel copies channels-last data as is (CpuKernelFollowsNhwc), asked with the node's
// compile-time types, shapes and constant values.
bool FollowsNhwc(const CompileState& st, const Node& n) {
  if (n.outputs.empty() || n.inputs.empty()) return false;
  KernelBuildContext bc{n, st.opset};
  for (int v : n.inputs) {
    const bool present = v >= 0;
    bc.present.push_back(present);
    bc.input_dtypes.push_back(present ? st.values[v].dtype : DType::kF32);
    bc.input_shapes.push_back(present ? st.values[v].shape : Shape{});
    bc.input_values.push_back(present && st.values[v].known ? &st.values[v].value : nullptr);
  }
  for (int v : n.outputs) {
    if (v < 0) return false;
    bc.output_dtypes.push_back(st.values[v].dtype);
    bc.output_shapes.push_back(st.values[v].shape);
  }
  return CpuKernelFollowsNhwc(bc);
}

// Transpose perm of a rank-4 or rank-5 float32 node: 1 for channels to the end ((0, 2, 3, 1): NCHW -> NHWC, or
// (0, 2, 3, 4, 1)), 2 for channels from the end to axis 1 ((0, 3, 1, 2): NHWC -> NCHW, or (0, 4, 1, 2, 3)), else 0.
// tf2onnx writes such pairs around every convolution when its transpose optimiser gives up (MobileNetV3), and one at
// the input of every channels-last Keras model.
int ChannelTranspose(const CompileState& st, const Node& n) {
  if (n.op_type != "Transpose" || n.inputs.size() != 1 || n.outputs.size() != 1 || n.inputs[0] < 0) return 0;
  const CompileValue& x = st.values[n.inputs[0]];
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (x.dtype != DType::kF32 || !ChannelsLastRank(x.shape.size())) return 0;
  const std::vector<int64_t> perm = n.GetInts("perm", {});
  std::vector<int64_t> to_last{0}, from_last{0, rank - 1};
  for (int64_t i = 2; i < rank; ++i) to_last.push_back(i);
  to_last.push_back(1);
  for (int64_t i = 1; i < rank - 1; ++i) from_last.push_back(i);
  if (perm == to_last) return 1;
  if (perm == from_last) return 2;
  return 0;
}

}  // namespace

Shape ChannelsLastView(const Shape& s, size_t rank) {
  Shape r(rank - s.size(), 1);
  r.insert(r.end(), s.begin(), s.end());
  return ChannelsLastShape(r);
}

void AssignLayouts(CompileState& st, const std::function<bool(int)>& supports_nhwc, bool rank5) {
  const auto candidate = [rank5](const CompileValue& v) { return IsNhwcCandidate(v, rank5); };
  const size_t num_nodes = st.nodes.size();
  st.layouts.assign(st.values.size(), Layout::kPlain);
  std::vector<char> capable(num_nodes, 0), transparent(num_nodes, 0), follows(num_nodes, 0), copy(num_nodes, 0);
  for (size_t i = 0; i < num_nodes; ++i) capable[i] = supports_nhwc(static_cast<int>(i));

  // Forward: decide each node's output layout from its inputs.
  for (size_t i = 0; i < num_nodes; ++i) {
    const Node& n = st.nodes[i];
    if (n.outputs.empty()) continue;
    const int out = n.outputs[0];
    // [N, C, H, W] stored channels-last -> plain [N, H, W, C]: the same bytes, copied.
    if (out >= 0 && ChannelTranspose(st, n) == 1 && st.layouts[n.inputs[0]] == Layout::kNhwc) {
      copy[i] = 1;
      continue;
    }
    if (out < 0 || !candidate(st.values[out]) || st.is_graph_output[out]) continue;
    if (capable[i]) {
      st.layouts[out] = Layout::kNhwc;
      continue;
    }
    // Plain [N, H, W, C] -> [N, C, H, W] stored channels-last: the same bytes, copied.
    if (ChannelTranspose(st, n) == 2 && st.layouts[n.inputs[0]] == Layout::kPlain) {
      st.layouts[out] = Layout::kNhwc;
      copy[i] = 1;
      continue;
    }
    if (FollowsNhwc(st, n)) {
      bool all_nhwc = true;
      for (size_t k = 0; k < NumDataInputs(n); ++k) all_nhwc = all_nhwc && st.layouts[n.inputs[k]] == Layout::kNhwc;
      for (int v : n.outputs) all_nhwc = all_nhwc && candidate(st.values[v]) && !st.is_graph_output[v];
      if (all_nhwc) {
        for (int v : n.outputs) st.layouts[v] = Layout::kNhwc;
        follows[i] = 1;
      }
      continue;
    }
    const OpTraits& traits = OpRegistry::TraitsOf(n.op_type);
    const bool unary = traits.layout_transparent;
    const bool binary = traits.layout_transparent_broadcast;
    if (!(unary || binary) || n.outputs.size() != 1) continue;
    bool any_nhwc = false, ok = true;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      int v = n.inputs[k];
      if (v < 0) continue;
      if (unary && k > 0) {  // Clip min/max etc.: scalars
        ok = ok && NumElements(st.values[v].shape) == 1;
        continue;
      }
      if (st.layouts[v] == Layout::kNhwc) {
        // Any broadcasting between operands of the output's rank stays exact when all are viewed channels-last.
        any_nhwc = true;
        ok = ok && st.values[v].shape.size() == st.values[out].shape.size();
      } else {
        ok = ok && st.values[v].dtype == DType::kF32 &&
             PlainOperandCompatible(st.values[v].shape, st.values[out].shape.size());
      }
    }
    if (any_nhwc && ok) {
      st.layouts[out] = Layout::kNhwc;
      transparent[i] = 1;
    }
  }

  // A capable node whose channels-last output only feeds nodes that need plain data writes plain directly.
  auto consumer_takes_nhwc = [&](size_t c, size_t input_index) {
    return (capable[c] && (input_index == 0 || (input_index == 3 && st.nodes[c].op_type == "Conv"))) ||
           transparent[c] || (follows[c] && input_index < NumDataInputs(st.nodes[c])) ||
           (copy[c] && ChannelTranspose(st, st.nodes[c]) == 1);
  };
  std::vector<std::vector<std::pair<size_t, size_t>>> consumers(st.values.size());
  for (size_t c = 0; c < num_nodes; ++c)
    for (size_t k = 0; k < st.nodes[c].inputs.size(); ++k)
      if (st.nodes[c].inputs[k] >= 0) consumers[st.nodes[c].inputs[k]].push_back({c, k});
  for (size_t i = 0; i < num_nodes; ++i) {
    if (!capable[i] || st.nodes[i].outputs.empty()) continue;
    int out = st.nodes[i].outputs[0];
    if (st.layouts[out] != Layout::kNhwc || consumers[out].empty()) continue;
    bool any = false;
    for (auto [c, k] : consumers[out]) any = any || consumer_takes_nhwc(c, k);
    if (!any) st.layouts[out] = Layout::kPlain;
  }

  // Insert reorders where channels-last values meet nodes that need plain input.
  std::vector<Node> nodes;
  std::vector<char> node_transparent;
  std::vector<int> plain_copy(st.values.size(), -1);
  for (size_t i = 0; i < num_nodes; ++i) {
    Node& n = st.nodes[i];
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      int v = n.inputs[k];
      if (v < 0 || st.layouts[v] != Layout::kNhwc) continue;
      if (consumer_takes_nhwc(i, k)) continue;
      if (plain_copy[v] < 0) {
        int p = st.AddValue(st.values[v].dtype, st.values[v].shape);
        plain_copy.resize(st.values.size(), -1);
        Node r;
        r.op_type = kLayoutReorderOp;
        r.name = "reorder_to_plain:" + n.name;
        r.inputs = {v};
        r.outputs = {p};
        r.attrs["from"] = Attribute::Int(static_cast<int>(Layout::kNhwc));
        r.attrs["to"] = Attribute::Int(static_cast<int>(Layout::kPlain));
        nodes.push_back(std::move(r));
        node_transparent.push_back(0);
        plain_copy[v] = p;
      }
      n.inputs[k] = plain_copy[v];
    }
    nodes.push_back(std::move(n));
    node_transparent.push_back(copy[i] ? CompileState::kTransparentCopy : transparent[i]);
  }
  st.nodes = std::move(nodes);
  st.transparent = std::move(node_transparent);
}

}  // namespace osprey
