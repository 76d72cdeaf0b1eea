#include "serve/kserve.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "serve/tensor_json.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

Error BadRequest(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }

const ValueInfo* FindInput(const std::vector<ValueInfo>& inputs, const std::string& name) {
  for (const ValueInfo& info : inputs)
    if (info.name == name) return &info;
  return nullptr;
}

std::string InputNames(const std::vector<ValueInfo>& inputs) {
  std::string names;
  for (const ValueInfo& info : inputs) names += (names.empty() ? "'" : ", '") + info.name + "'";
  return names;
}

// parameters.binary_data_size of one request input (KServe binary extension), or -1 when the input has none.
int64_t BinaryDataSize(const json& in, const std::string& what) {
  auto p = in.find("parameters");
  if (p == in.end() || !p->is_object() || !p->contains("binary_data_size")) return -1;
  const json& size = (*p)["binary_data_size"];
  if (size.is_null()) return -1;
  if (NonNegativeParameter(size, what, "binary_data_size") > static_cast<uint64_t>(kMaxBytes))
    throw BadRequest(what + ": 'binary_data_size' " + size.dump() + " is larger than any request body");
  return size.get<int64_t>();
}

// Triton's system shared memory extension: parameters shared_memory_region / _byte_size / _offset of an input or a
// requested output, or nullopt when it names no region.
std::optional<SharedMemoryRef> SharedMemoryParameters(const json& item, const SharedMemoryRegions* regions,
                                                      const std::string& what) {
  auto p = item.find("parameters");
  if (p == item.end() || !p->is_object()) return std::nullopt;
  auto region = p->find("shared_memory_region");
  if (region == p->end() || region->is_null()) return std::nullopt;
  if (!regions)
    throw Error(ErrorCode::kUnsupported,
                what + ": system shared memory is off on this server (start it with --allow-shared-memory)");
  if (!region->is_string()) throw BadRequest(what + ": 'shared_memory_region' must be a string");
  SharedMemoryRef ref;
  ref.region = region->get<std::string>();
  auto size = p->find("shared_memory_byte_size");
  if (size == p->end()) throw BadRequest(what + ": 'shared_memory_region' needs 'shared_memory_byte_size'");
  ref.byte_size = NonNegativeParameter(*size, what, "shared_memory_byte_size");
  if (auto offset = p->find("shared_memory_offset"); offset != p->end())
    ref.offset = NonNegativeParameter(*offset, what, "shared_memory_offset");
  return ref;
}

// The values of one request input's 'data' (nested lists flattened), which must be exactly `count` for `shape`.
std::vector<const json*> DataLeaves(const json& in, const Shape& shape, int64_t count, const std::string& what) {
  auto data = in.find("data");
  if (data == in.end()) throw BadRequest(what + ": needs 'data' or parameters.binary_data_size");
  if (size_t span = 0; IsDataSpan(*data, &span))  // numbers (ParseInferJson), where strings were expected
    throw BadRequest(what + ": 'data' of a BYTES input must hold base64 strings of encoded images");
  std::vector<const json*> leaves;
  if (data->is_array())
    Flatten(*data, &leaves);
  else
    leaves.push_back(&*data);
  if (static_cast<int64_t>(leaves.size()) != count)
    throw BadRequest(what + ": " + std::to_string(leaves.size()) + " values in 'data' for shape " +
                     ShapeToString(shape) + " (" + std::to_string(count) + " elements)");
  return leaves;
}

// --max-batch-size: the rows of an input of rank >= 2 whose declared first dim is variable (a rank-1 input, e.g. token
// ids, is one row; its size is bounded by the body limit).
void CheckRows(const ValueInfo& info, const Shape& shape, const RequestLimits& limits, const std::string& what) {
  if (limits.max_batch_size <= 0 || shape.size() < 2) return;
  const bool variable = !info.has_shape || info.dims.empty() || info.dims[0].value < 0;
  if (variable && shape[0] > limits.max_batch_size)
    throw RequestTooLarge(what + ": " + std::to_string(shape[0]) + " rows (shape " + ShapeToString(shape) +
                          ") is over the server's limit of " + std::to_string(limits.max_batch_size) +
                          " per request (--max-batch-size); split the request");
}

void CheckBoolBytes(const Tensor& t, const std::string& what) {
  if (t.dtype() == DType::kBool)
    for (int64_t i = 0; i < t.numel(); ++i)
      if (reinterpret_cast<const uint8_t*>(t.raw())[i] > 1) throw BadRequest(what + ": BOOL bytes must be 0 or 1");
}

