#include "ops/op_registry.h"

#include <algorithm>
#include <sstream>

namespace osprey {

const Tensor& InferContext::Value(int i) const {
  if (i >= num_inputs() || !present[i]) Fail("input " + std::to_string(i) + " is required");
  if (input_values[i] == nullptr)
    throw ValueNotKnown(node.Describe() + ": input " + std::to_string(i) +
                            " must be known when the model is compiled (a constant, or computed from shapes); "
                            "data-dependent shapes are not supported",
                        node.name, i);
  return *input_values[i];
}

void InferContext::SetOutput(int i, DType dtype, Shape shape) {
  if (static_cast<int>(output_dtypes.size()) <= i) {
    output_dtypes.resize(i + 1);
    output_shapes.resize(i + 1);
  }
  // Every computed shape passes the one size rule (tensor.h), so no later count or byte product can wrap.
  try {
    (void)NumBytes(dtype, shape);
  } catch (const Error& e) {
    Fail(std::string("output ") + std::to_string(i) + ": " + e.what());
  }
  output_dtypes[i] = dtype;
  output_shapes[i] = std::move(shape);
}

void InferContext::Fail(const std::string& message) const {
  throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + message);
}

void LoweredWhenCompiled(InferContext& c) {
  throw Error(ErrorCode::kInternal, c.node.Describe() + ": this op is lowered to others before inference");
}

const OpRegistry& OpRegistry::Get() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    RegisterElementwiseOps(r);
    RegisterNnOps(r);
    RegisterEinsumOps(r);
    RegisterGridSampleOps(r);
    RegisterReductionOps(r);
    RegisterShapeOps(r);
    RegisterImageOps(r);
    RegisterAugmentOps(r);
    RegisterInternalOps(r);
    RegisterRecurrentOps(r);
    RegisterControlFlowOps(r);
    RegisterQuantizeOps(r);
    RegisterContribOps(r);
    RegisterSignalOps(r);
    RegisterFoldOps(r);
    RegisterLinalgOps(r);
    RegisterDeformConvOps(r);
    RegisterFunctionOps(r);
    std::sort(r.schemas_.begin(), r.schemas_.end(),
              [](const OpSchema& a, const OpSchema& b) { return a.op_type < b.op_type; });
    return r;
  }();
  return registry;
}

const OpSchema* OpRegistry::Find(const std::string& op_type) const {
  auto it = std::lower_bound(schemas_.begin(), schemas_.end(), op_type,
                             [](const OpSchema& s, const std::string& name) { return s.op_type < name; });
  if (it == schemas_.end() || it->op_type != op_type) return nullptr;
  return &*it;
}

std::vector<std::string> OpRegistry::Names() const {
  std::vector<std::string> names;
  for (const OpSchema& s : schemas_) names.push_back(s.op_type);
  return names;
}

void OpRegistry::Add(OpSchema schema) { schemas_.push_back(std::move(schema)); }

const OpTraits& OpRegistry::TraitsOf(const std::string& op_type) {
  static const OpTraits kNone;
  const OpSchema* schema = Get().Find(op_type);
  return schema ? schema->traits : kNone;
}

int64_t GatherIndex(const Node& node, int64_t v, int64_t dim, int64_t zero_outside) {
  if (zero_outside != 0) {
    if (zero_outside == 2 && v < 0) v += dim;
    return v >= 0 && v < dim ? v : -1;
  }
  if (v < -dim || v >= dim)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": index " + std::to_string(v) +
                                                 " is out of range for an axis of size " + std::to_string(dim));
  return v < 0 ? v + dim : v;
}

int64_t NormalizeAxis(int64_t axis, int64_t rank, const Node& node) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max<int64_t>(rank, 1))
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": axis " + std::to_string(axis) +
                                                 " is out of range for rank " + std::to_string(rank));
  return a;
}

bool BroadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t d = 0; d < from.size(); ++d)
    if (from[d] != 1 && from[d] != to[to.size() - from.size() + d]) return false;
  return true;
}

std::vector<int64_t> TransposePerm(const Node& node, size_t rank) {
  if (node.Has("perm")) return node.GetInts("perm");
  std::vector<int64_t> perm;
  for (size_t d = rank; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  return perm;
}

Shape BroadcastShapes(const Shape& a, const Shape& b, const Node& node) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da == db || db == 1)
      out[i] = da;
    else if (da == 1)
      out[i] = db;
    else
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": shapes " + ShapeToString(a) + " and " +
                                                   ShapeToString(b) + " cannot be broadcast together");
  }
  return out;
}

void ValidateOps(const Graph& graph) {
  std::ostringstream unknown;
  int num_unknown = 0;
  bool nchwc = false;
  const OpRegistry& registry = OpRegistry::Get();
  for (const Node& n : graph.nodes) {
    // ORT's contrib ops (QLinearAdd, QGemm, ...) exist only in com.microsoft; Q/DQ are in both domains.
    const bool contrib_only = IsContribOnlyOp(n.op_type);
    const bool default_or_osprey = n.domain.empty() || n.domain == "ai.onnx" || n.domain == kOspreyDomain;
    const bool known_domain =
        n.domain == kMicrosoftDomain ? IsMicrosoftDomainOp(n.op_type) : default_or_osprey && !contrib_only;
    const OpSchema* schema = known_domain ? registry.Find(n.op_type) : nullptr;
    if (!schema) {
      unknown << (num_unknown++ ? ", " : "") << (n.domain.empty() ? "" : n.domain + ".") << n.op_type << " (node '"
              << n.name << "')";
      nchwc = nchwc || n.domain == "com.microsoft.nchwc";
      continue;
    }
    for (const auto& [key, a] : n.attrs)
      if (a.kind == Attribute::Kind::kGraph && a.g) ValidateOps(*a.g);  // If branches
    int ni = n.NumInputs();
    if (ni < schema->min_inputs || ni > schema->max_inputs)
      throw Error(ErrorCode::kInvalidArgument, n.Describe() + ": expected " + std::to_string(schema->min_inputs) +
                                                   ".." + std::to_string(schema->max_inputs) + " inputs, got " +
                                                   std::to_string(ni));
    int no = static_cast<int>(n.outputs.size());
    if (no < schema->min_outputs || no > schema->max_outputs)
      throw Error(ErrorCode::kInvalidArgument, n.Describe() + ": expected " + std::to_string(schema->min_outputs) +
                                                   ".." + std::to_string(schema->max_outputs) + " outputs, got " +
                                                   std::to_string(no));
  }
  if (num_unknown)
    throw Error(ErrorCode::kUnsupported,
                "model uses " + std::to_string(num_unknown) + " unsupported op(s): " + unknown.str() +
                    (nchwc ? " (ONNX Runtime's NCHWc layout ops, written when it saves a model optimised at "
                             "ORT_ENABLE_ALL for the CPU it ran on; save it at ORT_ENABLE_EXTENDED, or use the "
                             "original)"
                           : ""));
}

}  // namespace osprey
