// ONNX ModelProto -> osprey Graph.
#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <queue>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "onnx/onnx_functions.h"
#include "onnx/onnx_wire.h"
#include "ops/control_flow.h"
#include "ops/op_registry.h"
#include "osprey/onnx.h"

namespace osprey {

// Defined in onnx_tensor.cc.
Tensor TensorFromProto(const onnx::TensorProto& tp, const std::string& base_dir, const std::string& what,
                       const std::string_view* raw_data);

namespace {

[[noreturn]] void Bad(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

bool IsDefaultDomain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }

int DefaultOpset(const onnx::ModelProto& model) {
  int opset = -1;
  for (const auto& op : model.opset_import()) {
    if (!IsDefaultDomain(op.domain())) continue;
    if (opset >= 0 && opset != op.version())
      Bad("model imports the default ONNX domain twice, at opsets " + std::to_string(opset) + " and " +
          std::to_string(op.version()));
    if (op.version() < 0 || op.version() > INT_MAX) Bad("model opset " + std::to_string(op.version()) + " is invalid");
    opset = static_cast<int>(op.version());
  }
  if (opset < 0) Bad("model declares no opset for the default ONNX domain (opset_import is missing)");
  if (opset < kMinOnnxOpset || opset > kMaxOnnxOpset)
    throw Error(ErrorCode::kUnsupported, "model uses ONNX opset " + std::to_string(opset) +
                                             "; osprey supports opsets " + std::to_string(kMinOnnxOpset) + ".." +
                                             std::to_string(kMaxOnnxOpset) +
                                             " (onnx.version_converter can convert it)");
  return opset;
}

// Declared type of a graph input (`is_input`) or output. An output may leave its element type unset.
ValueInfo InfoFromProto(const onnx::ValueInfoProto& vi, bool is_input) {
  std::string what = std::string(is_input ? "graph input '" : "graph output '") + vi.name() + "'";
  ValueInfo info;
  info.name = vi.name();
  // A TypeProto with no kind set says as little as no type at all (PyTorch's exporter writes such outputs in If
  // branches, e.g. Silero VAD's); an output's type is inferred.
  if (!vi.has_type() || vi.type().value_case() == onnx::TypeProto::VALUE_NOT_SET) {
    if (is_input) Bad(what + " has no type");
    return info;
  }
  if (!vi.type().has_tensor_type())
    throw Error(ErrorCode::kUnsupported, what +
                                             " is not a tensor (sequence, map, optional and sparse types are "
                                             "not supported)");
  const auto& tt = vi.type().tensor_type();
  if (tt.elem_type() == onnx::TensorProto_DataType_UNDEFINED) {
    if (is_input) Bad(what + " has no element type");
  } else {
    try {
      info.dtype = DTypeFromOnnx(tt.elem_type());
      info.has_dtype = true;
    } catch (const Error& e) {
      throw Error(e.code(), what + ": " + e.what());
    }
  }
  if (tt.has_shape()) {
    info.has_shape = true;
    for (const auto& d : tt.shape().dim()) {
      Dim dim;
      if (d.has_dim_value() && d.dim_value() == -1) {
        // Some exporters write a dynamic dim as -1 (ONNX Runtime reads it so): an unnamed dynamic dim.
        dim.symbol = "?";
      } else if (d.has_dim_value()) {
        if (d.dim_value() < 0)
          Bad(what + " has dim " + std::to_string(d.dim_value()) + "; a dim must be >= 0, or -1 for a dynamic dim");
        dim.value = d.dim_value();
      } else if (d.has_dim_param() && !d.dim_param().empty()) {
        dim.symbol = d.dim_param();
      } else {
        dim.symbol = "?";
      }
      info.dims.push_back(std::move(dim));
    }
  }
  return info;
}

// If branches nest at most this deep (an If inside a branch is one level more); deeper is refused, so a hostile
// model cannot make the importer or the compile step recurse without bound.
constexpr int kMaxSubgraphDepth = 8;

class Importer {
 public:
  // `gp` is consumed: initializer bytes are released as they are converted, to keep peak memory near 1x. `depth` is
  // 0 for the model's graph and counts the If branches around a subgraph; `problems` collects unsupported attributes
  // across all of them.
  // `raw_spans` (the model's graph only; may be null): per initializer, its raw_data in the model bytes when the
  // parse left it out (onnx_wire.h).
  Importer(onnx::GraphProto& gp, int opset, std::string base_dir, const OnnxImportOptions& options, int depth,
           std::vector<std::string>* problems, const std::vector<onnx_wire::RawSpan>* raw_spans = nullptr)
      : gp_(gp),
        base_dir_(std::move(base_dir)),
        options_(options),
        depth_(depth),
        problems_(*problems),
        raw_spans_(raw_spans) {
    graph_.opset = opset;
  }

