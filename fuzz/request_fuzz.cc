// libFuzzer target: KServe v2 infer request decoding (src/serve/tensor_json.h) on arbitrary bytes must either produce
// tensors or throw osprey::Error. The input is a request body; its first byte chooses the framing: even = JSON only,
// odd = binary tensor extension with the next two bytes as Inference-Header-Content-Length (JSON header, then the
// binary tensor data). The model's inputs are fixed: x FP32 [N, 3], mask BOOL [N], ids INT64 (no declared shape) and
// h FP16 [2, 2].
// Mirrors the decoding in server.cc's Infer (which needs a loaded model); keep the two in step.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "osprey/error.h"
#include "serve/tensor_json.h"

namespace {

using osprey::DType;
using osprey::Error;
using osprey::ErrorCode;
using osprey::Shape;
using osprey::Tensor;
using osprey::ValueInfo;
using json = nlohmann::json;

std::vector<ValueInfo> MakeInputs() {
  std::vector<ValueInfo> v(4);
  v[0].name = "x", v[0].dtype = DType::kF32, v[0].has_shape = true, v[0].dims = {{-1, "N"}, {3, ""}};
  v[1].name = "mask", v[1].dtype = DType::kBool, v[1].has_shape = true, v[1].dims = {{-1, "N"}};
  v[2].name = "ids", v[2].dtype = DType::kI64, v[2].has_shape = false;
  v[3].name = "h", v[3].dtype = DType::kF16, v[3].has_shape = true, v[3].dims = {{2, ""}, {2, ""}};
  return v;
}

Error Bad(const std::string& m) { return Error(ErrorCode::kInvalidArgument, m); }

void Decode(std::string_view json_text, std::string_view binary) {
  static const std::vector<ValueInfo> kInputs = MakeInputs();
  const json request = osprey::serve::ParseJsonBody(json_text, false);
  if (!request.is_object()) throw Bad("not an object");
  (void)osprey::serve::ParamTrue(request, "binary_data_output");
  auto in_it = request.find("inputs");
  if (in_it == request.end() || !in_it->is_array() || in_it->empty()) throw Bad("no inputs");
  std::map<std::string, Tensor> inputs;
  for (const json& in : *in_it) {
    if (!in.is_object() || !in.contains("name") || !in["name"].is_string()) throw Bad("input without name");
    const std::string name = in["name"].get<std::string>();
    const ValueInfo* info = nullptr;
    for (const ValueInfo& v : kInputs)
      if (v.name == name) info = &v;
    if (!info || inputs.count(name)) throw Bad("unknown or repeated input");
    if (!in.contains("datatype") || !in["datatype"].is_string()) throw Bad("datatype");
    const DType dtype = osprey::serve::ParseKServeDType(in["datatype"].get<std::string>(), name);
    const Shape shape = osprey::serve::ParseShape(in, name);
    osprey::serve::CheckAgainstDeclared(*info, dtype, shape, name);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (numel > (1 << 20)) throw Bad("too large for the fuzzer");  // the server's body limit plays this role
    const uint64_t nbytes = static_cast<uint64_t>(numel) * osprey::DTypeSize(dtype);
    if (auto p = in.find("parameters"); p != in.end() && p->is_object() && p->contains("binary_data_size")) {
      const json& size_json = (*p)["binary_data_size"];
      if (!size_json.is_number_unsigned()) throw Bad("binary_data_size");
      const uint64_t size = size_json.get<uint64_t>();
      if (size != nbytes || size > binary.size()) throw Bad("binary_data_size mismatch");
      Tensor t(dtype, shape);
      if (nbytes) std::memcpy(t.raw(), binary.data(), nbytes);
      binary.remove_prefix(size);
      inputs[name] = t;
      continue;
    }
    auto data = in.find("data");
    if (data == in.end()) throw Bad("no data");
    std::vector<const json*> leaves;
    if (data->is_array())
      osprey::serve::Flatten(*data, &leaves);
    else
      leaves.push_back(&*data);
    if (static_cast<int64_t>(leaves.size()) != numel) throw Bad("element count");
    Tensor t(dtype, shape);
    for (int64_t i = 0; i < numel; ++i) osprey::serve::SetElement(&t, i, *leaves[i], name);
    inputs[name] = t;
  }
  // Encode what was decoded, as the response path does.
  for (const auto& [name, t] : inputs) {
    json out = {{"name", name}, {"datatype", osprey::serve::KServeDType(t.dtype())}, {"shape", t.shape()},
                {"data", osprey::serve::ElementsToJson(t)}};
    (void)out.dump();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string_view json_text = body, binary;
  if (data[0] & 1) {
    if (body.size() < 2) return 0;
    const size_t header_length =
        static_cast<uint8_t>(body[0]) | (static_cast<size_t>(static_cast<uint8_t>(body[1])) << 8);
    body.remove_prefix(2);
    if (header_length > body.size()) return 0;
    json_text = body.substr(0, header_length);
    binary = body.substr(header_length);
  }
  try {
    Decode(json_text, binary);
  } catch (const osprey::Error&) {
  }
  try {
    (void)osprey::serve::ParseQuery(std::string(json_text.substr(0, 256)));
  } catch (const osprey::Error&) {
  }
  return 0;
}
