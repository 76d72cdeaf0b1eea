// KServe v2 tensors in JSON: datatype names, request body parsing (depth-checked), element conversion both ways.
#include "serve/tensor_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

#include "osprey/error.h"

namespace osprey::serve {

using json = nlohmann::json;

namespace {
Error BadRequest(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }
}  // namespace

struct DTypeNames {
  DType dtype;
  const char* kserve;
};
constexpr DTypeNames kDTypes[] = {{DType::kF32, "FP32"},  {DType::kF16, "FP16"}, {DType::kBF16, "BF16"},
                                  {DType::kI8, "INT8"},   {DType::kU8, "UINT8"}, {DType::kI32, "INT32"},
                                  {DType::kI64, "INT64"}, {DType::kBool, "BOOL"}};

const char* KServeDType(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.kserve;
  return "UNKNOWN";
}

DType ParseKServeDType(const std::string& name, const std::string& what) {
  for (const auto& d : kDTypes)
    if (name == d.kserve) return d.dtype;
  static const char* kKnownUnsupported[] = {"UINT16", "UINT32", "UINT64", "INT16", "FP64", "BYTES"};
  for (const char* n : kKnownUnsupported)
    if (name == n) throw BadRequest(what + ": datatype " + name + " is not supported by osprey models");
  throw BadRequest(what + ": unknown datatype '" + name +
                   "' (expected one of BOOL, UINT8, INT8, INT32, INT64, FP16, BF16, FP32)");
}

json MetadataShape(const ValueInfo& info) {
  json shape = json::array();
  if (!info.has_shape) return json::array({-1});
  for (const Dim& d : info.dims) shape.push_back(d.value >= 0 ? d.value : -1);
  return shape;
}

// ---------------------------------------------------------------------------------------------------------------
// Request parsing helpers

// Nesting deeper than this is refused before parsing, so no recursive walk (parse, flatten, dump) can run deep.
constexpr int kMaxJsonDepth = 64;

void CheckJsonDepth(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) throw BadRequest("malformed request: JSON nested deeper than 64 levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

json ParseJsonBody(std::string_view text, bool allow_empty) {
  if (allow_empty && text.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  CheckJsonDepth(text);
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) throw BadRequest("malformed request: body is not valid JSON");
  return j;
}

// ---------------------------------------------------------------------------------------------------------------
// Numeric 'data' arrays of infer requests, read from the text into the tensor (see ParseInferJson in the header).

namespace {

constexpr const char* kSpanKey = "osprey.data_span";

size_t SkipSpace(std::string_view t, size_t i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) ++i;
  return i;
}

// The end of the string starting at t[i] == '"', or npos.
size_t SkipString(std::string_view t, size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\')
      ++i;
    else if (t[i] == '"')
      return i + 1;
  }
  return std::string_view::npos;
}

size_t SkipValue(std::string_view t, size_t i);

// Walks the object at t[i] == '{': member(key_text, value_begin) returns the value's end (npos: malformed). Returns
// the object's end, or npos when malformed. Each value is walked once, by the callback.
template <class F>
size_t ForEachMember(std::string_view t, size_t i, F&& member) {
  i = SkipSpace(t, i + 1);
  if (i < t.size() && t[i] == '}') return i + 1;
  for (;;) {
    if (i >= t.size() || t[i] != '"') return std::string_view::npos;
    const size_t key_end = SkipString(t, i);
    if (key_end == std::string_view::npos) return key_end;
    const std::string_view key = t.substr(i + 1, key_end - i - 2);
    i = SkipSpace(t, key_end);
    if (i >= t.size() || t[i] != ':') return std::string_view::npos;
    i = member(key, SkipSpace(t, i + 1));
    if (i == std::string_view::npos) return i;
    i = SkipSpace(t, i);
    if (i >= t.size()) return std::string_view::npos;
    if (t[i] == '}') return i + 1;
    if (t[i] != ',') return std::string_view::npos;
    i = SkipSpace(t, i + 1);
  }
}

// Same for the array at t[i] == '[': element(value_begin) returns the element's end.
template <class F>
size_t ForEachElement(std::string_view t, size_t i, F&& element) {
  i = SkipSpace(t, i + 1);
  if (i < t.size() && t[i] == ']') return i + 1;
  for (;;) {
    i = element(i);
    if (i == std::string_view::npos) return i;
    i = SkipSpace(t, i);
    if (i >= t.size()) return std::string_view::npos;
    if (t[i] == ']') return i + 1;
    if (t[i] != ',') return std::string_view::npos;
    i = SkipSpace(t, i + 1);
  }
}

// The end of the JSON value starting at t[i] (not validated: the DOM parse or ReadDataSpan does that), or npos.
// Recursion is bounded by CheckJsonDepth, run first.
size_t SkipValue(std::string_view t, size_t i) {
  if (i >= t.size()) return std::string_view::npos;
  if (t[i] == '"') return SkipString(t, i);
  if (t[i] == '{') return ForEachMember(t, i, [&](std::string_view, size_t b) { return SkipValue(t, b); });
  if (t[i] != '[') {  // a literal
    while (i < t.size() && t[i] != ',' && t[i] != ']' && t[i] != '}' && t[i] != ' ' && t[i] != '\t' && t[i] != '\n' &&
           t[i] != '\r')
      ++i;
    return i;
  }
  int depth = 0;  // an array of literals only (a tensor's data): match the brackets in one pass
  for (size_t j = i; j < t.size(); ++j) {
    const char c = t[j];
    if (c == '"' || c == '{') break;  // strings or objects inside: element by element
    if (c == '[') ++depth;
    if (c == ']' && --depth == 0) return j + 1;
  }
  return ForEachElement(t, i, [&](size_t b) { return SkipValue(t, b); });
}

// A number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool IsJsonNumber(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0')
    ++i;
  else if (!digits())
    return false;
  if (i < s.size() && s[i] == '.' && (++i, !digits())) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

// Calls leaf(token) for each leaf of the JSON array `span` (nested lists flattened, row-major); false when `span` is
// not an array of literals (strings are not accepted: such data stays in the DOM).
template <class F>
bool ForEachLeaf(std::string_view span, F&& leaf) {
  size_t i = SkipSpace(span, 0);
  int depth = 0;
  for (;;) {
    // A value.
    if (i >= span.size()) return false;
    if (span[i] == '[') {
      ++depth;
      i = SkipSpace(span, i + 1);
      if (i < span.size() && span[i] == ']') {
        --depth;
        ++i;
      } else {
        continue;
      }
    } else {
      if (depth == 0) return false;  // the span is an array
      const size_t from = i;
      while (i < span.size() && span[i] != ',' && span[i] != ']' && span[i] != ' ' && span[i] != '\t' &&
             span[i] != '\n' && span[i] != '\r')
        ++i;
      if (i == from) return false;
      leaf(span.substr(from, i - from));
    }
    // After a value: close arrays, then a comma or the end.
    for (;;) {
      i = SkipSpace(span, i);
      if (depth == 0) return i == span.size();
      if (i < span.size() && span[i] == ']') {
        --depth;
        ++i;
        continue;
      }
      break;
    }
    if (i >= span.size() || span[i] != ',') return false;
    i = SkipSpace(span, i + 1);
  }
}

std::string Quoted(std::string_view token) {
  return token.size() > 40 ? std::string(token.substr(0, 40)) + "..." : std::string(token);
}

double NumberFrom(std::string_view token, const std::string& what) {
  double v = 0;
  if (!IsJsonNumber(token)) throw BadRequest(what + ": expected a number, found " + Quoted(token));
  // Out of double's range from_chars stores nothing; strtod gives what JSON parsers give: +-inf, or 0 (or a
  // denormal) when too small.
  if (std::from_chars(token.data(), token.data() + token.size(), v).ec != std::errc())
    v = std::strtod(std::string(token).c_str(), nullptr);
  return v;
}

template <class T>
T IntegerFromToken(std::string_view token, const std::string& what) {
  if (!IsJsonNumber(token)) throw BadRequest(what + ": expected an integer, found " + Quoted(token));
  int64_t x = 0;
  if (token.find_first_of(".eE") == std::string_view::npos) {
    if (std::from_chars(token.data(), token.data() + token.size(), x).ec != std::errc())
      throw BadRequest(what + ": value " + Quoted(token) + " is out of range");
  } else {
    double d = 0;
    if (std::from_chars(token.data(), token.data() + token.size(), d).ec != std::errc())  // 1e400, 1e-400
      throw BadRequest(what + ": value " + Quoted(token) + " is out of range");
    if (std::floor(d) != d || std::fabs(d) >= 9.2e18)
      throw BadRequest(what + ": expected an integer, found " + Quoted(token));
    x = static_cast<int64_t>(d);
  }
  if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      x > static_cast<int64_t>(std::numeric_limits<T>::max()))
    throw BadRequest(what + ": value " + std::to_string(x) + " is out of range");
  return static_cast<T>(x);
}

