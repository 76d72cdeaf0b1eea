#pragma once
// Attribute checks shared by op schemas (image.cc, augment_ops.cc): each failure names the attribute and the node.
#include <cmath>
#include <string>
#include <vector>

#include "ops/op_registry.h"

namespace osprey::schema {

inline std::string Str(int64_t v) { return std::to_string(v); }

/// Throws kInvalidArgument "<node>: <message>" (for resolvers shared by a schema and its kernel, which have a node
/// but no InferContext).
[[noreturn]] inline void FailNode(const Node& node, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + message);
}

/// Attribute `name` with `count` values (`fill` each when absent), each >= `min`.
inline std::vector<int64_t> IntsAttr(const Node& node, const char* name, size_t count, int64_t fill, int64_t min) {
  std::vector<int64_t> v = node.Has(name) ? node.GetInts(name) : std::vector<int64_t>(count, fill);
  if (v.size() != count)
    FailNode(node, std::string(name) + " must have " + Str(static_cast<int64_t>(count)) + " values");
  for (int64_t e : v)
    if (e < min) FailNode(node, std::string(name) + " must be >= " + Str(min) + ", got " + ShapeToString(v));
  return v;
}

/// ONNX TensorProto.DataType code (attribute `attr`: Cast's `to`, EyeLike's `dtype`, ...) -> osprey dtype. A code
/// that is no ONNX dtype fails kInvalidArgument; one osprey does not compute is kUnsupported, named.
DType DTypeFromOnnxCode(const InferContext& ctx, int64_t code, const char* attr = "to");

/// Largest output dim an image op may produce; keeps H * W * C well inside int64 and stops typos like
/// height=1000000000 from asking for terabytes.
constexpr int64_t kMaxImageDim = int64_t{1} << 20;

inline int64_t RequiredInt(const InferContext& ctx, const std::string& name) {
  if (!ctx.node.Has(name)) ctx.Fail("attribute '" + name + "' is required");
  return ctx.node.GetInt(name, 0);
}

inline int64_t IntInRange(const InferContext& ctx, const std::string& name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    ctx.Fail("attribute '" + name + "' must be in [" + Str(lo) + ", " + Str(hi) + "], got " + Str(value));
  return value;
}

inline float FiniteFloat(const InferContext& ctx, const std::string& name, float value) {
  if (!std::isfinite(value)) ctx.Fail("attribute '" + name + "' must be finite, got " + std::to_string(value));
  return value;
}

inline std::string OneOf(const InferContext& ctx, const std::string& name, const std::string& value,
                         const std::vector<std::string>& allowed) {
  std::string list;
  for (const std::string& a : allowed) {
    if (a == value) return value;
    list += (list.empty() ? "\"" : ", \"") + a + "\"";
  }
  ctx.Fail("attribute '" + name + "' must be one of " + list + ", got \"" + value + "\"");
}

}  // namespace osprey::schema
