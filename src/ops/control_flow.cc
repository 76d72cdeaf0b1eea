// Schema of If, Loop and Scan. Osprey compiles a plan for concrete input shapes, so an If whose condition is known
// then (a constant, or computed from shapes, as exporters emit for "if batch == 1") is replaced by the nodes of the
// branch it takes (src/runtime/inline_if.cc); one whose condition depends on input data has both branches compiled as
// plans of their own, and the condition picks one at run time (src/runtime/runtime_if.cc).
//
// If(cond, captured_0, ..., captured_{k-1}) -> outputs, attributes then_branch / else_branch (graphs)
//   The importer lists the outer-scope values either branch reads as extra inputs after `cond`, in the same order
//   as each branch graph's inputs (so they are ordinary dependencies for sorting and liveness); ONNX's If has only
//   `cond`. Each branch graph has one output per If output.
//
// Loop(M, cond, v_initial_0..N-1, captured_0..C-1) -> (v_final_0..N-1, scan_0..K-1), attributes body (a graph) and
//   _carried = N (added by the importer). Unrolled when compiled (src/runtime/inline_loop.cc) when its trip count
//   and conditions are known then; the body's inputs are (iteration_num, cond, carried..., captured...), its outputs
//   (cond, carried..., scan...).
//
// Scan(states_0..N-1, scan_inputs_0..M-1, captured...) -> (final states, scan outputs 0..K-1), attributes body,
//   num_scan_inputs = M, scan_input_axes / scan_input_directions / scan_output_axes / scan_output_directions and
//   _carried = N (added by the importer). Unrolled when compiled (inline_loop.cc): the sequence length is a dim of the
//   scan inputs, so it is always known then.
#include "ops/control_flow.h"

#include <string>

#include "ops/op_registry.h"

namespace osprey {
namespace {

constexpr int kManyValues = 1 << 20;

}  // namespace

void CheckIfNode(const Node& node) {
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto it = node.attrs.find(branch);
    if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kGraph || !it->second.g)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": attribute '" + branch + "' (a graph) is required");
    const Graph& g = *it->second.g;
    if (g.outputs.size() != node.outputs.size())
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + branch + " has " +
                                                   std::to_string(g.outputs.size()) + " outputs, expected " +
                                                   std::to_string(node.outputs.size()) + " (one per If output)");
    if (g.inputs.size() + 1 != node.inputs.size())
      throw Error(ErrorCode::kInvalidArgument,
                  node.Describe() + ": " + branch + " reads " + std::to_string(g.inputs.size()) +
                      " outer values, but the node has " + std::to_string(node.inputs.size() - 1) +
                      " inputs after the condition");
  }
}

void CheckLoopNode(const Node& node) {
  auto body = node.attrs.find("body");
  if (body == node.attrs.end() || body->second.kind != Attribute::Kind::kGraph || !body->second.g)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": attribute 'body' (a graph) is required");
  auto carried = node.attrs.find(kLoopCarriedAttr);
  if (carried == node.attrs.end() || carried->second.kind != Attribute::Kind::kInt)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the importer's attribute '_carried' is missing");
  const Graph& g = *body->second.g;
  const int64_t n = carried->second.i;
  if (n < 0 || node.inputs.size() < static_cast<size_t>(2 + n) || static_cast<size_t>(n) > node.outputs.size())
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + std::to_string(node.inputs.size()) +
                                                 " inputs and " + std::to_string(node.outputs.size()) +
                                                 " outputs do not fit " + std::to_string(n) + " loop-carried values");
  if (g.inputs.size() != node.inputs.size())
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the body takes " + std::to_string(g.inputs.size()) +
                                                 " inputs (iteration number, condition, " + std::to_string(n) +
                                                 " carried values and the outer values it reads), the node gives " +
                                                 std::to_string(node.inputs.size()));
  if (g.outputs.size() != node.outputs.size() + 1)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the body has " + std::to_string(g.outputs.size()) +
                                                 " outputs, expected " + std::to_string(node.outputs.size() + 1) +
                                                 " (the condition, then one per Loop output)");
}

void CheckScanNode(const Node& node) {
  auto body = node.attrs.find("body");
  if (body == node.attrs.end() || body->second.kind != Attribute::Kind::kGraph || !body->second.g)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": attribute 'body' (a graph) is required");
  const Graph& g = *body->second.g;
  const int64_t m = node.GetInt("num_scan_inputs", 0), n = node.GetInt(kLoopCarriedAttr, -1);
  if (m < 1) throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": num_scan_inputs must be >= 1");
  if (n < 0 || node.inputs.size() < static_cast<size_t>(n + m) || static_cast<size_t>(n) > node.outputs.size())
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + std::to_string(node.inputs.size()) +
                                                 " inputs and " + std::to_string(node.outputs.size()) +
                                                 " outputs do not fit " + std::to_string(n) + " states and " +
                                                 std::to_string(m) + " scan inputs");
  if (g.inputs.size() != node.inputs.size() || g.outputs.size() != node.outputs.size())
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": the body has " + std::to_string(g.inputs.size()) +
                                                 " inputs and " + std::to_string(g.outputs.size()) +
                                                 " outputs, the node " + std::to_string(node.inputs.size()) + " and " +
                                                 std::to_string(node.outputs.size()));
  const size_t k = node.outputs.size() - static_cast<size_t>(n);
  for (const auto& [attr, count] : {std::pair<const char*, size_t>{"scan_input_axes", m},
                                    {"scan_input_directions", m},
                                    {"scan_output_axes", k},
                                    {"scan_output_directions", k}})
    if (node.Has(attr) && node.GetInts(attr).size() != count)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + attr + " has " +
                                                   std::to_string(node.GetInts(attr).size()) + " values, expected " +
                                                   std::to_string(count));
  for (const char* attr : {"scan_input_directions", "scan_output_directions"})
    for (int64_t direction : node.Has(attr) ? node.GetInts(attr) : std::vector<int64_t>{})
      if (direction != 0 && direction != 1)
        throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + attr + " holds " +
                                                     std::to_string(direction) + " (0 = forward, 1 = reverse)");
}

// If, Loop and Scan are replaced (by a branch, a compiled pair of branches, unrolled iterations) before inference
// reaches them (compile.cc).
static void InferUnrolled(InferContext& ctx) {
  throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": reached inference without being unrolled");
}

void RegisterControlFlowOps(OpRegistry& r) {
  r.Add("If", 1, kManyValues, 1, kManyValues, InferUnrolled);
  // M and cond are optional, and a node may end with them omitted ("trips", ""): the importer pads both.
  r.Add("Loop", 0, kManyValues, 1, kManyValues, InferUnrolled);
  r.Add("Scan", 1, kManyValues, 1, kManyValues, InferUnrolled);
}

}  // namespace osprey
