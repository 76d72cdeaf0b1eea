// KServe v2 tensors in JSON: datatype names, request body parsing (depth-checked), element conversion both ways.
#include "serve/tensor_json.h"

#include <cmath>
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

std::map<std::string, std::string> ParseQuery(const std::string& query) {
  std::map<std::string, std::string> out;
  std::stringstream ss(query);
  std::string item;
  while (std::getline(ss, item, '&')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      out[item] = "";
    else
      out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
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

template <class T>
T IntegerFrom(const json& v, const std::string& what) {
  int64_t x;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw BadRequest(what + ": value " + v.dump() + " is out of range");
      x = static_cast<int64_t>(u);
    } else {
      x = v.get<int64_t>();
    }
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9.2e18) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    throw BadRequest(what + ": expected an integer, found " + v.dump());
  }
  if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      x > static_cast<int64_t>(std::numeric_limits<T>::max()))
    throw BadRequest(what + ": value " + std::to_string(x) + " is out of range");
  return static_cast<T>(x);
}

float FloatFrom(const json& v, const std::string& what) {
  if (!v.is_number()) throw BadRequest(what + ": expected a number, found " + v.dump());
  return static_cast<float>(v.get<double>());
}

void SetElement(Tensor* t, int64_t i, const json& v, const std::string& what) {
  switch (t->dtype()) {
    case DType::kF32:
      t->data<float>()[i] = FloatFrom(v, what);
      break;
    case DType::kF16:
      t->data<uint16_t>()[i] = FloatToHalf(FloatFrom(v, what));
      break;
    case DType::kBF16:
      t->data<uint16_t>()[i] = FloatToBFloat16(FloatFrom(v, what));
      break;
    case DType::kI8:
      t->data<int8_t>()[i] = IntegerFrom<int8_t>(v, what);
      break;
    case DType::kU8:
      t->data<uint8_t>()[i] = IntegerFrom<uint8_t>(v, what);
      break;
    case DType::kI32:
      t->data<int32_t>()[i] = IntegerFrom<int32_t>(v, what);
      break;
    case DType::kI64:
      t->data<int64_t>()[i] = IntegerFrom<int64_t>(v, what);
      break;
    case DType::kBool:
      if (v.is_boolean())
        t->data<bool>()[i] = v.get<bool>();
      else
        t->data<bool>()[i] = IntegerFrom<int64_t>(v, what) != 0;
      break;
  }
}

json ElementsToJson(const Tensor& t) {
  json data = json::array();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::kF32:
        data.push_back(static_cast<double>(t.data<float>()[i]));
        break;
      case DType::kF16:
        data.push_back(static_cast<double>(HalfToFloat(t.data<uint16_t>()[i])));
        break;
      case DType::kBF16:
        data.push_back(static_cast<double>(BFloat16ToFloat(t.data<uint16_t>()[i])));
        break;
      case DType::kI8:
        data.push_back(t.data<int8_t>()[i]);
        break;
      case DType::kU8:
        data.push_back(t.data<uint8_t>()[i]);
        break;
      case DType::kI32:
        data.push_back(t.data<int32_t>()[i]);
        break;
      case DType::kI64:
        data.push_back(t.data<int64_t>()[i]);
        break;
      case DType::kBool:
        data.push_back(t.data<bool>()[i]);
        break;
    }
  }
  return data;
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