  Graph Import() {
    onnx::GraphProto& gp = gp_;
    graph_.name = gp.name().empty() ? "graph" : gp.name();
    if (gp.sparse_initializer_size() > 0)
      throw Error(ErrorCode::kUnsupported, "sparse initializers are not supported (initializer '" +
                                               gp.sparse_initializer(0).values().name() + "')");
    ImportInitializers(gp);
    ImportInputs(gp);
    ImportNodes(gp);
    SortNodes();
    ImportOutputs(gp);
    if (depth_ > 0) CaptureOuterValues();
    graph_.Validate();
    if (depth_ == 0 && options_.validate_ops) ValidateAll();
    return std::move(graph_);
  }

 private:
  int ValueId(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    int id = graph_.AddValue(name);
    ids_.emplace(name, id);
    return id;
  }

  void ImportInitializers(onnx::GraphProto& gp) {
    for (int index = 0; index < gp.initializer_size(); ++index) {
      onnx::TensorProto& tp = *gp.mutable_initializer(index);
      if (tp.name().empty()) Bad("an initializer has no name");
      if (ids_.count(tp.name())) Bad("initializer '" + tp.name() + "' is defined twice");
      int id = ValueId(tp.name());
      std::string_view raw;
      const onnx_wire::RawSpan* span = raw_spans_ ? &(*raw_spans_)[index] : nullptr;
      if (span && span->present) raw = std::string_view(span->data, span->size);
      graph_.constants[id] =
          TensorFromProto(tp, base_dir_, "initializer '" + tp.name() + "'", span && span->present ? &raw : nullptr);
      std::string().swap(*tp.mutable_raw_data());
      tp.clear_float_data();
      tp.clear_int32_data();
      tp.clear_int64_data();
    }
  }

  void ImportInputs(const onnx::GraphProto& gp) {
    for (const auto& vi : gp.input()) {
      if (vi.name().empty()) Bad("a graph input has no name");
      auto it = ids_.find(vi.name());
      // Before IR version 4 every initializer was also listed as an input; such inputs are constants.
      if (it != ids_.end() && graph_.constants.count(it->second)) continue;
      if (it != ids_.end()) Bad("graph input '" + vi.name() + "' is listed twice");
      int id = ValueId(vi.name());
      graph_.inputs.push_back(id);
      input_ids_.insert(id);
      // A subgraph's (Loop body's) inputs take their types from the node's inputs: a declared type is optional.
      graph_.input_infos.push_back(InfoFromProto(vi, /*is_input=*/depth_ == 0));
    }
  }

