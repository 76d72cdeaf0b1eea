#include "runtime/inline_if.h"

#include <string>
#include <unordered_map>

#include "ops/control_flow.h"

namespace osprey {

bool ConditionValue(const Node& node, const Tensor& cond, const std::string& what) {
  if (cond.numel() != 1)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what + " must hold one value, got shape " +
                                                 ShapeToString(cond.shape()));
  switch (cond.dtype()) {
    case DType::kBool:
      return cond.data<bool>()[0];
    case DType::kF32:
      return cond.data<float>()[0] != 0.f;
    case DType::kI32:
      return cond.data<int32_t>()[0] != 0;
    case DType::kI64:
      return cond.data<int64_t>()[0] != 0;
    case DType::kI8:
      return cond.data<int8_t>()[0] != 0;
    case DType::kU8:
      return cond.data<uint8_t>()[0] != 0;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": " + what + " must be bool, got " + DTypeName(cond.dtype()));
  }
}

bool KnownCondition(const Node& node, const CompileValue& cond, const std::string& what) {
  if (!cond.typed) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what + " has no value");
  if (!cond.known) throw Error(ErrorCode::kInternal, node.Describe() + ": " + what + " is not known");
  return ConditionValue(node, cond.value, what);
}

bool IfConditionKnown(const CompileState& st, const Node& node) {
  if (node.inputs.empty() || node.inputs[0] < 0) return true;
  const CompileValue& cond = st.values[node.inputs[0]];
  return !cond.typed || cond.known;
}

std::vector<Node> CopySubgraph(CompileState& st, const Graph& graph, const std::vector<int>& input_ids,
                               const std::vector<int>& output_ids, const std::string& prefix,
                               std::vector<int>* outputs) {
  // Subgraph value id -> id in `st`. Inputs first, then constants, then node outputs (new values).
  std::unordered_map<int, int> id_of;
  for (size_t k = 0; k < graph.inputs.size() && k < input_ids.size(); ++k) id_of[graph.inputs[k]] = input_ids[k];
  for (const auto& [id, t] : graph.constants) id_of[id] = st.AddConstant(t);
  // An output computed by a subgraph node is written straight into output_ids[j] (each once) where that is given.
  std::unordered_map<int, int> produced;
  for (const Node& n : graph.nodes)
    for (int v : n.outputs) produced[v] = 1;
  for (size_t j = 0; j < graph.outputs.size() && j < output_ids.size(); ++j) {
    const int v = graph.outputs[j];
    if (output_ids[j] >= 0 && produced.count(v) && !id_of.count(v)) id_of[v] = output_ids[j];
  }
  auto map_value = [&](int v) {
    if (v < 0) return -1;
    auto it = id_of.find(v);
    if (it != id_of.end()) return it->second;
    st.values.emplace_back();
    st.is_graph_output.push_back(0);
    const int id = static_cast<int>(st.values.size()) - 1;
    id_of[v] = id;
    return id;
  };
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size());
  for (const Node& n : graph.nodes) {
    Node copy = n;
    copy.name = prefix + n.name;
    for (int& v : copy.inputs) v = map_value(v);
    for (int& v : copy.outputs) v = map_value(v);
    nodes.push_back(std::move(copy));
  }
  outputs->clear();
  for (int v : graph.outputs) outputs->push_back(map_value(v));
  return nodes;
}

void CheckDeclaredOutputTypes(const CompileState& st, const Graph& graph, const std::vector<int>& ids,
                              const std::string& where) {
  for (size_t i = 0; i < graph.outputs.size() && i < graph.output_infos.size() && i < ids.size(); ++i) {
    const ValueInfo& declared = graph.output_infos[i];
    if (ids[i] < 0) continue;
    const CompileValue& computed = st.values[ids[i]];
    if (declared.has_dtype && computed.typed) CheckDeclaredType(declared, computed.dtype, where);
  }
}

int64_t CountNodesDeep(const Graph& graph) {
  int64_t n = static_cast<int64_t>(graph.nodes.size());
  for (const Node& node : graph.nodes)
    for (const auto& [name, attr] : node.attrs)
      if (attr.kind == Attribute::Kind::kGraph && attr.g) n += CountNodesDeep(*attr.g);
  return n;
}

void CheckDeclaredType(const ValueInfo& declared, DType computed, const std::string& where) {
  if (declared.has_dtype && computed != declared.dtype)
    throw Error(ErrorCode::kInvalidArgument, where + " output '" + declared.name + "' is declared " +
                                                 DTypeName(declared.dtype) + " but the graph computes " +
                                                 DTypeName(computed) +
                                                 " (fix the output's type in the model; ONNX Runtime refuses it too)");
}

std::vector<Node> InlineIfBranch(CompileState& st, const Node& node, const Graph** taken_branch) {
  CheckIfNode(node);
  if (node.inputs.empty() || node.inputs[0] < 0)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input 0 (the condition) is required");
  const CompileValue& cond = st.values[node.inputs[0]];
  const bool taken = KnownCondition(node, cond, "the condition");
  const char* branch_name = taken ? "then_branch" : "else_branch";
  const Graph& branch = *node.attrs.at(branch_name).g;
  if (taken_branch) *taken_branch = &branch;
  for (size_t i = 1; i < node.inputs.size(); ++i)
    if (node.inputs[i] < 0 || !st.values[node.inputs[i]].typed)
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": outer value " + std::to_string(i) + " read by the branches has no value");

  std::vector<int> outputs;
  const std::string prefix = node.name + "/" + branch_name + "/";
  std::vector<int> inputs(node.inputs.begin() + 1, node.inputs.end());
  std::vector<Node> nodes = CopySubgraph(st, branch, inputs, node.outputs, prefix, &outputs);
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (outputs[j] == node.outputs[j]) continue;
    Node identity;
    identity.op_type = "Identity";
    identity.name = prefix + "output_" + std::to_string(j);
    identity.inputs = {outputs[j]};
    identity.outputs = {node.outputs[j]};
    nodes.push_back(std::move(identity));
  }
  return nodes;
}

}  // namespace osprey
