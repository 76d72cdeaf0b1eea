#include "runtime/inline_loop.h"

#include <algorithm>
#include <string>
#include <vector>

#include "ops/control_flow.h"
#include "runtime/inline_if.h"

namespace osprey {

namespace {

// Stacks the per-iteration values `items` of scan output `k` along a new axis `axis` (negative: from the end of the
// result's rank) into `out`, in reverse order when `reverse`: a Reshape inserting the 1 per item, then one Concat.
void Stack(CompileState& st, const Node& node, size_t k, std::vector<int> items, int64_t axis, bool reverse, int out,
           const std::function<void(const Node&)>& fold) {
  if (items.empty())
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": runs no iteration, so its scan output " +
                                             std::to_string(k) + " has no element shape (not supported)");
  if (reverse) std::reverse(items.begin(), items.end());
  const Shape first = st.values[items[0]].shape;
  const int64_t rank = static_cast<int64_t>(first.size()) + 1;
  const int64_t at = axis < 0 ? axis + rank : axis;
  if (at < 0 || at >= rank)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": scan output axis " + std::to_string(axis) +
                                                 " is outside rank " + std::to_string(rank));
  const std::string prefix = node.name + "/scan_" + std::to_string(k) + "/";
  std::vector<int> parts;
  for (size_t i = 0; i < items.size(); ++i) {
    const Shape item_shape = st.values[items[i]].shape;  // (copies: AddConstant may move st.values)
    const DType item_dtype = st.values[items[i]].dtype;
    if (item_shape != first)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": scan output " + std::to_string(k) +
                                                   " changes shape between iterations (" + ShapeToString(first) +
                                                   ", then " + ShapeToString(item_shape) + ")");
    std::vector<int64_t> dims(item_shape.begin(), item_shape.end());
    dims.insert(dims.begin() + at, 1);
    const int shape = st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims));
    const int part = items.size() == 1 ? out : st.AddValue(item_dtype, {});
    fold(MakeNode("Reshape", prefix + "item_" + std::to_string(i), {items[i], shape}, {part}));
    parts.push_back(part);
  }
  if (parts.size() > 1) {
    Node concat = MakeNode("Concat", prefix + "stack", parts, {out});
    concat.attrs["axis"] = Attribute::Int(at);
    fold(concat);
  }
}

}  // namespace

void InlineLoop(CompileState& st, const Node& node, const std::function<void(const Node&)>& fold) {
  CheckLoopNode(node);
  const Graph& body = *node.attrs.at("body").g;
  const size_t carried = static_cast<size_t>(node.attrs.at(kLoopCarriedAttr).i);
  const size_t scans = node.outputs.size() - carried;
  for (size_t i = 2; i < node.inputs.size(); ++i)
    if (node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input " + std::to_string(i) + " has no value");

  // Trip count M (absent: bounded by the condition alone).
  bool bounded = false;
  int64_t trips = 0;
  if (node.inputs[0] >= 0) {
    const CompileValue& m = st.values[node.inputs[0]];
    if (!m.typed) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the trip count has no value");
    if (!m.known)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": input 0 must be known when the model is compiled "
                                                             "(osprey unrolls Loop then; its trip count must not "
                                                             "depend on input data)");
    if (m.value.numel() != 1 || m.value.dtype() != DType::kI64)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the trip count must be one int64");
    bounded = true;
    trips = m.value.data<int64_t>()[0];
  }
  bool cond = true;
  int cond_id = -1;
  if (node.inputs[1] >= 0) {
    const CompileValue& c = st.values[node.inputs[1]];
    if (c.typed && !c.known)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": input 1 must be known when the model is compiled "
                                                             "(osprey unrolls Loop then; its condition must not "
                                                             "depend on input data)");
    cond = KnownCondition(node, c, "the condition");
    cond_id = node.inputs[1];
  }
  if (!bounded && node.inputs[1] < 0)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": neither a trip count nor a condition: the loop "
                                                               "would never end");

  std::vector<int> values(node.inputs.begin() + 2, node.inputs.begin() + 2 + static_cast<long>(carried));
  const std::vector<int> captured(node.inputs.begin() + 2 + static_cast<long>(carried), node.inputs.end());
  std::vector<std::vector<int>> stacked(scans);
  for (int64_t i = 0; (!bounded || i < trips) && cond; ++i) {
    if (i >= kMaxLoopIterations || st.subgraph_nodes + static_cast<int64_t>(body.nodes.size()) > kMaxLoopNodes)
      throw Error(ErrorCode::kUnsupported,
                  node.Describe() + ": runs more than " + std::to_string(i) + " iterations (" +
                      std::to_string(st.subgraph_nodes) + " nodes unrolled in the model); osprey unrolls Loop when the "
                      "model is compiled, up to " + std::to_string(kMaxLoopIterations) + " iterations per loop and " +
                      std::to_string(kMaxLoopNodes) + " nodes in all");
    std::vector<int> inputs{st.AddConstant(Tensor::Scalar<int64_t>(i)),
                            cond_id >= 0 ? cond_id : st.AddConstant(Tensor::Scalar<bool>(true))};
    inputs.insert(inputs.end(), values.begin(), values.end());
    inputs.insert(inputs.end(), captured.begin(), captured.end());
    std::vector<int> outputs;
    const std::vector<Node> nodes = CopySubgraph(st, body, inputs, std::vector<int>(body.outputs.size(), -1),
                                                 node.name + "/iteration_" + std::to_string(i) + "/", &outputs);
    st.subgraph_nodes += static_cast<int64_t>(nodes.size());
    for (const Node& n : nodes) fold(n);
    CheckDeclaredOutputTypes(st, body, outputs, node.Describe() + ": body");
    const CompileValue& c = st.values[outputs[0]];
    if (c.typed && !c.known)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": osprey unrolls Loop when the model is compiled, so "
                                                             "the condition its body computes must not depend on "
                                                             "input data");
    cond = KnownCondition(node, c, "the body's condition output");
    cond_id = outputs[0];
    values.assign(outputs.begin() + 1, outputs.begin() + 1 + static_cast<long>(carried));
    for (size_t k = 0; k < scans; ++k) stacked[k].push_back(outputs[1 + carried + k]);
  }

  for (size_t j = 0; j < carried; ++j)
    fold(MakeNode("Identity", node.name + "/final_" + std::to_string(j), {values[j]}, {node.outputs[j]}));
  for (size_t k = 0; k < scans; ++k)
    Stack(st, node, k, stacked[k], 0, false, node.outputs[carried + k], fold);
}