// Element `i` of `t` from a JSON literal's text (range-checked integers; BOOL takes true/false or integers).
void StoreToken(Tensor* t, int64_t i, std::string_view token, const std::string& what) {
  switch (t->dtype()) {
    case DType::kF32:
      t->data<float>()[i] = static_cast<float>(NumberFrom(token, what));
      break;
    case DType::kF16:
      t->data<uint16_t>()[i] = FloatToHalf(static_cast<float>(NumberFrom(token, what)));
      break;
    case DType::kBF16:
      t->data<uint16_t>()[i] = FloatToBFloat16(static_cast<float>(NumberFrom(token, what)));
      break;
    case DType::kI8:
      t->data<int8_t>()[i] = IntegerFromToken<int8_t>(token, what);
      break;
    case DType::kU8:
      t->data<uint8_t>()[i] = IntegerFromToken<uint8_t>(token, what);
      break;
    case DType::kI32:
      t->data<int32_t>()[i] = IntegerFromToken<int32_t>(token, what);
      break;
    case DType::kI64:
      t->data<int64_t>()[i] = IntegerFromToken<int64_t>(token, what);
      break;
    case DType::kBool:
      t->data<bool>()[i] = token == "true" || (token != "false" && IntegerFromToken<int64_t>(token, what) != 0);
      break;
  }
}

}  // namespace

