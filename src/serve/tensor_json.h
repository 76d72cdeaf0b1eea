#pragma once
// KServe v2 tensors in JSON (internal to the server): datatype names, body parsing with a nesting limit, and element
// conversion between JSON values and tensors. Every function throws Error kInvalidArgument saying what is wrong.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey::serve {

/// "FP32", "INT64", ... for an osprey dtype.
const char* KServeDType(DType dtype);
/// The osprey dtype for a KServe datatype name; `what` prefixes the error (unknown or unsupported names).
DType ParseKServeDType(const std::string& name, const std::string& what);
/// Declared shape for metadata: symbolic dims as -1 ([-1] when the rank is unknown).
nlohmann::json MetadataShape(const ValueInfo& info);

/// Refuses JSON nested deeper than 64 levels (checked on the text, before any recursive parse).
void CheckJsonDepth(std::string_view text);
/// Parses a request body (an empty body is {} when `allow_empty`); malformed JSON is kInvalidArgument.
nlohmann::json ParseJsonBody(std::string_view text, bool allow_empty);
/// Parses an infer request's JSON. Each inputs[i].data that is an array holding no strings stays out of the DOM (a 64
/// MB body of numbers made a 1 GB one): it is replaced there by a placeholder (IsDataSpan) and its text put in
/// `spans`, for ReadDataSpan to read straight into the tensor once the input's datatype and shape are checked.
nlohmann::json ParseInferJson(std::string_view text, std::vector<std::string_view>* spans);
/// True when `value` is a placeholder of ParseInferJson; its index in the spans in `*index`.
bool IsDataSpan(const nlohmann::json& value, size_t* index);
/// A tensor from a 'data' array's text (nested lists flattened, row-major): the values are counted against the shape
/// before anything is allocated, then converted as SetElement does (range-checked integers, BOOL true/false or
/// integers); malformed JSON or a wrong value is kInvalidArgument naming `what`.
Tensor ReadDataSpan(std::string_view span, DType dtype, const Shape& shape, const std::string& what);
/// A URL's path segment or query part with its %XX escapes decoded (RFC 3986; '+' stays '+'), as clients send model
/// and region names (tritonclient quotes them). A '%' not followed by two hex digits is kInvalidArgument naming `what`.
std::string PercentDecode(std::string_view text, const std::string& what);
/// "a=1&b=%41" -> {a: 1, b: A} (keys and values percent-decoded).
std::map<std::string, std::string> ParseQuery(const std::string& query);
/// A size or offset field `key` (for errors) of value `value`: a non-negative integer.
uint64_t NonNegativeParameter(const nlohmann::json& value, const std::string& what, const char* key);
/// parent["parameters"][key] is the boolean true.
bool ParamTrue(const nlohmann::json& parent, const char* key);

/// Leaves of a (possibly nested) JSON array, row-major. Call only on depth-checked JSON.
void Flatten(const nlohmann::json& value, std::vector<const nlohmann::json*>* out);
/// Stores JSON value `v` as element `i` of `t` (range-checked for integer dtypes; BOOL takes true/false or 0/1).
void SetElement(Tensor* t, int64_t i, const nlohmann::json& v, const std::string& what);
/// The tensor's elements as the text of a flat JSON array: floats in their shortest form that reads back to the same
/// float32 (16-bit ones widened), NaN and infinities as null.
std::string ElementsToJsonText(const Tensor& t);
/// in["shape"]: non-negative integers, rank <= 16, element count without overflow.
Shape ParseShape(const nlohmann::json& in, const std::string& what);
/// The request tensor's datatype and shape against the model's declared input (fixed dims must match).
void CheckAgainstDeclared(const ValueInfo& info, DType dtype, const Shape& shape, const std::string& what);

}  // namespace osprey::serve