// The bytes of one input from the binary section (binary_data_size given), moved past.
Tensor BinaryInput(DType dtype, const Shape& shape, int64_t size, std::string_view* binary, const std::string& what) {
  const int64_t nbytes = NumBytes(dtype, shape);
  if (size != nbytes)
    throw BadRequest(what + ": binary_data_size " + std::to_string(size) + " does not match shape " +
                     ShapeToString(shape) + " of " + KServeDType(dtype) + " (" + std::to_string(nbytes) + " bytes)");
  if (static_cast<uint64_t>(size) > binary->size())
    throw BadRequest(what + ": binary_data_size " + std::to_string(size) + " but only " +
                     std::to_string(binary->size()) + " bytes of binary data are left in the body");
  Tensor t(dtype, shape);
  if (nbytes) std::memcpy(t.raw(), binary->data(), static_cast<size_t>(nbytes));
  binary->remove_prefix(static_cast<size_t>(size));
  CheckBoolBytes(t, what);
  return t;
}

// An input read from a registered shared memory region (its byte size must be the shape's).
Tensor SharedMemoryInput(DType dtype, const Shape& shape, const SharedMemoryRef& ref,
                         const SharedMemoryRegions& regions, const std::string& what) {
  const int64_t nbytes = NumBytes(dtype, shape);
  if (ref.byte_size != static_cast<uint64_t>(nbytes))
    throw BadRequest(what + ": shared_memory_byte_size " + std::to_string(ref.byte_size) + " does not match shape " +
                     ShapeToString(shape) + " of " + KServeDType(dtype) + " (" + std::to_string(nbytes) + " bytes)");
  regions.CheckRead(ref, what);  // before the tensor is allocated
  Tensor t(dtype, shape);
  if (nbytes) regions.Read(ref, t.raw(), what);
  CheckBoolBytes(t, what);
  return t;
}

// A raw body (Inference-Header-Content-Length: 0) for a model with one input: the bytes fill its declared shape, the
// one variable dim (if any) taking what the byte count gives.
Tensor RawSingleInput(const std::vector<ValueInfo>& model_inputs, const std::string& model, std::string_view binary,
                      const RequestLimits& limits) {
  if (model_inputs.size() != 1)
    throw BadRequest("raw binary request (Inference-Header-Content-Length: 0) needs a model with one input; '" + model +
                     "' has " + std::to_string(model_inputs.size()));
  const ValueInfo& info = model_inputs[0];
  if (!info.has_shape) throw BadRequest("raw binary request: input '" + info.name + "' has no declared shape");
  Shape shape;
  int symbolic = -1;
  int64_t fixed = 1;
  for (size_t i = 0; i < info.dims.size(); ++i) {
    shape.push_back(info.dims[i].value);
    if (info.dims[i].value < 0) {
      if (symbolic >= 0) throw BadRequest("raw binary request: input '" + info.name + "' has several variable dims");
      symbolic = static_cast<int>(i);
    } else {
      fixed = CheckedMul(fixed, std::max<int64_t>(1, info.dims[i].value), "raw binary request: input row");
    }
  }
  const int64_t row_bytes = CheckedMul(fixed, static_cast<int64_t>(DTypeSize(info.dtype)), "raw binary request");
  if (binary.size() % static_cast<uint64_t>(row_bytes) != 0 ||
      (symbolic < 0 && binary.size() != static_cast<uint64_t>(row_bytes)))
    throw BadRequest("raw binary request: " + std::to_string(binary.size()) + " bytes do not fit input '" + info.name +
                     "' " + info.ShapeString() + " of " + KServeDType(info.dtype));
  if (symbolic >= 0) shape[symbolic] = static_cast<int64_t>(binary.size()) / row_bytes;
  CheckRows(info, shape, limits, "raw binary request: input '" + info.name + "'");
  return BinaryInput(info.dtype, shape, static_cast<int64_t>(binary.size()), &binary, "raw binary request");
}