  Attribute ConvertAttribute(const onnx::AttributeProto& ap, Node& node, bool* keep) {
    *keep = true;
    int type = ap.type();
    if (type == onnx::AttributeProto_AttributeType_UNDEFINED) {
      // Old exporters leave the type unset; infer it from the field that is filled.
      if (ap.has_t())
        type = onnx::AttributeProto_AttributeType_TENSOR;
      else if (ap.has_g())
        type = onnx::AttributeProto_AttributeType_GRAPH;
      else if (ap.has_s())
        type = onnx::AttributeProto_AttributeType_STRING;
      else if (ap.has_i())
        type = onnx::AttributeProto_AttributeType_INT;
      else if (ap.has_f())
        type = onnx::AttributeProto_AttributeType_FLOAT;
      else if (ap.floats_size())
        type = onnx::AttributeProto_AttributeType_FLOATS;
      else if (ap.ints_size())
        type = onnx::AttributeProto_AttributeType_INTS;
      else if (ap.strings_size())
        type = onnx::AttributeProto_AttributeType_STRINGS;
      else if (ap.graphs_size())
        type = onnx::AttributeProto_AttributeType_GRAPHS;
      else
        Bad(node.Describe() + ": attribute '" + ap.name() + "' has no type and no value");
    }
    switch (type) {
      case onnx::AttributeProto_AttributeType_FLOAT:
        return Attribute::Float(ap.f());
      case onnx::AttributeProto_AttributeType_INT:
        return Attribute::Int(ap.i());
      case onnx::AttributeProto_AttributeType_STRING:
        return Attribute::String(ap.s());
      case onnx::AttributeProto_AttributeType_TENSOR:
        return Attribute::TensorValue(
            TensorFromProto(ap.t(), base_dir_, node.Describe() + " attribute '" + ap.name() + "'", nullptr));
      case onnx::AttributeProto_AttributeType_FLOATS:
        return Attribute::Floats(std::vector<float>(ap.floats().begin(), ap.floats().end()));
      case onnx::AttributeProto_AttributeType_INTS:
        return Attribute::Ints(std::vector<int64_t>(ap.ints().begin(), ap.ints().end()));
      case onnx::AttributeProto_AttributeType_STRINGS:
        return Attribute::Strings(std::vector<std::string>(ap.strings().begin(), ap.strings().end()));
      case onnx::AttributeProto_AttributeType_GRAPH:
        if (node.op_type == "If" && node.domain.empty() && (ap.name() == "then_branch" || ap.name() == "else_branch"))
          return Attribute::GraphValue(std::make_shared<const Graph>(ImportBranch(ap, node)));
        if ((node.op_type == "Loop" || node.op_type == "Scan") && node.domain.empty() && ap.name() == "body")
          return Attribute::GraphValue(std::make_shared<const Graph>(ImportSubgraph(ap, node)));
        [[fallthrough]];
      case onnx::AttributeProto_AttributeType_GRAPHS:
        problems_.push_back(node.Describe() + " has subgraph attribute '" + ap.name() +
                            "' (subgraphs are supported only as If branches and Loop and Scan bodies)");
        break;
      default: {
        std::string kind =
            onnx::AttributeProto_AttributeType_IsValid(type)
                ? onnx::AttributeProto_AttributeType_Name(static_cast<onnx::AttributeProto_AttributeType>(type))
                : "type " + std::to_string(type);
        problems_.push_back(node.Describe() + " has attribute '" + ap.name() + "' of kind " + kind +
                            " (not supported)");
        break;
      }
    }
    // Unsupported attributes are left off the node; import fails later unless the caller only inspects the graph.
    *keep = false;
    return {};
  }

  // A Constant node with a plain tensor/number payload becomes a graph constant; returns false to keep the node.
  bool FoldConstantNode(const Node& node) {
    if (node.op_type != "Constant" || !IsDefaultDomain(node.domain) || node.outputs.size() != 1 ||
        node.attrs.size() != 1 || !node.inputs.empty())
      return false;
    const auto& [key, a] = *node.attrs.begin();
    Tensor value;
    if (key == "value" && a.kind == Attribute::Kind::kTensor) {
      value = a.t;
    } else if (key == "value_float" && a.kind == Attribute::Kind::kFloat) {
      value = Tensor::Scalar<float>(a.f);
    } else if (key == "value_int" && a.kind == Attribute::Kind::kInt) {
      value = Tensor::Scalar<int64_t>(a.i);
    } else if (key == "value_floats" && a.kind == Attribute::Kind::kFloats) {
      value = Tensor::FromVector<float>({static_cast<int64_t>(a.floats.size())}, a.floats);
    } else if (key == "value_ints" && a.kind == Attribute::Kind::kInts) {
      value = Tensor::FromVector<int64_t>({static_cast<int64_t>(a.ints.size())}, a.ints);
    } else {
      return false;
    }
    int id = node.outputs[0];
    if (graph_.constants.count(id) || IsGraphInput(id))
      Bad(node.Describe() + ": output '" + graph_.value_names[id] + "' is already an initializer or graph input");
    graph_.constants[id] = std::move(value);
    return true;
  }