json ParseInferJson(std::string_view text, std::vector<std::string_view>* spans) {
  spans->clear();
  CheckJsonDepth(text);
  const size_t root = SkipSpace(text, 0);
  std::vector<std::pair<size_t, size_t>> cut;  // [begin, end) of each numeric 'data' array
  if (root < text.size() && text[root] == '{') {
    ForEachMember(text, root, [&](std::string_view key, size_t begin) {
      if (key != "inputs" || begin >= text.size() || text[begin] != '[') return SkipValue(text, begin);
      return ForEachElement(text, begin, [&](size_t input) {
        if (input >= text.size() || text[input] != '{') return SkipValue(text, input);
        return ForEachMember(text, input, [&](std::string_view k, size_t b) {
          const size_t e = SkipValue(text, b);  // npos when b is past the end
          if (k == "data" && e != std::string_view::npos && text[b] == '[' &&
              text.substr(b, e - b).find('"') == std::string_view::npos)
            cut.emplace_back(b, e);
          return e;
        });
      });
    });
  }
  if (cut.empty()) return ParseJsonBody(text, false);
  std::string rest;
  size_t from = 0;
  for (const auto& [b, e] : cut) {
    rest.append(text.substr(from, b - from));
    rest += "{\"" + std::string(kSpanKey) + "\":" + std::to_string(spans->size()) + "}";
    spans->push_back(text.substr(b, e - b));
    from = e;
  }
  rest.append(text.substr(from));
  return ParseJsonBody(rest, false);
}

bool IsDataSpan(const json& value, size_t* index) {
  if (!value.is_object() || value.size() != 1) return false;
  auto it = value.find(kSpanKey);
  if (it == value.end() || !it->is_number_unsigned()) return false;
  *index = it->get<size_t>();
  return true;
}

Tensor ReadDataSpan(std::string_view span, DType dtype, const Shape& shape, const std::string& what) {
  int64_t count = 0;
  if (!ForEachLeaf(span, [&](std::string_view) { ++count; }))
    throw BadRequest(what + ": 'data' is not a valid JSON array of values");
  if (count != NumElements(shape))
    throw BadRequest(what + ": " + std::to_string(count) + " values in 'data' for shape " + ShapeToString(shape) +
                     " (" + std::to_string(NumElements(shape)) + " elements)");
  Tensor out(dtype, shape);  // after the count: its size is bounded by the body's
  int64_t i = 0;
  ForEachLeaf(span, [&](std::string_view token) { StoreToken(&out, i++, token, what); });
  return out;
}

std::string PercentDecode(std::string_view text, const std::string& what) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const int a = i + 1 < text.size() ? hex(text[i + 1]) : -1;
    const int b = i + 2 < text.size() ? hex(text[i + 2]) : -1;
    if (a < 0 || b < 0) {
      const std::string shown(text.substr(0, 200));
      throw Error(ErrorCode::kInvalidArgument,
                  what + ": '%' must be followed by two hex digits (percent-encoding), in '" + shown + "'");
    }
    out += static_cast<char>(a * 16 + b);
    i += 2;
  }
  return out;
}

std::map<std::string, std::string> ParseQuery(const std::string& query) {
  std::map<std::string, std::string> out;
  std::stringstream ss(query);
  std::string item;
  while (std::getline(ss, item, '&')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      out[PercentDecode(item, "query")] = "";
    else
      out[PercentDecode(std::string_view(item).substr(0, eq), "query")] =
          PercentDecode(std::string_view(item).substr(eq + 1), "query");
  }
  return out;
}

