// Model-local functions inlined into the graph that calls them (onnx_functions.h). jax2onnx's @onnx_function writes
// every decorated module as one (its DINOv3 ViTs are a single call of "VisionTransformer"), as do onnxscript and
// PyTorch's TorchScript exporter with export_modules_as_functions.
#include "onnx/onnx_functions.h"

#include <google/protobuf/unknown_field_set.h>

#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "osprey/graph.h"

namespace osprey {
namespace {

[[noreturn]] void Bad(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

bool IsDefaultDomain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }

// Fields that Debian's onnx 1.12 protobuf does not declare, read from the message's unknown fields:
// FunctionProto.attribute_proto (11, the attributes' defaults, IR 9), FunctionProto.overload (13) and
// NodeProto.overload (8), IR 10.
std::vector<std::string> UnknownStrings(const google::protobuf::Message& m, int number) {
  std::vector<std::string> values;
  const google::protobuf::UnknownFieldSet& fields = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < fields.field_count(); ++i)
    if (fields.field(i).number() == number &&
        fields.field(i).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED)
      values.push_back(fields.field(i).length_delimited());
  return values;
}

std::string Overload(const google::protobuf::Message& m, int number) {
  std::vector<std::string> v = UnknownStrings(m, number);
  return v.empty() ? std::string() : v.back();
}

using Key = std::tuple<std::string, std::string, std::string>;  // domain, name, overload

struct Function {
  const onnx::FunctionProto* proto = nullptr;
  std::vector<onnx::AttributeProto> defaults;
};

class Inliner {
 public:
  Inliner(const onnx::ModelProto& model, int model_opset) {
    for (const onnx::FunctionProto& f : model.functions()) {
      const std::string what = "model-local function '" + f.domain() + "." + f.name() + "'";
      if (f.name().empty()) Bad("a model-local function has no name");
      for (const auto& op : f.opset_import())
        if (IsDefaultDomain(op.domain()) && op.version() != model_opset)
          throw Error(ErrorCode::kUnsupported, what + " imports ONNX opset " + std::to_string(op.version()) +
                                                   " and the model " + std::to_string(model_opset) +
                                                   "; osprey inlines functions of the model's opset only");
      Function fn;
      fn.proto = &f;
      for (const std::string& bytes : UnknownStrings(f, 11)) {
        onnx::AttributeProto a;
        if (!a.ParseFromString(bytes)) Bad(what + ": an attribute default does not parse");
        fn.defaults.push_back(std::move(a));
      }
      if (!functions_.emplace(Key{f.domain(), f.name(), Overload(f, 13)}, std::move(fn)).second)
        Bad(what + " is defined twice");
    }
  }

  void ExpandGraph(onnx::GraphProto* graph) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
    for (onnx::NodeProto& node : *graph->mutable_node()) {
      for (onnx::AttributeProto& a : *node.mutable_attribute()) {  // If branches, Loop and Scan bodies
        if (a.has_g()) ExpandGraph(a.mutable_g());
        for (onnx::GraphProto& g : *a.mutable_graphs()) ExpandGraph(&g);
      }
      Expand(node, 0, &out);
    }
    graph->mutable_node()->Swap(&out);
  }

 private:
  void Expand(const onnx::NodeProto& node, int depth, google::protobuf::RepeatedPtrField<onnx::NodeProto>* out) {
    const auto it = functions_.find(Key{node.domain(), node.op_type(), Overload(node, 8)});
    if (it == functions_.end()) {
      *out->Add() = node;
      return;
    }
    const onnx::FunctionProto& f = *it->second.proto;
    const std::string what = "node '" + node.name() + "' (function " + f.domain() + "." + f.name() + ")";
    if (depth >= kMaxFunctionDepth)
      Bad(what + ": function calls are nested more than " + std::to_string(kMaxFunctionDepth) + " deep");
    inlined_ += f.node_size();
    if (inlined_ > kMaxInlinedNodes)
      Bad(what + ": the model's function calls expand to more than " + std::to_string(kMaxInlinedNodes) + " nodes");
    if (node.input_size() > f.input_size() || node.output_size() > f.output_size())
      Bad(what + ": " + std::to_string(node.input_size()) + " inputs and " + std::to_string(node.output_size()) +
          " outputs, the function declares " + std::to_string(f.input_size()) + " and " +
          std::to_string(f.output_size()));
    const std::string prefix = (node.name().empty() ? f.name() : node.name()) + "#" + std::to_string(calls_++);
    std::unordered_map<std::string, std::string> rename;
    for (int i = 0; i < f.input_size(); ++i) rename[f.input(i)] = i < node.input_size() ? node.input(i) : "";
    for (int i = 0; i < f.output_size(); ++i)
      rename[f.output(i)] =
          i < node.output_size() && !node.output(i).empty() ? node.output(i) : prefix + "/" + f.output(i);
    auto name_of = [&](const std::string& name) {
      if (name.empty()) return name;
      const auto r = rename.find(name);
      return r != rename.end() ? r->second : prefix + "/" + name;
    };
    for (const onnx::NodeProto& body : f.node()) {
      onnx::NodeProto copy = body;
      for (std::string& in : *copy.mutable_input()) in = name_of(in);
      for (std::string& o : *copy.mutable_output()) o = name_of(o);
      copy.set_name(prefix + "/" + (body.name().empty() ? body.op_type() : body.name()));
      google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
      for (const onnx::AttributeProto& a : body.attribute()) {
        if (a.has_g() || a.graphs_size() > 0)
          throw Error(ErrorCode::kUnsupported, what + ": a subgraph inside a function body is not supported");
        if (a.ref_attr_name().empty()) {
          *attrs.Add() = a;
          continue;
        }
        // An attribute given by reference: the call's, else the function's default, else absent.
        const onnx::AttributeProto* value = nullptr;
        for (const onnx::AttributeProto& c : node.attribute())
          if (c.name() == a.ref_attr_name()) value = &c;
        if (!value)
          for (const onnx::AttributeProto& d : it->second.defaults)
            if (d.name() == a.ref_attr_name()) value = &d;
        if (!value) continue;
        onnx::AttributeProto resolved = *value;
        resolved.set_name(a.name());
        *attrs.Add() = std::move(resolved);
      }
      copy.mutable_attribute()->Swap(&attrs);
      Expand(copy, depth + 1, out);
    }
  }

  std::map<Key, Function> functions_;
  long inlined_ = 0;
  long calls_ = 0;
};

}  // namespace

void InlineModelFunctions(onnx::ModelProto* model, int model_opset) {
  if (model->functions_size() == 0 || !model->has_graph()) return;
  Inliner(*model, model_opset).ExpandGraph(model->mutable_graph());
  model->clear_functions();
}

}  // namespace osprey
