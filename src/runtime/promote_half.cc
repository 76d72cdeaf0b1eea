// Half-precision models computed in float32 (promote_half.h). Exporters write float16 models for GPUs
// (onnxconverter-common's convert_float_to_float16, torch's .half() exports); ONNX Runtime runs them on CPUs too.
// osprey's CPU kernels are float32, so the model is computed in float32: each value keeps more precision than the
// model's own float16 would (results differ from a float16 computation by float16's rounding, ~1e-3 relative).
#include "runtime/promote_half.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

namespace osprey {
namespace {

constexpr int64_t kOnnxFloat = 1, kOnnxFloat16 = 10, kOnnxBFloat16 = 16;  // TensorProto.DataType
constexpr const char* kHalfIoAttr = "_half_io";  // on the Casts this pass puts at the graph's inputs and outputs

bool IsHalf(DType d) { return d == DType::kF16 || d == DType::kBF16; }

// Everything but the graph's own inputs and outputs: constants, attributes, subgraphs, subgraphs' declared types.
bool PromoteInside(Graph& g, bool subgraph) {
  bool changed = false;
  for (auto& [id, t] : g.constants)
    if (IsHalf(t.dtype())) {
      t = CastTensor(t, DType::kF32);
      changed = true;
    }
  for (Node& n : g.nodes)
    for (auto& [key, attr] : n.attrs) {
      if (attr.kind == Attribute::Kind::kInt && (key == "to" || key == "dtype") &&
          (attr.i == kOnnxFloat16 || attr.i == kOnnxBFloat16)) {
        attr.i = kOnnxFloat;
        changed = true;
      } else if (attr.kind == Attribute::Kind::kTensor && attr.t.defined() && IsHalf(attr.t.dtype())) {
        attr.t = CastTensor(attr.t, DType::kF32);
        changed = true;
      } else if (attr.kind == Attribute::Kind::kGraph && attr.g) {
        auto copy = std::make_shared<Graph>(*attr.g);
        if (PromoteInside(*copy, true)) {
          attr.g = std::move(copy);
          changed = true;
        }
      }
    }
  if (subgraph)
    for (auto* infos : {&g.input_infos, &g.output_infos})
      for (ValueInfo& info : *infos)
        if (IsHalf(info.dtype)) {
          info.dtype = DType::kF32;
          changed = true;
        }
  return changed;
}

}  // namespace

bool PromoteHalfFloats(Graph& g) {
  for (const Node& n : g.nodes)
    if (n.attrs.count(kHalfIoAttr)) return false;  // promoted before: its casts back must stay half
  bool changed = PromoteInside(g, false);
  std::vector<Node> casts_in;
  std::unordered_map<int, int> promoted;  // half graph input -> its float32 copy
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    if (!IsHalf(g.input_infos[k].dtype)) continue;
    const int x = g.inputs[k];
    const int f = g.AddValue(g.value_names[x] + "/float32");
    Node cast;
    cast.op_type = "Cast";
    cast.name = "float32 " + g.value_names[x];
    cast.inputs = {x};
    cast.outputs = {f};
    cast.attrs["to"] = Attribute::Int(kOnnxFloat);
    cast.attrs[kHalfIoAttr] = Attribute::Int(1);
    casts_in.push_back(std::move(cast));
    promoted[x] = f;
  }
  for (Node& n : g.nodes)
    for (int& v : n.inputs)
      if (auto it = promoted.find(v); it != promoted.end()) v = it->second;
  std::vector<Node> casts_out;
  std::unordered_map<int, int> cast_back;  // float32 value -> its half copy, the output
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const ValueInfo& info = g.output_infos[k];
    const int y = g.outputs[k];
    if (auto it = cast_back.find(y); it != cast_back.end()) {  // the same value given as two outputs: one cast
      g.outputs[k] = it->second;
      continue;
    }
    if (!info.has_dtype || !IsHalf(info.dtype) || promoted.count(y)) continue;  // a half input given back as it is
    // The output keeps its name; the float32 value it is cast from gets another.
    const std::string name = g.value_names[y];
    g.value_names[y] = name + "/float32";
    const int h = g.AddValue(name);
    Node cast;
    cast.op_type = "Cast";
    cast.name = "half " + name;
    cast.inputs = {y};
    cast.outputs = {h};
    cast.attrs["to"] = Attribute::Int(info.dtype == DType::kF16 ? kOnnxFloat16 : kOnnxBFloat16);
    cast.attrs[kHalfIoAttr] = Attribute::Int(1);
    casts_out.push_back(std::move(cast));
    cast_back[y] = h;
    g.outputs[k] = h;
  }
  if (casts_in.empty() && casts_out.empty()) return changed;
  casts_in.insert(casts_in.end(), std::make_move_iterator(g.nodes.begin()), std::make_move_iterator(g.nodes.end()));
  casts_in.insert(casts_in.end(), std::make_move_iterator(casts_out.begin()), std::make_move_iterator(casts_out.end()));
  g.nodes = std::move(casts_in);
  return true;
}

}  // namespace osprey