  bool IsGraphInput(int id) const { return input_ids_.count(id) != 0; }

  void ImportNodes(const onnx::GraphProto& gp) {
    for (int index = 0; index < gp.node_size(); ++index) {
      const onnx::NodeProto& np = gp.node(index);
      Node node;
      node.op_type = np.op_type();
      node.domain = np.domain() == "ai.onnx" ? "" : np.domain();
      node.name = np.name().empty() ? np.op_type() + "_" + std::to_string(index) : np.name();
      if (node.op_type.empty()) Bad("node " + std::to_string(index) + " ('" + np.name() + "') has no op_type");
      for (const std::string& in : np.input()) node.inputs.push_back(in.empty() ? -1 : ValueId(in));
      int num_outputs = np.output_size();
      while (num_outputs > 0 && np.output(num_outputs - 1).empty()) --num_outputs;
      for (int k = 0; k < num_outputs; ++k) {
        const std::string& out = np.output(k);
        // An omitted optional output in the middle still needs a value to write to.
        node.outputs.push_back(out.empty() ? graph_.AddValue(node.name + ":unused_output_" + std::to_string(k))
                                           : ValueId(out));
      }
      for (const auto& ap : np.attribute()) {
        if (ap.name().empty()) Bad(node.Describe() + " has an attribute with no name");
        if (node.attrs.count(ap.name())) Bad(node.Describe() + " has attribute '" + ap.name() + "' twice");
        bool keep;
        Attribute a = ConvertAttribute(ap, node, &keep);
        if (keep) node.attrs.emplace(ap.name(), std::move(a));
      }
      if (node.op_type == "If" && node.domain.empty()) AddCapturedInputs(node);
      if ((node.op_type == "Loop" || node.op_type == "Scan") && node.domain.empty()) AddLoopCapturedInputs(node, np);
      if (FoldConstantNode(node)) continue;
      graph_.nodes.push_back(std::move(node));
    }
  }

  // Orders nodes so every value is produced before use; keeps file order among independent nodes (Kahn's algorithm
  // with the smallest original index first).
  void SortNodes() {
    std::vector<Node>& nodes = graph_.nodes;
    const size_t n = nodes.size();
    std::vector<int> producer(graph_.num_values(), -1);
    for (size_t i = 0; i < n; ++i) {
      for (int v : nodes[i].outputs) {
        if (producer[v] >= 0 || graph_.constants.count(v) || IsGraphInput(v))
          Bad(nodes[i].Describe() + ": output '" + graph_.value_names[v] +
              "' is already produced by another node, an initializer or a graph input");
        producer[v] = static_cast<int>(i);
      }
    }
    std::vector<int> pending(n, 0);
    std::vector<std::vector<int>> consumers(n);
    for (size_t i = 0; i < n; ++i) {
      std::set<int> deps;
      for (int v : nodes[i].inputs)
        if (v >= 0 && producer[v] >= 0) deps.insert(producer[v]);
      pending[i] = static_cast<int>(deps.size());
      for (int d : deps) consumers[d].push_back(static_cast<int>(i));
    }
    std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
    for (size_t i = 0; i < n; ++i)
      if (pending[i] == 0) ready.push(static_cast<int>(i));
    std::vector<int> order;
    order.reserve(n);
    while (!ready.empty()) {
      int i = ready.top();
      ready.pop();
      order.push_back(i);
      for (int c : consumers[i])
        if (--pending[c] == 0) ready.push(c);
    }
    if (order.size() != n) {
      for (size_t i = 0; i < n; ++i)
        if (pending[i] > 0) Bad("graph has a cycle: " + nodes[i].Describe() + " depends (indirectly) on itself");
    }
    std::vector<Node> sorted;
    sorted.reserve(n);
    for (int i : order) sorted.push_back(std::move(nodes[i]));
    nodes = std::move(sorted);
  }