uint64_t NonNegativeParameter(const json& value, const std::string& what, const char* key) {
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0))
    throw Error(ErrorCode::kInvalidArgument, what + ": '" + key + "' must be a non-negative integer");
  return value.get<uint64_t>();
}

bool ParamTrue(const json& parent, const char* key) {
  if (!parent.is_object()) return false;
  auto params = parent.find("parameters");
  if (params == parent.end() || !params->is_object()) return false;
  auto v = params->find(key);
  return v != params->end() && v->is_boolean() && v->get<bool>();
}

// Leaves of a (possibly nested) JSON array in row-major order.
void Flatten(const json& value, std::vector<const json*>* out) {
  if (value.is_array()) {
    for (const json& item : value) Flatten(item, out);
  } else {
    out->push_back(&value);
  }
}

void SetElement(Tensor* t, int64_t i, const json& v, const std::string& what) {
  StoreToken(t, i, v.dump(), what);  // the literal's text, as in ReadDataSpan (only scalars and odd bodies come here)
}

namespace {
// One element as JSON text: floats in the shortest form that reads back to the same float (16-bit ones widened), NaN
// and infinities as null (JSON has neither), as nlohmann::json writes them.
void AppendElement(std::string* out, const Tensor& t, int64_t i) {
  char buf[32];
  std::to_chars_result r{buf, std::errc()};
  auto real = [&](float v) {
    if (!std::isfinite(v)) {
      out->append("null");
      r.ptr = buf;
    } else {
      r = std::to_chars(buf, buf + sizeof(buf), v);
    }
  };
  switch (t.dtype()) {
    case DType::kF32:
      real(t.data<float>()[i]);
      break;
    case DType::kF16:
      real(HalfToFloat(t.data<uint16_t>()[i]));
      break;
    case DType::kBF16:
      real(BFloat16ToFloat(t.data<uint16_t>()[i]));
      break;
    case DType::kI8:
      r = std::to_chars(buf, buf + sizeof(buf), int{t.data<int8_t>()[i]});
      break;
    case DType::kU8:
      r = std::to_chars(buf, buf + sizeof(buf), int{t.data<uint8_t>()[i]});
      break;
    case DType::kI32:
      r = std::to_chars(buf, buf + sizeof(buf), t.data<int32_t>()[i]);
      break;
    case DType::kI64:
      r = std::to_chars(buf, buf + sizeof(buf), t.data<int64_t>()[i]);
      break;
    case DType::kBool:
      out->append(t.data<bool>()[i] ? "true" : "false");
      break;
  }
  out->append(buf, r.ptr);
}
}  // namespace

std::string ElementsToJsonText(const Tensor& t) {
  std::string out = "[";
  const int64_t n = t.numel();
  out.reserve(static_cast<size_t>(n) * 12 + 2);
  for (int64_t i = 0; i < n; ++i) {
    if (i) out += ',';
    AppendElement(&out, t, i);
  }
  out += ']';
  return out;
}

Shape ParseShape(const json& in, const std::string& what) {
  auto it = in.find("shape");
  if (it == in.end() || !it->is_array()) throw BadRequest(what + ": 'shape' must be an array of integers");
  Shape shape;
  for (const json& d : *it) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw BadRequest(what + ": 'shape' must hold non-negative integers, found " + d.dump());
    shape.push_back(d.get<int64_t>());
  }
  if (shape.size() > 16) throw BadRequest(what + ": rank " + std::to_string(shape.size()) + " is larger than 16");
  NumElements(shape);  // throws on overflow
  return shape;
}

// Checks a request tensor against the model's declared input (name found by the caller).
void CheckAgainstDeclared(const ValueInfo& info, DType dtype, const Shape& shape, const std::string& what) {
  if (dtype != info.dtype)
    throw BadRequest(what + ": datatype " + KServeDType(dtype) + " does not match the model's " +
                     KServeDType(info.dtype));
  if (!info.has_shape) return;
  if (shape.size() != info.dims.size())
    throw BadRequest(what + ": shape " + ShapeToString(shape) + " does not match the model's " + info.ShapeString() +
                     " (rank " + std::to_string(info.dims.size()) + ")");
  for (size_t i = 0; i < shape.size(); ++i)
    if (info.dims[i].value >= 0 && info.dims[i].value != shape[i])
      throw BadRequest(what + ": shape " + ShapeToString(shape) + " does not match the model's " + info.ShapeString());
}

}  // namespace osprey::serve