// A BYTES input: encoded images, from shared memory or the binary section (4-byte lengths) or as base64 strings in
// 'data'.
Tensor BytesInput(const ValueInfo& info, const json& in, std::string_view* binary, const RequestLimits& limits,
                  const ImageInputDecoder& images, const std::optional<SharedMemoryRef>& shm,
                  const SharedMemoryRegions* regions, const std::string& what) {
  if (!images)
    throw BadRequest(what + ": BYTES inputs are not accepted here; send the input as " + KServeDType(info.dtype));
  const Shape shape = ParseShape(in, what);
  const int64_t count = NumElements(shape);
  if (count < 1) throw BadRequest(what + ": BYTES input holds no images (shape " + ShapeToString(shape) + ")");
  ImageBudget(limits).CheckCount(count, what);  // before anything is split or decoded
  std::vector<std::string_view> encoded;
  std::vector<std::string> decoded_base64;
  std::string from_shared_memory;
  if (shm) {
    regions->CheckRead(*shm, what);  // before the buffer is allocated
    from_shared_memory.resize(shm->byte_size);
    regions->Read(*shm, from_shared_memory.data(), what);
    encoded = SplitBinaryBytes(from_shared_memory, what, static_cast<size_t>(count));
  } else if (const int64_t size = BinaryDataSize(in, what); size >= 0) {
    if (static_cast<uint64_t>(size) > binary->size())
      throw BadRequest(what + ": binary_data_size " + std::to_string(size) + " but only " +
                       std::to_string(binary->size()) + " bytes of binary data are left in the body");
    encoded = SplitBinaryBytes(binary->substr(0, static_cast<size_t>(size)), what, static_cast<size_t>(count));
    binary->remove_prefix(static_cast<size_t>(size));
  } else {
    const std::vector<const json*> leaves = DataLeaves(in, shape, count, what);
    decoded_base64.reserve(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      const std::string element = what + ": BYTES element " + std::to_string(i);
      if (!leaves[i]->is_string()) throw BadRequest(element + " must be a base64 string of an encoded image");
      decoded_base64.push_back(DecodeBase64(leaves[i]->get_ref<const std::string&>(), element));
    }
    for (const std::string& b : decoded_base64) encoded.emplace_back(b);
  }
  if (static_cast<int64_t>(encoded.size()) != count)
    throw BadRequest(what + ": " + std::to_string(encoded.size()) + " BYTES elements for shape " +
                     ShapeToString(shape) + " (" + std::to_string(count) + " elements)");
  Tensor batch = images(info, encoded, what);
  CheckAgainstDeclared(info, batch.dtype(), batch.shape(), what);
  return batch;
}

}  // namespace

void ImageBudget::CheckCount(int64_t count, const std::string& what) const {
  if (limits_.max_images > 0 && count > limits_.max_images)
    throw RequestTooLarge(what + ": " + std::to_string(count) + " images is over the server's limit of " +
                          std::to_string(limits_.max_images) + " per request (--max-images); split the request");
}

int64_t ImageBudget::PixelsLeft(int64_t per_image) const {
  if (limits_.max_megapixels <= 0) return per_image;
  return std::max<int64_t>(1, std::min(per_image, limits_.max_megapixels * 1'000'000 - spent_));
}

std::string ImageBudget::LimitName() const {
  if (limits_.max_megapixels <= 0) return "";
  return "what is left of this request's " + std::to_string(limits_.max_megapixels) +
         " decoded megapixels (--max-request-megapixels)";
}

std::vector<std::string_view> SplitBinaryBytes(std::string_view data, const std::string& what, size_t max_elements) {
  std::vector<std::string_view> elements;
  while (!data.empty()) {
    if (elements.size() == max_elements)
      throw BadRequest(what + ": more BYTES elements in binary_data_size than the " + std::to_string(max_elements) +
                       " its shape declares");
    if (data.size() < 4)
      throw BadRequest(what + ": BYTES element " + std::to_string(elements.size()) + " has a truncated 4-byte length");
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
    const uint64_t length = uint64_t{p[0]} | uint64_t{p[1]} << 8 | uint64_t{p[2]} << 16 | uint64_t{p[3]} << 24;
    data.remove_prefix(4);
    if (length > data.size())
      throw BadRequest(what + ": BYTES element " + std::to_string(elements.size()) + " declares " +
                       std::to_string(length) + " bytes but " + std::to_string(data.size()) + " are left");
    elements.push_back(data.substr(0, length));
    data.remove_prefix(length);
  }
  return elements;
}