  void ImportOutputs(const onnx::GraphProto& gp) {
    for (const auto& vi : gp.output()) {
      if (vi.name().empty()) Bad("a graph output has no name");
      auto it = ids_.find(vi.name());
      if (it == ids_.end() && depth_ > 0) it = ids_.emplace(vi.name(), graph_.AddValue(vi.name())).first;  // outer
      if (it == ids_.end())
        Bad("graph output '" + vi.name() + "' is not produced by any node, initializer or graph input");
      graph_.outputs.push_back(it->second);
      graph_.output_infos.push_back(InfoFromProto(vi, /*is_input=*/false));
    }
  }

  void ValidateAll() {
    std::string extra;
    for (const std::string& p : problems_) extra += (extra.empty() ? "" : "; ") + p;
    try {
      ValidateOps(graph_);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kUnsupported && !extra.empty())
        throw Error(e.code(), std::string(e.what()) + "; also " + extra);
      throw;
    }
    if (!extra.empty()) throw Error(ErrorCode::kUnsupported, extra);
  }

  // An If branch: a graph with no inputs of its own that may read values of the graphs around it by name.
  Graph ImportBranch(const onnx::AttributeProto& ap, const Node& node) {
    if (ap.g().input_size() > 0)
      Bad(node.Describe() + ": " + ap.name() + " declares " + std::to_string(ap.g().input_size()) +
          " inputs; If branches take none");
    return ImportSubgraph(ap, node);
  }

  // A subgraph (If branch, Loop body): its declared inputs first, then the outer values it reads (CaptureOuterValues).
  Graph ImportSubgraph(const onnx::AttributeProto& ap, const Node& node) {
    if (depth_ + 1 > kMaxSubgraphDepth)
      Bad(node.Describe() + ": subgraphs (If branches, Loop bodies) are nested more than " +
          std::to_string(kMaxSubgraphDepth) + " deep");
    onnx::GraphProto gp = ap.g();
    if (gp.name().empty()) gp.set_name(node.name + "/" + ap.name());
    return Importer(gp, graph_.opset, base_dir_, options_, depth_ + 1, &problems_).Import();
  }

  // Subgraphs only: the values read but not defined here are the enclosing graphs'; they become this graph's
  // inputs, in name order.
  void CaptureOuterValues() {
    std::vector<char> defined(graph_.num_values(), 0);
    for (int v : graph_.inputs) defined[v] = 1;
    for (const auto& [id, t] : graph_.constants) defined[id] = 1;
    for (const Node& n : graph_.nodes)
      for (int v : n.outputs) defined[v] = 1;
    std::set<std::pair<std::string, int>> outer;
    for (const Node& n : graph_.nodes)
      for (int v : n.inputs)
        if (v >= 0 && !defined[v]) outer.emplace(graph_.value_names[v], v);
    for (int v : graph_.outputs)
      if (!defined[v]) outer.emplace(graph_.value_names[v], v);
    for (const auto& [name, id] : outer) {
      graph_.inputs.push_back(id);
      ValueInfo info;
      info.name = name;
      graph_.input_infos.push_back(std::move(info));
    }
  }

