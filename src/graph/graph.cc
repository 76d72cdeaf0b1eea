#include "osprey/graph.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "core/hash.h"

namespace osprey {

Attribute Attribute::Float(float v) { Attribute a; a.kind = Kind::kFloat; a.f = v; return a; }
Attribute Attribute::Int(int64_t v) { Attribute a; a.kind = Kind::kInt; a.i = v; return a; }
Attribute Attribute::String(std::string v) { Attribute a; a.kind = Kind::kString; a.s = std::move(v); return a; }
Attribute Attribute::TensorValue(Tensor v) { Attribute a; a.kind = Kind::kTensor; a.t = std::move(v); return a; }
Attribute Attribute::Floats(std::vector<float> v) { Attribute a; a.kind = Kind::kFloats; a.floats = std::move(v); return a; }
Attribute Attribute::Ints(std::vector<int64_t> v) { Attribute a; a.kind = Kind::kInts; a.ints = std::move(v); return a; }
Attribute Attribute::Strings(std::vector<std::string> v) {
  Attribute a;
  a.kind = Kind::kStrings;
  a.strings = std::move(v);
  return a;
}

Attribute Attribute::GraphValue(std::shared_ptr<const Graph> v) {
  Attribute a;
  a.kind = Kind::kGraph;
  a.g = std::move(v);
  return a;
}

const char* AttributeKindName(Attribute::Kind kind) {
  switch (kind) {
    case Attribute::Kind::kFloat: return "float";
    case Attribute::Kind::kInt: return "int";
    case Attribute::Kind::kString: return "string";
    case Attribute::Kind::kTensor: return "tensor";
    case Attribute::Kind::kFloats: return "floats";
    case Attribute::Kind::kInts: return "ints";
    case Attribute::Kind::kStrings: return "strings";
    case Attribute::Kind::kGraph: return "graph";
  }
  return "?";
}

namespace {
const Attribute* FindAttr(const Node& n, const std::string& attr, Attribute::Kind want) {
  auto it = n.attrs.find(attr);
  if (it == n.attrs.end()) return nullptr;
  if (it->second.kind != want) {
    // ONNX allows an int where a float is expected in a few exporters; accept the obvious widenings.
    if (want == Attribute::Kind::kFloat && it->second.kind == Attribute::Kind::kInt) return &it->second;
    if (want == Attribute::Kind::kInts && it->second.kind == Attribute::Kind::kInt) return &it->second;
    throw Error(ErrorCode::kInvalidArgument, n.Describe() + ": attribute '" + attr + "' should be " +
                                                 AttributeKindName(want) + ", got " +
                                                 AttributeKindName(it->second.kind));
  }
  return &it->second;
}
}  // namespace

int64_t Node::GetInt(const std::string& attr, int64_t fallback) const {
  const Attribute* a = FindAttr(*this, attr, Attribute::Kind::kInt);
  return a ? a->i : fallback;
}
float Node::GetFloat(const std::string& attr, float fallback) const {
  const Attribute* a = FindAttr(*this, attr, Attribute::Kind::kFloat);
  if (!a) return fallback;
  return a->kind == Attribute::Kind::kInt ? static_cast<float>(a->i) : a->f;
}
std::string Node::GetString(const std::string& attr, const std::string& fallback) const {
  const Attribute* a = FindAttr(*this, attr, Attribute::Kind::kString);
  return a ? a->s : fallback;
}
std::vector<int64_t> Node::GetInts(const std::string& attr, const std::vector<int64_t>& fallback) const {
  const Attribute* a = FindAttr(*this, attr, Attribute::Kind::kInts);
  if (!a) return fallback;
  if (a->kind == Attribute::Kind::kInt) return {a->i};
  return a->ints;
}
std::vector<float> Node::GetFloats(const std::string& attr, const std::vector<float>& fallback) const {
  const Attribute* a = FindAttr(*this, attr, Attribute::Kind::kFloats);
  return a ? a->floats : fallback;
}
int Node::NumInputs() const {
  int n = static_cast<int>(inputs.size());
  while (n > 0 && inputs[n - 1] < 0) --n;
  return n;
}
std::string Node::Describe() const { return op_type + " '" + name + "'"; }

std::string ValueInfo::ShapeString() const {
  if (!has_shape) return "[?]";
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << ", ";
    if (dims[i].value >= 0)
      os << dims[i].value;
    else
      os << (dims[i].symbol.empty() ? "?" : dims[i].symbol);
  }
  os << ']';
  return os.str();
}

int Graph::AddValue(const std::string& value_name) {
  value_names.push_back(value_name);
  return num_values() - 1;
}

int Graph::FindValue(const std::string& value_name) const {
  for (int i = 0; i < num_values(); ++i)
    if (value_names[i] == value_name) return i;
  return -1;
}

int64_t Graph::ConstantBytes() const {
  int64_t total = 0;
  for (const auto& [id, t] : constants) total += static_cast<int64_t>(t.nbytes());
  return total;
}

Graph::Digest Graph::ContentDigest(const Tensor& t) {
  const Hash128 h = HashBytes(t.raw(), t.nbytes());
  return {h.lo, h.hi};
}

std::string Graph::Fingerprint() const {
  std::unordered_map<int, Digest> digests;
  for (const auto& [id, t] : constants) digests.emplace(id, ContentDigest(t));
  return Fingerprint(digests);
}