std::string DecodeBase64(std::string_view text, const std::string& what) {
  static const auto kTable = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) throw BadRequest(what + " is not valid base64");
  std::string out;
  out.reserve(text.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int8_t v = kTable[static_cast<unsigned char>(c)];
    if (v < 0) throw BadRequest(what + " is not valid base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

InferRequest DecodeInferRequest(const std::vector<ValueInfo>& model_inputs, const std::string& model,
                                std::string_view body, const std::string& header_length, const RequestLimits& limits,
                                const ImageInputDecoder& images, const SharedMemoryRegions* shared_memory) {
  // Split the body into the JSON header and the binary tensor data that follows it.
  std::string_view json_text = body, binary;
  if (!header_length.empty()) {
    size_t pos = 0;
    long long length = -1;
    try {
      length = std::stoll(header_length, &pos);
    } catch (const std::exception&) {
    }
    if (pos != header_length.size() || length < 0 || static_cast<uint64_t>(length) > body.size())
      throw BadRequest("Inference-Header-Content-Length: expected 0.." + std::to_string(body.size()) + ", found '" +
                       header_length + "'");
    json_text = body.substr(0, static_cast<size_t>(length));
    binary = body.substr(static_cast<size_t>(length));
    if (length == 0) {
      InferRequest request;
      request.inputs[model_inputs.empty() ? "" : model_inputs[0].name] =
          RawSingleInput(model_inputs, model, binary, limits);
      return request;
    }
  }
  if (json_text.empty()) throw BadRequest("malformed request: the infer body is empty (send a JSON object)");
  InferRequest request;
  std::vector<std::string_view> spans;
  request.header = ParseInferJson(json_text, &spans);
  if (!request.header.is_object()) throw BadRequest("malformed request: infer body must be a JSON object");
  auto in_it = request.header.find("inputs");
  if (in_it == request.header.end() || !in_it->is_array() || in_it->empty())
    throw BadRequest("malformed request: 'inputs' must be a non-empty array");
  std::map<std::string, Tensor>& inputs = request.inputs;
  // Parameters osprey acts on; any other is reported (the server logs it) rather than silently dropped.
  auto note_parameters = [&](const json& parent, std::initializer_list<const char*> known, const std::string& where) {
    auto p = parent.find("parameters");
    if (p == parent.end()) return;
    if (!p->is_object()) throw BadRequest("malformed request: " + where + "'parameters' must be an object");
    for (auto item = p->begin(); item != p->end(); ++item) {
      const std::string& key = item.key();
      if (std::none_of(known.begin(), known.end(), [&key](const char* k) { return key == k; }))
        request.ignored_parameters.push_back(where + key);
    }
  };
  note_parameters(request.header, {"binary_data_output", "timeout"}, "");
  if (auto p = request.header.find("parameters"); p != request.header.end() && p->contains("timeout")) {
    const json& timeout = (*p)["timeout"];
    if (!timeout.is_number_integer() || timeout.get<int64_t>() < 0)
      throw BadRequest(
          "malformed request: parameters.timeout must be a whole number of microseconds >= 0 (0 = no "
          "timeout), got " +
          timeout.dump());
    request.timeout_us = timeout.get<int64_t>();
  }
  if (auto out_it = request.header.find("outputs"); out_it != request.header.end() && out_it->is_array())
    for (const json& o : *out_it)
      if (o.is_object() && o.contains("name") && o["name"].is_string())
        note_parameters(o,
                        {"binary_data", "classification", "shared_memory_region", "shared_memory_byte_size",
                         "shared_memory_offset"},
                        "output '" + o["name"].get<std::string>() + "': ");
  for (const json& in : *in_it) {
    if (!in.is_object() || !in.contains("name") || !in["name"].is_string())
      throw BadRequest("malformed request: each input must be an object with a string 'name'");
    const std::string name = in["name"].get<std::string>();
    const std::string what = "input '" + name + "'";
    const ValueInfo* info = FindInput(model_inputs, name);
    if (!info)
      throw BadRequest(what + ": model '" + model + "' has no such input (its inputs: " + InputNames(model_inputs) +
                       ")");
    if (inputs.count(name)) throw BadRequest(what + ": given twice");
    note_parameters(in, {"binary_data_size", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"},
                    what + ": ");
    if (!in.contains("datatype") || !in["datatype"].is_string())
      throw BadRequest(what + ": 'datatype' must be a string");
    const std::optional<SharedMemoryRef> shm = SharedMemoryParameters(in, shared_memory, what);
    if (shm && (in.contains("data") || BinaryDataSize(in, what) >= 0))
      throw BadRequest(what + ": its values come from shared memory, so it takes neither 'data' nor binary_data_size");
    if (in["datatype"].get_ref<const std::string&>() == "BYTES") {
      inputs[name] = BytesInput(*info, in, &binary, limits, images, shm, shared_memory, what);
      continue;
    }
    const DType dtype = ParseKServeDType(in["datatype"].get<std::string>(), what);
    const Shape shape = ParseShape(in, what);
    CheckAgainstDeclared(*info, dtype, shape, what);
    CheckRows(*info, shape, limits, what);
    const int64_t numel = NumElements(shape);
    (void)NumBytes(dtype, shape);  // the size rule, before reading data
    if (shm) {
      inputs[name] = SharedMemoryInput(dtype, shape, *shm, *shared_memory, what);
      continue;
    }
    if (const int64_t size = BinaryDataSize(in, what); size >= 0) {
      inputs[name] = BinaryInput(dtype, shape, size, &binary, what);
      continue;
    }
    if (auto data = in.find("data"); data != in.end()) {
      if (size_t span = 0; IsDataSpan(*data, &span)) {
        if (span >= spans.size())  // the placeholder's form written by a client, not by ParseInferJson
          throw BadRequest(what + ": 'data' is not a valid JSON array of values");
        inputs[name] = ReadDataSpan(spans[span], dtype, shape, what);
        continue;
      }
    }
    const std::vector<const json*> leaves = DataLeaves(in, shape, numel, what);
    Tensor t(dtype, shape);
    for (int64_t i = 0; i < numel; ++i) SetElement(&t, i, *leaves[i], what);
    inputs[name] = t;
  }
  if (!binary.empty())
    throw BadRequest("malformed request: " + std::to_string(binary.size()) +
                     " bytes of binary data after the last binary input");
  for (const ValueInfo& info : model_inputs)
    if (!inputs.count(info.name))
      throw BadRequest("input '" + info.name + "' is missing (model inputs: " + InputNames(model_inputs) + ")");
  return request;
}

namespace {

// Triton's classification strings for `t` ([C] or [B, C]): the top `count` of each row, "score:index[:label]".
ResponseOutput Classification(const std::string& name, const Tensor& t, int64_t count,
                              const std::vector<std::string>& labels) {
  if (t.rank() < 1 || t.rank() > 2 || t.dtype() == DType::kBool)
    throw BadRequest("output '" + name + "': classification needs a numeric output of rank 1 or 2, found " +
                     std::string(DTypeName(t.dtype())) + " " + ShapeToString(t.shape()));
  const int64_t rows = t.rank() == 2 ? t.dim(0) : 1, classes = t.dim(-1);
  const int64_t n = std::min(count, classes);
  ResponseOutput out;
  out.name = name;
  out.datatype = "BYTES";
  out.shape = t.rank() == 2 ? Shape{rows, n} : Shape{n};
  std::vector<int64_t> order(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < classes; ++c) order[static_cast<size_t>(c)] = c;
    auto score = [&](int64_t c) { return t.GetAsDouble(r * classes + c); };
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int64_t a, int64_t b) {
      return score(a) > score(b) || (score(a) == score(b) && a < b);
    });
    for (int64_t k = 0; k < n; ++k) {
      const int64_t c = order[static_cast<size_t>(k)];
      std::string text = std::to_string(score(c)) + ":" + std::to_string(c);
      if (static_cast<size_t>(c) < labels.size()) text += ":" + labels[static_cast<size_t>(c)];
      out.strings.push_back(std::move(text));
    }
  }
  return out;
}

}  // namespace