  // Gives both branches of an If the same inputs (the union of the outer values they read, in name order) and adds
  // those values to the node's inputs after the condition, so they order and keep alive like any input.
  void AddCapturedInputs(Node& node) {
    std::set<std::string> names;
    for (const char* key : {"then_branch", "else_branch"}) {
      auto it = node.attrs.find(key);
      if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kGraph) continue;
      for (const ValueInfo& info : it->second.g->input_infos) names.insert(info.name);
    }
    for (const char* key : {"then_branch", "else_branch"}) {
      auto it = node.attrs.find(key);
      if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kGraph) continue;
      Graph branch = *it->second.g;
      branch.inputs.clear();
      branch.input_infos.clear();
      for (const std::string& name : names) {
        int id = branch.FindValue(name);
        if (id < 0) id = branch.AddValue(name);
        branch.inputs.push_back(id);
        ValueInfo info;
        info.name = name;
        branch.input_infos.push_back(std::move(info));
      }
      it->second.g = std::make_shared<const Graph>(std::move(branch));
    }
    if (node.inputs.empty()) Bad(node.Describe() + ": input 0 (the condition) is required");
    node.inputs.resize(1);
    for (const std::string& name : names) node.inputs.push_back(ValueId(name));
    CheckIfNode(node);
  }

  // A Loop's body reads (iteration_num, cond, N carried values), a Scan's (N states, M scan elements), and then the
  // outer values CaptureOuterValues found; those become the node's inputs after its own, and `_carried` records N.
  void AddLoopCapturedInputs(Node& node, const onnx::NodeProto& np) {
    auto it = node.attrs.find("body");
    if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kGraph) return;  // reported as a problem
    const Graph& body = *it->second.g;
    int declared = 0;
    for (const auto& ap : np.attribute())
      if (ap.name() == "body") declared = ap.g().input_size();
    const bool scan = node.op_type == "Scan";
    if (scan && graph_.opset < 9)
      throw Error(ErrorCode::kUnsupported, node.Describe() + ": Scan before opset 9 (batched, with sequence_lens) is "
                                                             "not supported; convert the model to opset 9 or newer "
                                                             "(onnx.version_converter)");
    // Inputs before the carried values: Loop's M and cond; none for Scan, whose scan inputs come after them.
    const int before = scan ? 0 : 2, after = scan ? static_cast<int>(node.GetInt("num_scan_inputs", 0)) : 0;
    if (declared < before + after)
      Bad(node.Describe() + ": the body declares " + std::to_string(declared) + " inputs, fewer than " +
          std::to_string(before + after) + (scan ? " (num_scan_inputs)" : " (iteration number, condition)"));
    while (static_cast<int>(node.inputs.size()) < before) node.inputs.push_back(-1);  // M and cond omitted at the end
    if (static_cast<int>(node.inputs.size()) != declared)
      Bad(node.Describe() + ": " + std::to_string(node.inputs.size()) + " inputs, but the body declares " +
          std::to_string(declared));
    for (size_t k = static_cast<size_t>(declared); k < body.inputs.size(); ++k)
      node.inputs.push_back(ValueId(body.input_infos[k].name));
    node.attrs[kLoopCarriedAttr] = Attribute::Int(declared - before - after);
    if (scan)
      CheckScanNode(node);
    else
      CheckLoopNode(node);
  }

  onnx::GraphProto& gp_;
  std::string base_dir_;
  OnnxImportOptions options_;
  int depth_ = 0;
  std::vector<std::string>& problems_;
  Graph graph_;
  std::unordered_map<std::string, int> ids_;
  std::set<int> input_ids_;
  const std::vector<onnx_wire::RawSpan>* raw_spans_ = nullptr;
};

Graph ImportModel(onnx::ModelProto& model, const std::string& base_dir, const OnnxImportOptions& options,
                  const std::vector<onnx_wire::RawSpan>* raw_spans = nullptr) {
  if (!model.has_graph()) Bad("ONNX model has no graph");
  const int opset = DefaultOpset(model);
  InlineModelFunctions(&model, opset);
  std::vector<std::string> problems;
  Graph graph = Importer(*model.mutable_graph(), opset, base_dir, options, 0, &problems, raw_spans).Import();
  auto metadata = std::make_shared<ModelMetadata>();
  ModelMetadata& m = *metadata;
  m.producer_name = model.producer_name();
  m.producer_version = model.producer_version();
  m.domain = model.domain();
  m.description = model.doc_string();
  m.graph_description = model.graph().doc_string();
  m.version = model.model_version();
  for (const auto& p : model.metadata_props()) m.properties.emplace_back(p.key(), p.value());
  graph.metadata = std::move(metadata);
  return graph;
}

