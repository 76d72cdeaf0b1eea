#pragma once
/// Graph IR and the builder API. A Graph is a plain value: build one, compile/run it, drop it. There is no default
/// graph and no global scope, so two graphs with the same node or value names never interact.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "osprey/tensor.h"

namespace osprey {

struct Graph;

/// A node attribute. kGraph holds a subgraph (an If branch, docs/architecture.md "If"): shared and immutable, so
/// copying a node or a graph does not copy it.
struct Attribute {
  enum class Kind { kFloat, kInt, kString, kTensor, kFloats, kInts, kStrings, kGraph };
  Kind kind = Kind::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::shared_ptr<const Graph> g;

  static Attribute Float(float v);
  static Attribute Int(int64_t v);
  static Attribute String(std::string v);
  static Attribute TensorValue(Tensor v);
  static Attribute Floats(std::vector<float> v);
  static Attribute Ints(std::vector<int64_t> v);
  static Attribute Strings(std::vector<std::string> v);
  static Attribute GraphValue(std::shared_ptr<const Graph> v);
};
const char* AttributeKindName(Attribute::Kind kind);
using AttributeMap = std::map<std::string, Attribute>;

/// One operation. Inputs/outputs are value ids in the owning Graph; an omitted optional input is -1.
struct Node {
  std::string op_type;
  std::string domain;  // "" for the ONNX default domain
  std::string name;    // for messages; may be empty
  std::vector<int> inputs;
  std::vector<int> outputs;
  AttributeMap attrs;

  bool Has(const std::string& attr) const { return attrs.count(attr) != 0; }
  /// Typed getters: return `fallback` when absent; throw kInvalidArgument when present with another kind.
  int64_t GetInt(const std::string& attr, int64_t fallback) const;
  float GetFloat(const std::string& attr, float fallback) const;
  std::string GetString(const std::string& attr, const std::string& fallback) const;
  std::vector<int64_t> GetInts(const std::string& attr, const std::vector<int64_t>& fallback = {}) const;
  std::vector<float> GetFloats(const std::string& attr, const std::vector<float>& fallback = {}) const;
  /// Input count not counting trailing omitted (-1) inputs.
  int NumInputs() const;
  /// "Conv 'resnet/conv1'" for messages.
  std::string Describe() const;
};

/// A dim of a declared input/output: a fixed size (value >= 0) or a symbol bound at run time.
struct Dim {
  int64_t value = -1;
  std::string symbol;
};

/// Declared type of a graph input or output.
struct ValueInfo {
  std::string name;
  DType dtype = DType::kF32;
  bool has_shape = false;
  std::vector<Dim> dims;
  bool has_dtype = false;  // the model declared the element type (else `dtype` is a placeholder)
  std::string ShapeString() const;  // "[N, 3, 224, 224]" / "[?]"
};

/// What an ONNX file says about its model (ModelProto's fields). Not part of the fingerprint: it changes nothing the
/// model computes.
struct ModelMetadata {
  std::string producer_name, producer_version, domain, description, graph_description;
  int64_t version = 0;
  std::vector<std::pair<std::string, std::string>> properties;  // metadata_props, in file order
};

/// The IR. Nodes are kept in topological order (Validate() checks). Values are numbered 0..num_values-1.
struct Graph {
  std::string name;
  int opset = 17;
  /// The file's metadata (null for graphs built in code); shared, so the copies the runtime makes of a graph (per
  /// shape, per segment) do not copy a file's metadata_props, which may be as large as the file allows.
  std::shared_ptr<const ModelMetadata> metadata;
  std::vector<std::string> value_names;  // indexed by value id
  std::vector<Node> nodes;
  std::vector<int> inputs;                     // graph input value ids (not constants)
  std::vector<ValueInfo> input_infos;          // parallel to `inputs`
  std::vector<int> outputs;                    // graph output value ids
  std::vector<ValueInfo> output_infos;         // parallel to `outputs` (dtype/shape may be unknown)
  std::unordered_map<int, Tensor> constants;  // initializers by value id

  int num_values() const { return static_cast<int>(value_names.size()); }
  int AddValue(const std::string& value_name);
  /// Value id by name, or -1.
  int FindValue(const std::string& value_name) const;
  /// Checks structure: ids in range, every input produced before use, single producer, outputs produced.
  /// Throws kInvalidArgument. (Op support and arity: ValidateOps in src/ops, run by Compile and the importer.)
  void Validate() const;
  /// 128-bit fingerprint (hex) of structure, attributes and constant contents.
  std::string Fingerprint() const;
  /// Digest (128 bits, as two words) of a tensor's bytes: what the fingerprint and the WeightStore hash for a constant.
  using Digest = std::array<uint64_t, 2>;
  static Digest ContentDigest(const Tensor& t);
  /// Fingerprint() from digests the caller already computed: `digests` maps every constant id to ContentDigest of its
  /// tensor, so the weights' bytes are not read again (Model hashes each weight once, for interning and this).
  std::string Fingerprint(const std::unordered_map<int, Digest>& digests) const;
  /// Sum of constant bytes.
  int64_t ConstantBytes() const;
};

/// Handle to a value while building.
struct ValueRef {
  int id = -1;
};

/// Builds a Graph in code:
///   GraphBuilder b("prep");
///   auto x = b.InputDims("image", DType::kU8, {{-1, "H"}, {-1, "W"}, {3, ""}});
///   auto y = b.Op("Cast", {x}, {{"to", Attribute::Int(1)}});
///   b.Output(y, "y");
///   Graph g = b.Finish();
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name = "graph", int opset = 17);
  ValueRef InputDims(const std::string& name, DType dtype, std::vector<Dim> dims);
  /// Convenience: fixed dims; -1 means a free dim.
  ValueRef Input(const std::string& name, DType dtype, const std::vector<int64_t>& dims);
  ValueRef Constant(const Tensor& value, const std::string& name = "");
  /// Adds a single-output node.
  ValueRef Op(const std::string& op_type, const std::vector<ValueRef>& inputs, AttributeMap attrs = {},
              const std::string& node_name = "");
  /// Adds a node with `num_outputs` outputs.
  std::vector<ValueRef> OpMulti(const std::string& op_type, const std::vector<ValueRef>& inputs, int num_outputs,
                                AttributeMap attrs = {}, const std::string& node_name = "");
  void Output(ValueRef value, const std::string& name = "");
  /// Validates and returns the graph. The builder is left empty.
  Graph Finish();

 private:
  std::string Fresh(const std::string& base);
  Graph graph_;
  int counter_ = 0;
};

}  // namespace osprey