void InlineScan(CompileState& st, const Node& node, const std::function<void(const Node&)>& fold) {
  CheckScanNode(node);
  const Graph& body = *node.attrs.at("body").g;
  const size_t states = static_cast<size_t>(node.attrs.at(kLoopCarriedAttr).i);
  const size_t m = static_cast<size_t>(node.GetInt("num_scan_inputs", 0));
  const size_t scans = node.outputs.size() - states;
  const std::vector<int64_t> in_axes = node.GetInts("scan_input_axes", std::vector<int64_t>(m, 0));
  const std::vector<int64_t> in_dirs = node.GetInts("scan_input_directions", std::vector<int64_t>(m, 0));
  const std::vector<int64_t> out_axes = node.GetInts("scan_output_axes", std::vector<int64_t>(scans, 0));
  const std::vector<int64_t> out_dirs = node.GetInts("scan_output_directions", std::vector<int64_t>(scans, 0));
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input " + std::to_string(i) + " has no value");

  // The sequence length: the scan inputs' dim along their axis, the same for all.
  int64_t length = -1;
  std::vector<int64_t> axes(m);
  for (size_t j = 0; j < m; ++j) {
    const Shape& shape = st.values[node.inputs[states + j]].shape;
    const int64_t rank = static_cast<int64_t>(shape.size());
    axes[j] = in_axes[j] < 0 ? in_axes[j] + rank : in_axes[j];
    if (axes[j] < 0 || axes[j] >= rank)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": scan_input_axes[" + std::to_string(j) + "] = " +
                                                   std::to_string(in_axes[j]) + " is outside the rank-" +
                                                   std::to_string(rank) + " scan input");
    if (length >= 0 && shape[axes[j]] != length)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": scan inputs of different lengths (" +
                                                   std::to_string(length) + " and " + std::to_string(shape[axes[j]]) +
                                                   ")");
    length = shape[axes[j]];
  }

  std::vector<int> values(node.inputs.begin(), node.inputs.begin() + static_cast<long>(states));
  const std::vector<int> captured(node.inputs.begin() + static_cast<long>(states + m), node.inputs.end());
  std::vector<std::vector<int>> stacked(scans);
  for (int64_t t = 0; t < length; ++t) {
    if (t >= kMaxLoopIterations || st.subgraph_nodes + static_cast<int64_t>(body.nodes.size() + m) > kMaxLoopNodes)
      throw Error(ErrorCode::kUnsupported,
                  node.Describe() + ": runs " + std::to_string(length) + " iterations (" +
                      std::to_string(st.subgraph_nodes) + " nodes unrolled in the model so far); osprey unrolls Scan " +
                      "when the model is compiled, up to " + std::to_string(kMaxLoopIterations) +
                      " iterations per loop and " + std::to_string(kMaxLoopNodes) + " nodes in all");
    const std::string prefix = node.name + "/iteration_" + std::to_string(t) + "/";
    std::vector<int> inputs = values;
    for (size_t j = 0; j < m; ++j) {  // element t (or length-1-t in reverse) of scan input j: Gather drops the axis
      const int index = st.AddConstant(Tensor::Scalar<int64_t>(in_dirs[j] ? length - 1 - t : t));
      Node gather = MakeNode("Gather", prefix + "element_" + std::to_string(j), {node.inputs[states + j], index},
                             {st.AddValue(st.values[node.inputs[states + j]].dtype, {})});
      gather.attrs["axis"] = Attribute::Int(axes[j]);
      fold(gather);
      inputs.push_back(gather.outputs[0]);
    }
    inputs.insert(inputs.end(), captured.begin(), captured.end());
    std::vector<int> outputs;
    const std::vector<Node> nodes =
        CopySubgraph(st, body, inputs, std::vector<int>(body.outputs.size(), -1), prefix, &outputs);
    st.subgraph_nodes += static_cast<int64_t>(nodes.size() + m);
    for (const Node& n : nodes) fold(n);
    CheckDeclaredOutputTypes(st, body, outputs, node.Describe() + ": body");
    values.assign(outputs.begin(), outputs.begin() + static_cast<long>(states));
    for (size_t k = 0; k < scans; ++k) stacked[k].push_back(outputs[states + k]);
  }
  for (size_t j = 0; j < states; ++j)
    fold(MakeNode("Identity", node.name + "/final_" + std::to_string(j), {values[j]}, {node.outputs[j]}));
  for (size_t k = 0; k < scans; ++k)
    Stack(st, node, k, stacked[k], out_axes[k], out_dirs[k] != 0, node.outputs[states + k], fold);
}

}  // namespace osprey