std::string Graph::Fingerprint(const std::unordered_map<int, Digest>& digests) const {
  Hasher h;
  h.UpdateU64(opset);
  h.UpdateU64(value_names.size());
  for (int id : inputs) h.UpdateU64(id);
  for (const ValueInfo& vi : input_infos) {
    h.UpdateU64(static_cast<uint64_t>(vi.dtype));
    h.UpdateU64(vi.dims.size());
    for (const Dim& d : vi.dims) h.UpdateU64(static_cast<uint64_t>(d.value));
  }
  for (int id : outputs) h.UpdateU64(id);
  for (const Node& n : nodes) {
    h.Update(n.op_type);
    h.Update(n.domain);
    h.UpdateU64(n.inputs.size());
    for (int v : n.inputs) h.UpdateU64(static_cast<uint64_t>(v));
    h.UpdateU64(n.outputs.size());
    for (int v : n.outputs) h.UpdateU64(static_cast<uint64_t>(v));
    for (const auto& [key, a] : n.attrs) {
      h.Update(key);
      h.UpdateU64(static_cast<uint64_t>(a.kind));
      h.UpdateU64(static_cast<uint64_t>(a.i));
      h.Update(&a.f, sizeof a.f);
      h.Update(a.s);
      h.UpdateU64(a.ints.size());
      if (!a.ints.empty()) h.Update(a.ints.data(), a.ints.size() * sizeof(int64_t));
      h.UpdateU64(a.floats.size());
      if (!a.floats.empty()) h.Update(a.floats.data(), a.floats.size() * sizeof(float));
      for (const std::string& s : a.strings) h.Update(s);
      if (a.kind == Attribute::Kind::kTensor && a.t.numel() > 0) {
        h.UpdateU64(static_cast<uint64_t>(a.t.dtype()));
        for (int64_t d : a.t.shape()) h.UpdateU64(static_cast<uint64_t>(d));
        const Digest d = ContentDigest(a.t);
        h.UpdateU64(d[0]);
        h.UpdateU64(d[1]);
      }
      if (a.kind == Attribute::Kind::kGraph && a.g) h.Update(a.g->Fingerprint());
    }
  }
  // Constants in id order so the fingerprint does not depend on hash-map iteration order.
  std::vector<int> ids;
  for (const auto& [id, t] : constants) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int id : ids) {
    const Tensor& t = constants.at(id);
    h.UpdateU64(id);
    h.UpdateU64(static_cast<uint64_t>(t.dtype()));
    h.UpdateU64(t.shape().size());
    for (int64_t d : t.shape()) h.UpdateU64(static_cast<uint64_t>(d));
    auto it = digests.find(id);
    const Digest d = it != digests.end() ? it->second : ContentDigest(t);
    h.UpdateU64(d[0]);
    h.UpdateU64(d[1]);
  }
  return h.Finish().ToHex();
}

GraphBuilder::GraphBuilder(std::string name, int opset) {
  graph_.name = std::move(name);
  graph_.opset = opset;
}

std::string GraphBuilder::Fresh(const std::string& base) { return base + "_" + std::to_string(counter_++); }

ValueRef GraphBuilder::InputDims(const std::string& name, DType dtype, std::vector<Dim> dims) {
  int id = graph_.AddValue(name);
  graph_.inputs.push_back(id);
  ValueInfo vi;
  vi.name = name;
  vi.dtype = dtype;
  vi.has_shape = true;
  vi.dims = std::move(dims);
  graph_.input_infos.push_back(std::move(vi));
  return {id};
}

ValueRef GraphBuilder::Input(const std::string& name, DType dtype, const std::vector<int64_t>& dims) {
  std::vector<Dim> ds;
  for (int64_t d : dims) ds.push_back(Dim{d, d < 0 ? "?" : ""});
  return InputDims(name, dtype, std::move(ds));
}

ValueRef GraphBuilder::Constant(const Tensor& value, const std::string& name) {
  int id = graph_.AddValue(name.empty() ? Fresh("const") : name);
  graph_.constants[id] = value;
  return {id};
}

ValueRef GraphBuilder::Op(const std::string& op_type, const std::vector<ValueRef>& inputs, AttributeMap attrs,
                          const std::string& node_name) {
  return OpMulti(op_type, inputs, 1, std::move(attrs), node_name)[0];
}

std::vector<ValueRef> GraphBuilder::OpMulti(const std::string& op_type, const std::vector<ValueRef>& inputs,
                                            int num_outputs, AttributeMap attrs, const std::string& node_name) {
  Node n;
  n.op_type = op_type;
  n.name = node_name.empty() ? Fresh(op_type) : node_name;
  for (ValueRef v : inputs) n.inputs.push_back(v.id);
  std::vector<ValueRef> outs;
  for (int i = 0; i < num_outputs; ++i) {
    int id = graph_.AddValue(n.name + ":" + std::to_string(i));
    n.outputs.push_back(id);
    outs.push_back({id});
  }
  n.attrs = std::move(attrs);
  graph_.nodes.push_back(std::move(n));
  return outs;
}

void GraphBuilder::Output(ValueRef value, const std::string& name) {
  OSPREY_CHECK(value.id >= 0 && value.id < graph_.num_values());
  if (!name.empty()) graph_.value_names[value.id] = name;
  graph_.outputs.push_back(value.id);
  ValueInfo vi;
  vi.name = graph_.value_names[value.id];
  graph_.output_infos.push_back(vi);
}

Graph GraphBuilder::Finish() {
  Graph g = std::move(graph_);
  graph_ = Graph();
  counter_ = 0;
  g.Validate();
  return g;
}

}  // namespace osprey