void ParseModelProto(const void* data, size_t size, const std::string& source, onnx::ModelProto* model) {
  if (size > static_cast<size_t>(INT_MAX))
    throw Error(ErrorCode::kUnsupported, source + " is larger than 2 GiB; store its weights as external data");
  if (!model->ParseFromArray(data, static_cast<int>(size)))
    throw Error(ErrorCode::kInvalidArgument, source + " is not a valid ONNX model (protobuf parse failed)");
}

// Parses the model in `data` without copying its initializers' raw_data into the message: protobuf reads the
// structure (onnx_wire.h), and `spans` says where each initializer's bytes are in `data`, which must outlive the
// import. Falls back to parsing `data` whole (spans empty) when the split does not apply, so malformed models get the
// usual error.
void ParseModelProtoSplit(const void* data, size_t size, const std::string& source, onnx::ModelProto* model,
                          std::vector<onnx_wire::RawSpan>* spans) {
  if (size <= static_cast<size_t>(INT_MAX)) {
    std::string stripped;
    if (onnx_wire::StripInitializerData(static_cast<const char*>(data), size, &stripped, spans) &&
        stripped.size() <= static_cast<size_t>(INT_MAX) && model->ParseFromString(stripped) &&
        static_cast<size_t>(model->graph().initializer_size()) == spans->size())
      return;
  }
  spans->clear();
  model->Clear();
  ParseModelProto(data, size, source, model);
}

}  // namespace

Graph ParseOnnxModel(const void* data, size_t size, const std::string& base_dir, const OnnxImportOptions& options) {
  onnx::ModelProto model;
  std::vector<onnx_wire::RawSpan> spans;
  ParseModelProtoSplit(data, size, "the data", &model, &spans);
  return ImportModel(model, base_dir, options, spans.empty() ? nullptr : &spans);
}

Graph LoadOnnxModel(const std::string& path, const OnnxImportOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(ErrorCode::kInvalidArgument, "'" + path + "' is a directory, not an ONNX model file");
  // The file bytes never sit in anonymous memory beside the parsed model: they are mapped (page cache) or streamed.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kNotFound, "cannot open model file '" + path + "': " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(ErrorCode::kUnavailable, "cannot read model file '" + path + "': " + std::strerror(errno));
  }
  if (st.st_size > INT_MAX) {
    ::close(fd);
    throw Error(ErrorCode::kUnsupported, "'" + path + "' is larger than 2 GiB; store its weights as external data");
  }
  std::string base_dir = std::filesystem::path(path).parent_path().string();
  if (base_dir.empty()) base_dir = ".";
  onnx::ModelProto model;
  // A regular file is mapped (pages shared with the page cache, prefaulted in one call) and parsed without its
  // weights' bytes; each initializer is then copied once, from the mapping into its tensor. Anything else (a pipe, a
  // failed mapping) is parsed straight from the descriptor, as protobuf reads it in blocks.
  const size_t size = static_cast<size_t>(st.st_size);
  void* mapped = S_ISREG(st.st_mode) && size > 0
                     ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0)
                     : MAP_FAILED;
  if (mapped != MAP_FAILED) {
    ::close(fd);
    struct Unmap {
      void* p;
      size_t n;
      ~Unmap() { ::munmap(p, n); }
    } unmap{mapped, size};
    std::vector<onnx_wire::RawSpan> spans;
    ParseModelProtoSplit(mapped, size, "'" + path + "'", &model, &spans);
    return ImportModel(model, base_dir, options, spans.empty() ? nullptr : &spans);
  }
  bool parsed;
  {
    google::protobuf::io::FileInputStream stream(fd);
    stream.SetCloseOnDelete(true);
    parsed = model.ParseFromZeroCopyStream(&stream);
  }
  if (!parsed)
    throw Error(ErrorCode::kInvalidArgument, "'" + path + "' is not a valid ONNX model (protobuf parse failed)");
  return ImportModel(model, base_dir, options);
}

}  // namespace osprey