void AppendBinaryBytes(std::string* out, std::string_view element) {
  const uint32_t n = static_cast<uint32_t>(element.size());
  const char length[4] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                          static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  out->append(length, 4);
  out->append(element);
}

std::vector<ResponseOutput> SelectOutputs(const json& request_header, const std::string& model,
                                          const std::vector<std::pair<std::string, Tensor>>& results,
                                          const std::vector<std::string>& labels,
                                          const SharedMemoryRegions* shared_memory) {
  const bool binary_default = ParamTrue(request_header, "binary_data_output");
  auto make = [&](size_t index, bool binary, int64_t classification, const std::optional<SharedMemoryRef>& shm) {
    const auto& [name, t] = results[index];
    ResponseOutput out = classification > 0 ? Classification(name, t, classification, labels) : ResponseOutput{};
    if (classification <= 0) {
      out.name = name;
      out.datatype = KServeDType(t.dtype());
      out.shape = t.shape();
      out.tensor = t;
    }
    out.binary = binary;
    if (shm) {
      const std::string what = "output '" + name + "'";
      if (out.datatype == "BYTES") {
        std::string bytes;
        for (const std::string& s : out.strings) AppendBinaryBytes(&bytes, s);
        shared_memory->Write(*shm, bytes.data(), bytes.size(), what);
      } else {
        shared_memory->Write(*shm, out.tensor.raw(), out.tensor.nbytes(), what);
      }
      out.shared_memory = shm;
    }
    return out;
  };
  std::vector<ResponseOutput> chosen;
  auto out_it = request_header.find("outputs");
  if (out_it == request_header.end()) {
    for (size_t i = 0; i < results.size(); ++i) chosen.push_back(make(i, binary_default, 0, std::nullopt));
    return chosen;
  }
  if (!out_it->is_array()) throw BadRequest("malformed request: 'outputs' must be an array");
  for (const json& o : *out_it) {
    if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
      throw BadRequest("malformed request: each requested output must be an object with a string 'name'");
    const std::string name = o["name"].get<std::string>();
    size_t index = results.size();
    for (size_t i = 0; i < results.size(); ++i)
      if (results[i].first == name) index = i;
    if (index == results.size()) throw BadRequest("output '" + name + "': model '" + model + "' has no such output");
    bool as_binary = binary_default;
    int64_t classification = 0;
    if (auto p = o.find("parameters"); p != o.end() && p->is_object()) {
      if (p->contains("binary_data")) {
        if (!(*p)["binary_data"].is_boolean()) throw BadRequest("output '" + name + "': binary_data must be a boolean");
        as_binary = (*p)["binary_data"].get<bool>();
      }
      if (p->contains("classification")) {
        const json& c = (*p)["classification"];
        if (!c.is_number_integer() || c.get<int64_t>() < 1 || c.get<int64_t>() > 100000)
          throw BadRequest("output '" + name + "': classification must be a class count in 1..100000, found " +
                           c.dump());
        classification = c.get<int64_t>();
      }
    }
    chosen.push_back(
        make(index, as_binary, classification, SharedMemoryParameters(o, shared_memory, "output '" + name + "'")));
  }
  return chosen;
}

InferResponse EncodeInferResponse(const json& request_header, const std::string& model, const std::string& version,
                                  const std::vector<ResponseOutput>& chosen) {
  json outputs = json::array();
  std::string binary_out;
  bool any_binary = false;
  // Numeric 'data' is written as text (ElementsToJsonText) and put in place of a marker after the document is dumped:
  // a million floats as a JSON document cost 16+ bytes and an allocation each. A marker cannot occur elsewhere in
  // the dump: any quote inside a string there is escaped.
  std::vector<std::string> data_texts;
  auto marker = [](size_t k) { return "osprey.data." + std::to_string(k); };
  for (const ResponseOutput& out : chosen) {
    json o = {{"name", out.name}, {"datatype", out.datatype}, {"shape", out.shape}};
    if (out.shared_memory) {
      // written there by SelectOutputs
    } else if (out.binary) {
      any_binary = true;
      const size_t before = binary_out.size();
      if (out.datatype == "BYTES") {
        for (const std::string& text : out.strings) AppendBinaryBytes(&binary_out, text);
      } else {
        binary_out.append(static_cast<const char*>(out.tensor.raw()), out.tensor.nbytes());
      }
      o["parameters"] = {{"binary_data_size", binary_out.size() - before}};
    } else if (out.datatype == "BYTES") {
      o["data"] = out.strings;
    } else {
      o["data"] = marker(data_texts.size());
      data_texts.push_back(ElementsToJsonText(out.tensor));
    }
    outputs.push_back(std::move(o));
  }
  json answer = {{"model_name", model}, {"model_version", version}, {"outputs", outputs}};
  if (auto id = request_header.find("id"); id != request_header.end()) answer["id"] = *id;
  InferResponse response;
  response.body = answer.dump(-1, ' ', false, json::error_handler_t::replace);
  if (!data_texts.empty()) {
    std::string dumped = std::move(response.body);
    size_t from = 0, total = dumped.size();
    for (const std::string& text : data_texts) total += text.size();
    response.body.clear();
    response.body.reserve(total);
    for (size_t k = 0; k < data_texts.size(); ++k) {
      const std::string quoted = "\"" + marker(k) + "\"";
      const size_t at = dumped.find(quoted, from);
      OSPREY_CHECK(at != std::string::npos);
      response.body.append(dumped, from, at - from);
      response.body += data_texts[k];
      from = at + quoted.size();
    }
    response.body.append(dumped, from);
  }
  if (any_binary) {
    response.header_length = static_cast<int64_t>(response.body.size());
    response.body += binary_out;
  }
  return response;
}

}  // namespace osprey::serve
