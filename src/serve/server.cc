#include "serve/server.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "osprey/classify.h"
#include "osprey/error.h"
#include "osprey/image.h"
#include "serve/multipart.h"
#include "serve/prometheus.h"
#include "serve/tensor_json.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// Answers

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse ErrorResponse(int status, const std::string& message) {
  return JsonResponse(status, {{"error", message}});
}

int StatusForError(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupported:
      return 400;
    case ErrorCode::kNotFound:
      return 404;
    case ErrorCode::kResourceExhausted:
    case ErrorCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

Error BadRequest(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }

const ValueInfo* FindInput(const Graph& graph, const std::string& name) {
  for (const ValueInfo& info : graph.input_infos)
    if (info.name == name) return &info;
  return nullptr;
}

std::string InputNames(const Graph& graph) {
  std::string names;
  for (const ValueInfo& info : graph.input_infos) names += (names.empty() ? "'" : ", '") + info.name + "'";
  return names;
}

// Strict standard base64 (RFC 4648 alphabet, '=' padding optional at the end); nullopt when malformed.
std::optional<std::string> DecodeBase64(std::string_view text) {
  static const auto kTable = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int8_t v = kTable[static_cast<unsigned char>(c)];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// KServe binary BYTES: each element is a 4-byte little-endian length followed by that many bytes.
std::vector<std::string_view> SplitBinaryBytes(std::string_view data, const std::string& what) {
  std::vector<std::string_view> elements;
  while (!data.empty()) {
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

// parameters.binary_data_size of one request input (KServe binary extension), or nullopt when the input has none.
std::optional<uint64_t> BinaryDataSize(const json& in, const std::string& what) {
  auto p = in.find("parameters");
  if (p == in.end() || !p->is_object() || !p->contains("binary_data_size")) return std::nullopt;
  const json& size = (*p)["binary_data_size"];
  if (size.is_null()) return std::nullopt;
  if (!size.is_number_unsigned() && !(size.is_number_integer() && size.get<int64_t>() >= 0))
    throw BadRequest(what + ": 'binary_data_size' must be a non-negative integer");
  return size.get<uint64_t>();
}

// The values of one request input's 'data' (nested lists flattened), which must be exactly `count` for `shape`.
std::vector<const json*> DataLeaves(const json& in, const Shape& shape, int64_t count, const std::string& what) {
  auto data = in.find("data");
  if (data == in.end()) throw BadRequest(what + ": needs 'data' or parameters.binary_data_size");
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

int64_t ResidentBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

const char* StatusName(ModelStatus s) {
  switch (s) {
    case ModelStatus::kReady:
      return "READY";
    case ModelStatus::kLoading:
      return "LOADING";
    case ModelStatus::kFailed:
      return "UNAVAILABLE";
    default:
      return "UNAVAILABLE";
  }
}

constexpr double kBucketsUs[] = {50,    100,   250,    500,    1000,   2500,    5000,    10000,
                                 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 10000000};
constexpr size_t kNumBuckets = sizeof(kBucketsUs) / sizeof(kBucketsUs[0]);

struct ModelMetrics {
  uint64_t success = 0, failure = 0;
  uint64_t buckets[kNumBuckets] = {};  // not cumulative; summed when written
  uint64_t count = 0;
  double sum_us = 0;
};

}  // namespace

// -----------------------------------------------------------------------------------------------------------------

struct InferenceServer::Impl {
  ModelManager* manager;
  std::string version;
  std::mutex metrics_mu;
  std::map<std::string, ModelMetrics> metrics;
  std::mutex preprocessors_mu;
  std::map<std::string, std::shared_ptr<ImagePreprocessor>> preprocessors;
  std::unique_ptr<Scheduler> scheduler;  // infer runs: dynamic batching, streams, queue limit

  HttpResponse Route(const HttpRequest& request);
  HttpResponse ModelRoute(const HttpRequest& request, const std::string& model, const std::string& version,
                          const std::string& action, const std::map<std::string, std::string>& query);
  HttpResponse Metadata(const std::string& model, const std::string& version);
  HttpResponse Ready(const std::string& model, const std::string& version);
  HttpResponse Infer(const HttpRequest& request, const std::string& model, const std::string& version);
  HttpResponse Classify(const HttpRequest& request, const std::string& model, const std::string& version,
                        const std::map<std::string, std::string>& query);
  HttpResponse Stats(const std::string& model);
  HttpResponse RepositoryIndex(const HttpRequest& request);
  void Record(const std::string& model, bool ok, double us);
  std::string MetricsText();
  std::shared_ptr<ImagePreprocessor> PreprocessorFor(const LoadedModel& loaded);
  // Decodes and preprocesses one encoded image for `loaded` (Error kInvalidArgument when it cannot).
  Tensor ImagePixels(const LoadedModel& loaded, std::string_view encoded);
  Tensor EncodedImagesInput(const LoadedModel& loaded, const ValueInfo& info, const json& in, std::string_view* binary,
                            const std::string& what);
  std::shared_ptr<LoadedModel> AcquireModel(const std::string& model, const std::string& version);

  // Models served through infer/classify, for their plan-cache counters in /metrics. Weak, so unloads still free them.
  std::mutex served_mu;
  std::map<std::string, std::weak_ptr<LoadedModel>> served;
};

std::shared_ptr<LoadedModel> InferenceServer::Impl::AcquireModel(const std::string& model, const std::string& version) {
  std::shared_ptr<LoadedModel> loaded = manager->Acquire(model, version);
  std::lock_guard<std::mutex> lock(served_mu);
  std::weak_ptr<LoadedModel>& slot = served[loaded->name];
  if (slot.lock() != loaded) slot = loaded;
  return loaded;
}

Tensor InferenceServer::Impl::ImagePixels(const LoadedModel& loaded, std::string_view encoded) {
  std::shared_ptr<ImagePreprocessor> pre = PreprocessorFor(loaded);
  DecodeOptions decode_options;
  decode_options.channels = loaded.directory.preprocess.channels();
  return pre->Run(DecodeImage(encoded.data(), encoded.size(), decode_options));
}

Tensor InferenceServer::Impl::EncodedImagesInput(const LoadedModel& loaded, const ValueInfo& info, const json& in,
                                                 std::string_view* binary, const std::string& what) {
  const PreprocessSpec& spec = loaded.directory.preprocess;
  if (spec.input.empty())
    throw BadRequest(what + ": BYTES (encoded images) need a model with preprocessing (config.json); model '" +
                     loaded.name + "' has none, so send its input as numbers");
  if (spec.input != info.name)
    throw BadRequest(what + ": BYTES (encoded images) are accepted only for the image input '" + spec.input +
                     "' of model '" + loaded.name + "'");
  const Shape shape = ParseShape(in, what);
  const int64_t count = NumElements(shape);
  if (count < 1) throw BadRequest(what + ": BYTES input holds no images (shape " + ShapeToString(shape) + ")");

  std::vector<std::string_view> encoded;
  std::vector<std::string> decoded_base64;
  if (const std::optional<uint64_t> binary_size = BinaryDataSize(in, what)) {
    const uint64_t size = *binary_size;
    if (size > binary->size())
      throw BadRequest(what + ": binary_data_size " + std::to_string(size) + " but only " +
                       std::to_string(binary->size()) + " bytes of binary data are left in the body");
    encoded = SplitBinaryBytes(binary->substr(0, size), what);
    binary->remove_prefix(size);
  } else {
    const std::vector<const json*> leaves = DataLeaves(in, shape, count, what);
    decoded_base64.reserve(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (!leaves[i]->is_string())
        throw BadRequest(what + ": BYTES element " + std::to_string(i) +
                         " must be a base64 string of an encoded image");
      std::optional<std::string> bytes = DecodeBase64(leaves[i]->get_ref<const std::string&>());
      if (!bytes) throw BadRequest(what + ": BYTES element " + std::to_string(i) + " is not valid base64");
      decoded_base64.push_back(std::move(*bytes));
    }
    for (const std::string& b : decoded_base64) encoded.emplace_back(b);
  }
  if (static_cast<int64_t>(encoded.size()) != count)
    throw BadRequest(what + ": " + std::to_string(encoded.size()) + " BYTES elements for shape " +
                     ShapeToString(shape) + " (" + std::to_string(count) + " elements)");
  std::vector<Tensor> pixels;
  pixels.reserve(encoded.size());
  for (size_t i = 0; i < encoded.size(); ++i) {
    try {
      pixels.push_back(ImagePixels(loaded, encoded[i]));
    } catch (const Error& e) {
      throw Error(e.code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument,
                  what + ": image " + std::to_string(i) + ": " + e.what());
    }
  }
  Tensor batch = StackTensors(pixels);
  CheckAgainstDeclared(info, batch.dtype(), batch.shape(), what);
  return batch;
}

InferenceServer::InferenceServer(ModelManager* manager, std::string version, SchedulerOptions scheduling)
    : impl_(std::make_unique<Impl>()) {
  impl_->manager = manager;
  impl_->version = std::move(version);
  impl_->scheduler = std::make_unique<Scheduler>(scheduling);
}

InferenceServer::~InferenceServer() = default;

HttpResponse InferenceServer::Handle(const HttpRequest& request) {
  try {
    return impl_->Route(request);
  } catch (const Error& e) {
    return ErrorResponse(StatusForError(e.code()), e.what());
  } catch (const json::exception& e) {
    return ErrorResponse(400, std::string("malformed request: ") + e.what());
  } catch (const std::bad_alloc&) {
    return ErrorResponse(500, "out of memory");
  } catch (const std::exception& e) {
    return ErrorResponse(500, std::string("internal error: ") + e.what());
  } catch (...) {
    return ErrorResponse(500, "internal error");
  }
}

HttpResponse InferenceServer::Impl::Route(const HttpRequest& request) {
  std::string path = request.target;
  std::string query_text;
  if (size_t q = path.find('?'); q != std::string::npos) {
    query_text = path.substr(q + 1);
    path.resize(q);
  }
  std::vector<std::string> seg;
  {
    std::stringstream ss(path);
    std::string s;
    while (std::getline(ss, s, '/'))
      if (!s.empty()) seg.push_back(s);
  }
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  auto method_not_allowed = [&] { return ErrorResponse(405, "method " + request.method + " not allowed on " + path); };

  if (seg.size() == 1 && seg[0] == "metrics") {
    if (!get) return method_not_allowed();
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = MetricsText();
    return r;
  }
  if (seg.empty() || seg[0] != "v2") return ErrorResponse(404, "no route for " + request.method + " " + path);
  if (seg.size() == 1) {
    if (!get) return method_not_allowed();
    return JsonResponse(200, {{"name", "osprey"},
                              {"version", version},
                              {"extensions", {"binary_tensor_data", "model_repository", "statistics", "classify"}}});
  }
  if (seg[1] == "health" && seg.size() == 3 && (seg[2] == "live" || seg[2] == "ready")) {
    if (!get) return method_not_allowed();
    return JsonResponse(200, {{seg[2], true}});
  }
  if (seg[1] == "repository") {
    if (!post) return method_not_allowed();
    if (seg.size() == 3 && seg[2] == "index") return RepositoryIndex(request);
    if (seg.size() == 5 && seg[2] == "models" && (seg[4] == "load" || seg[4] == "unload")) {
      ParseJsonBody(request.body, true);  // parameters are accepted and ignored
      const std::string& model = seg[3];
      if (seg[4] == "load") {
        manager->Load(model);
      } else {
        try {
          manager->Unload(model);
        } catch (const Error& e) {
          // Unloading a model that exists but is not loaded is a no-op, as in Triton.
          if (e.code() != ErrorCode::kNotFound) throw;
          bool known = false;
          for (const ModelIndexEntry& entry : manager->Index()) known |= entry.name == model;
          if (!known) throw;
        }
      }
      return JsonResponse(200, json::object());
    }
  }
  if (seg[1] == "models" && seg.size() >= 3) {
    std::string version;
    size_t next = 3;
    if (seg.size() >= 5 && seg[3] == "versions") {
      version = seg[4];
      next = 5;
    }
    if (seg.size() - next <= 1) {
      const std::string action = next < seg.size() ? seg[next] : "";
      const bool wants_post = action == "infer" || action == "classify";
      if (wants_post ? !post : !get) return method_not_allowed();
      return ModelRoute(request, seg[2], version, action, ParseQuery(query_text));
    }
  }
  return ErrorResponse(404, "no route for " + request.method + " " + path);
}

HttpResponse InferenceServer::Impl::ModelRoute(const HttpRequest& request, const std::string& model,
                                               const std::string& version, const std::string& action,
                                               const std::map<std::string, std::string>& query) {
  if (action.empty()) return Metadata(model, version);
  if (action == "ready") return Ready(model, version);
  if (action == "stats") return Stats(model);
  if (action != "infer" && action != "classify")
    return ErrorResponse(404, "no route for model action '" + action + "'");
  const auto start = std::chrono::steady_clock::now();
  HttpResponse response;
  try {
    response = action == "infer" ? Infer(request, model, version) : Classify(request, model, version, query);
  } catch (const Error& e) {
    response = ErrorResponse(StatusForError(e.code()), e.what());
  } catch (const json::exception& e) {
    response = ErrorResponse(400, std::string("malformed request: ") + e.what());
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  // Unknown models are not recorded, so requests cannot grow the label set without bound.
  if (response.status != 404) Record(model, response.status < 400, us);
  return response;
}

HttpResponse InferenceServer::Impl::Metadata(const std::string& model, const std::string& version) {
  std::shared_ptr<LoadedModel> loaded = manager->Acquire(model, version);
  const Graph& graph = loaded->model->graph();
  json inputs = json::array(), outputs = json::array();
  for (const ValueInfo& info : graph.input_infos)
    inputs.push_back({{"name", info.name}, {"datatype", KServeDType(info.dtype)}, {"shape", MetadataShape(info)}});
  for (const ValueInfo& info : graph.output_infos)
    outputs.push_back({{"name", info.name}, {"datatype", KServeDType(info.dtype)}, {"shape", MetadataShape(info)}});
  return JsonResponse(200, {{"name", loaded->name},
                            {"versions", {loaded->version}},
                            {"platform", "onnx"},
                            {"inputs", inputs},
                            {"outputs", outputs}});
}

HttpResponse InferenceServer::Impl::Ready(const std::string& model, const std::string& version) {
  for (const ModelIndexEntry& entry : manager->Index()) {
    if (entry.name != model) continue;
    const bool ready = entry.status == ModelStatus::kReady && (version.empty() || version == entry.version);
    return JsonResponse(ready ? 200 : 400, {{"name", model}, {"ready", ready}});
  }
  return ErrorResponse(404, "model '" + model + "' is not in the repository");
}

HttpResponse InferenceServer::Impl::Stats(const std::string& model) {
  for (const ModelIndexEntry& entry : manager->Index()) {
    if (entry.name != model) continue;
    ModelMetrics m;
    {
      std::lock_guard<std::mutex> lock(metrics_mu);
      if (auto it = metrics.find(model); it != metrics.end()) m = it->second;
    }
    json stats = {{"name", entry.name},
                  {"version", entry.version},
                  {"state", StatusName(entry.status)},
                  {"weight_bytes", entry.weight_bytes},
                  {"shared_bytes", entry.shared_bytes},
                  {"unique_bytes", entry.weight_bytes - entry.shared_bytes},
                  {"inference_count", m.success},
                  {"failure_count", m.failure}};
    return JsonResponse(200, {{"model_stats", json::array({stats})}});
  }
  return ErrorResponse(404, "model '" + model + "' is not in the repository");
}

HttpResponse InferenceServer::Impl::RepositoryIndex(const HttpRequest& request) {
  const json body = ParseJsonBody(request.body, true);
  if (!body.is_object()) throw BadRequest("repository index: body must be a JSON object");
  bool only_ready = false;
  if (auto it = body.find("ready"); it != body.end()) {
    if (!it->is_boolean()) throw BadRequest("repository index: 'ready' must be a boolean");
    only_ready = it->get<bool>();
  }
  json out = json::array();
  for (const ModelIndexEntry& entry : manager->Index()) {
    if (only_ready && entry.status != ModelStatus::kReady) continue;
    out.push_back({{"name", entry.name},
                   {"version", entry.version},
                   {"state", StatusName(entry.status)},
                   {"reason", entry.reason}});
  }
  return JsonResponse(200, out);
}

HttpResponse InferenceServer::Impl::Infer(const HttpRequest& request, const std::string& model,
                                          const std::string& version) {
  // Split the body into the JSON header and the binary tensor data that follows it.
  std::string_view body = request.body;
  std::string_view json_text = body, binary;
  const std::string header_length_text = request.Header("Inference-Header-Content-Length");
  bool raw_single_input = false;
  if (!header_length_text.empty()) {
    size_t pos = 0;
    long long header_length = -1;
    try {
      header_length = std::stoll(header_length_text, &pos);
    } catch (const std::exception&) {
    }
    if (pos != header_length_text.size() || header_length < 0 || static_cast<uint64_t>(header_length) > body.size())
      throw BadRequest("Inference-Header-Content-Length: expected 0.." + std::to_string(body.size()) + ", found '" +
                       header_length_text + "'");
    json_text = body.substr(0, header_length);
    binary = body.substr(header_length);
    raw_single_input = header_length == 0;
  }

  std::shared_ptr<LoadedModel> loaded = AcquireModel(model, version);
  const Graph& graph = loaded->model->graph();
  std::map<std::string, Tensor> inputs;
  json request_json = raw_single_input ? json::object() : ParseJsonBody(json_text, false);
  if (!request_json.is_object()) throw BadRequest("malformed request: infer body must be a JSON object");

  if (raw_single_input) {
    if (graph.input_infos.size() != 1)
      throw BadRequest("raw binary request (Inference-Header-Content-Length: 0) needs a model with one input; '" +
                       model + "' has " + std::to_string(graph.input_infos.size()));
    const ValueInfo& info = graph.input_infos[0];
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
        fixed *= std::max<int64_t>(1, info.dims[i].value);
      }
    }
    const int64_t row_bytes = fixed * static_cast<int64_t>(DTypeSize(info.dtype));
    if (row_bytes == 0 || binary.size() % row_bytes != 0 ||
        (symbolic < 0 && static_cast<int64_t>(binary.size()) != row_bytes))
      throw BadRequest("raw binary request: " + std::to_string(binary.size()) + " bytes do not fit input '" +
                       info.name + "' " + info.ShapeString() + " of " + KServeDType(info.dtype));
    if (symbolic >= 0) shape[symbolic] = static_cast<int64_t>(binary.size()) / row_bytes;
    Tensor t(info.dtype, shape);
    if (t.nbytes()) std::memcpy(t.raw(), binary.data(), t.nbytes());
    inputs[info.name] = t;
    binary = {};
  } else {
    auto in_it = request_json.find("inputs");
    if (in_it == request_json.end() || !in_it->is_array() || in_it->empty())
      throw BadRequest("malformed request: 'inputs' must be a non-empty array");
    for (const json& in : *in_it) {
      if (!in.is_object() || !in.contains("name") || !in["name"].is_string())
        throw BadRequest("malformed request: each input must be an object with a string 'name'");
      const std::string name = in["name"].get<std::string>();
      const std::string what = "input '" + name + "'";
      const ValueInfo* info = FindInput(graph, name);
      if (!info)
        throw BadRequest(what + ": model '" + model + "' has no such input (its inputs: " + InputNames(graph) + ")");
      if (inputs.count(name)) throw BadRequest(what + ": given twice");
      if (!in.contains("datatype") || !in["datatype"].is_string())
        throw BadRequest(what + ": 'datatype' must be a string");
      if (in["datatype"].get_ref<const std::string&>() == "BYTES") {
        inputs[name] = EncodedImagesInput(*loaded, *info, in, &binary, what);
        continue;
      }
      const DType dtype = ParseKServeDType(in["datatype"].get<std::string>(), what);
      const Shape shape = ParseShape(in, what);
      CheckAgainstDeclared(*info, dtype, shape, what);
      const int64_t numel = NumElements(shape);
      const uint64_t nbytes = static_cast<uint64_t>(numel) * DTypeSize(dtype);

      if (const std::optional<uint64_t> binary_size = BinaryDataSize(in, what)) {
        const uint64_t size = *binary_size;
        if (size != nbytes)
          throw BadRequest(what + ": binary_data_size " + std::to_string(size) + " does not match shape " +
                           ShapeToString(shape) + " of " + KServeDType(dtype) + " (" + std::to_string(nbytes) +
                           " bytes)");
        if (size > binary.size())
          throw BadRequest(what + ": binary_data_size " + std::to_string(size) + " but only " +
                           std::to_string(binary.size()) + " bytes of binary data are left in the body");
        Tensor t(dtype, shape);
        if (nbytes) std::memcpy(t.raw(), binary.data(), nbytes);
        binary.remove_prefix(size);
        if (dtype == DType::kBool)
          for (int64_t i = 0; i < numel; ++i)
            if (reinterpret_cast<const uint8_t*>(t.raw())[i] > 1)
              throw BadRequest(what + ": BOOL bytes must be 0 or 1");
        inputs[name] = t;
        continue;
      }
      const std::vector<const json*> leaves = DataLeaves(in, shape, numel, what);
      Tensor t(dtype, shape);
      for (int64_t i = 0; i < numel; ++i) SetElement(&t, i, *leaves[i], what);
      inputs[name] = t;
    }
    if (!binary.empty())
      throw BadRequest("malformed request: " + std::to_string(binary.size()) +
                       " bytes of binary data after the last binary input");
  }
  for (const ValueInfo& info : graph.input_infos)
    if (!inputs.count(info.name))
      throw BadRequest("input '" + info.name + "' is missing (model inputs: " + InputNames(graph) + ")");

  std::vector<std::pair<std::string, Tensor>> results;
  try {
    results = scheduler->Run(loaded, std::move(inputs));
  } catch (const QueueFullError& e) {
    HttpResponse busy = ErrorResponse(503, e.what());
    busy.headers.emplace_back("Retry-After", "1");
    return busy;
  }

  // Which outputs, and which of them in binary.
  const bool binary_default = ParamTrue(request_json, "binary_data_output");
  std::vector<std::pair<size_t, bool>> chosen;  // result index, binary
  if (auto out_it = request_json.find("outputs"); out_it != request_json.end()) {
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
      if (auto p = o.find("parameters"); p != o.end() && p->is_object() && p->contains("binary_data")) {
        if (!(*p)["binary_data"].is_boolean()) throw BadRequest("output '" + name + "': binary_data must be a boolean");
        as_binary = (*p)["binary_data"].get<bool>();
      }
      chosen.emplace_back(index, as_binary);
    }
  } else {
    for (size_t i = 0; i < results.size(); ++i) chosen.emplace_back(i, binary_default);
  }

  json outputs = json::array();
  std::string binary_out;
  for (const auto& [index, as_binary] : chosen) {
    const Tensor& t = results[index].second;
    json o = {{"name", results[index].first}, {"datatype", KServeDType(t.dtype())}, {"shape", t.shape()}};
    if (as_binary) {
      o["parameters"] = {{"binary_data_size", t.nbytes()}};
      binary_out.append(static_cast<const char*>(t.raw()), t.nbytes());
    } else {
      o["data"] = ElementsToJson(t);
    }
    outputs.push_back(std::move(o));
  }
  json answer = {{"model_name", loaded->name}, {"model_version", loaded->version}, {"outputs", outputs}};
  if (auto id = request_json.find("id"); id != request_json.end()) answer["id"] = *id;
  HttpResponse response = JsonResponse(200, answer);
  if (!binary_out.empty() || std::any_of(chosen.begin(), chosen.end(), [](const auto& c) { return c.second; })) {
    response.headers.emplace_back("Inference-Header-Content-Length", std::to_string(response.body.size()));
    response.content_type = "application/octet-stream";
    response.body += binary_out;
  }
  return response;
}

std::shared_ptr<ImagePreprocessor> InferenceServer::Impl::PreprocessorFor(const LoadedModel& loaded) {
  const PreprocessSpec& spec = loaded.directory.preprocess;
  const std::string key = loaded.name + "/" + loaded.version + "/" + spec.ToJson();
  std::lock_guard<std::mutex> lock(preprocessors_mu);
  auto it = preprocessors.find(key);
  if (it != preprocessors.end()) return it->second;
  CheckPreprocessSpec(spec, loaded.model->graph());
  CompileOptions options;
  options.num_threads = manager->options().threads;
  // Entries for versions no longer served are dropped wholesale now and then; they are small (plans for small graphs).
  if (preprocessors.size() > 256) preprocessors.clear();
  auto pre = std::make_shared<ImagePreprocessor>(spec, options);
  preprocessors[key] = pre;
  return pre;
}

HttpResponse InferenceServer::Impl::Classify(const HttpRequest& request, const std::string& model,
                                             const std::string& version,
                                             const std::map<std::string, std::string>& query) {
  const std::string content_type_header = request.Header("Content-Type");
  std::string content_type = content_type_header;
  for (char& c : content_type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // (name reported back, encoded bytes) per image, in request order; views into the body.
  std::vector<std::pair<std::string, std::string_view>> images;
  if (IsMultipart(content_type)) {
    const std::string boundary = MultipartBoundary(content_type_header);
    const std::vector<MultipartPart> parts = ParseMultipart(request.body, boundary);
    images.reserve(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      const MultipartPart& part = parts[i];
      std::string name = !part.filename.empty() ? std::string(part.filename)
                         : !part.name.empty()   ? std::string(part.name)
                                                : "part " + std::to_string(i + 1);
      images.emplace_back(std::move(name), part.data);
    }
  } else {
    if (!content_type.empty() && content_type.rfind("image/", 0) != 0 &&
        content_type.rfind("application/octet-stream", 0) != 0)
      return ErrorResponse(415,
                           "classify: expected raw image bytes (Content-Type image/*) or multipart/form-data, "
                           "found '" +
                               content_type + "'");
    if (request.body.empty()) throw BadRequest("classify: the request body is empty (send the image bytes)");
    images.emplace_back("request body", request.body);
  }

  std::shared_ptr<LoadedModel> loaded = AcquireModel(model, version);
  const ModelDirectory& directory = loaded->directory;
  if (directory.preprocess.input.empty() || !FindInput(loaded->model->graph(), directory.preprocess.input))
    throw BadRequest("classify: model '" + model + "' has no image input (no preprocessing in config.json)");
  int top_k = directory.postprocess.top_k;
  if (auto it = query.find("top_k"); it != query.end()) {
    try {
      size_t pos = 0;
      top_k = std::stoi(it->second, &pos);
      if (pos != it->second.size()) top_k = -1;
    } catch (const std::exception&) {
      top_k = -1;
    }
    if (top_k < 1) throw BadRequest("classify: top_k must be a positive integer, found '" + it->second + "'");
  }

  // Decode and preprocess each image; one that fails gets an error entry and the others still get answers.
  std::vector<std::string> errors(images.size());
  std::vector<Tensor> pixels;
  std::vector<size_t> pixel_owner;  // image index of each pixels entry
  for (size_t i = 0; i < images.size(); ++i) {
    try {
      pixels.push_back(ImagePixels(*loaded, images[i].second));
      pixel_owner.push_back(i);
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  }
  if (pixels.empty()) {
    std::string message = images.size() == 1 ? errors[0]
                                             : "classify: none of the " + std::to_string(images.size()) +
                                                   " images could be read; the first: " + errors[0];
    json results = json::array();
    for (size_t i = 0; i < images.size(); ++i) results.push_back({{"image", images[i].first}, {"error", errors[i]}});
    return JsonResponse(400, {{"error", message}, {"results", results}});
  }

  // All images of the request in one run when the batch dim is symbolic; a fixed batch dim B runs chunks of B, the
  // last padded by repeating its final image (padding rows are not reported).
  const ValueInfo* info = FindInput(loaded->model->graph(), directory.preprocess.input);
  int64_t fixed_batch = -1;
  if (info->has_shape && !info->dims.empty() && info->dims[0].value > 0) fixed_batch = info->dims[0].value;
  const size_t chunk = fixed_batch > 0 ? static_cast<size_t>(fixed_batch) : pixels.size();
  std::vector<std::vector<ClassScore>> top(images.size());
  for (size_t begin = 0; begin < pixels.size(); begin += chunk) {
    const size_t count = std::min(chunk, pixels.size() - begin);
    std::vector<Tensor> rows(pixels.begin() + begin, pixels.begin() + begin + count);
    while (rows.size() < chunk) rows.push_back(rows.back());
    std::map<std::string, Tensor> inputs{{directory.preprocess.input, StackTensors(rows)}};
    std::vector<std::pair<std::string, Tensor>> outputs = loaded->model->Run(inputs);
    if (outputs.empty()) throw Error(ErrorCode::kInternal, "classify: model '" + model + "' has no outputs");
    std::vector<std::vector<ClassScore>> chunk_top =
        TopKClasses(outputs[0].second, directory.postprocess.softmax, top_k, directory);
    if (chunk_top.size() < count)
      throw Error(ErrorCode::kInternal, "classify: model '" + model + "' returned " + std::to_string(chunk_top.size()) +
                                            " rows for " + std::to_string(count) + " images");
    for (size_t r = 0; r < count; ++r) top[pixel_owner[begin + r]] = std::move(chunk_top[r]);
  }

  json results = json::array();
  for (size_t i = 0; i < images.size(); ++i) {
    json item = {{"image", images[i].first}};
    if (!errors[i].empty()) {
      item["error"] = errors[i];
    } else {
      item["top_k"] = json::array();
      for (const ClassScore& c : top[i])
        item["top_k"].push_back({{"label", c.label}, {"index", c.index}, {"probability", c.probability}});
    }
    results.push_back(std::move(item));
  }
  return JsonResponse(200, {{"model", loaded->name}, {"version", loaded->version}, {"results", results}});
}

void InferenceServer::Impl::Record(const std::string& model, bool ok, double us) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  ModelMetrics& m = metrics[model];
  (ok ? m.success : m.failure)++;
  ++m.count;
  m.sum_us += us;
  for (size_t i = 0; i < kNumBuckets; ++i)
    if (us <= kBucketsUs[i]) {
      ++m.buckets[i];
      break;
    }
}

std::string InferenceServer::Impl::MetricsText() {
  std::ostringstream out;
  std::map<std::string, ModelMetrics> snapshot;
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    snapshot = metrics;
  }
  out << "# HELP osprey_request_success_total Successful infer and classify requests.\n"
      << "# TYPE osprey_request_success_total counter\n";
  for (const auto& [name, m] : snapshot)
    out << "osprey_request_success_total{model=\"" << PrometheusLabel(name) << "\"} " << m.success << "\n";
  out << "# HELP osprey_request_failure_total Failed infer and classify requests.\n"
      << "# TYPE osprey_request_failure_total counter\n";
  for (const auto& [name, m] : snapshot)
    out << "osprey_request_failure_total{model=\"" << PrometheusLabel(name) << "\"} " << m.failure << "\n";
  out << "# HELP osprey_request_duration_us Time from request to answer, microseconds.\n"
      << "# TYPE osprey_request_duration_us histogram\n";
  for (const auto& [name, m] : snapshot) {
    const std::string label = PrometheusLabel(name);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kNumBuckets; ++i) {
      cumulative += m.buckets[i];
      out << "osprey_request_duration_us_bucket{model=\"" << label << "\",le=\"" << kBucketsUs[i] << "\"} "
          << cumulative << "\n";
    }
    out << "osprey_request_duration_us_bucket{model=\"" << label << "\",le=\"+Inf\"} " << m.count << "\n";
    char sum[64];
    std::snprintf(sum, sizeof(sum), "%.3f", m.sum_us);
    out << "osprey_request_duration_us_sum{model=\"" << label << "\"} " << sum << "\n";
    out << "osprey_request_duration_us_count{model=\"" << label << "\"} " << m.count << "\n";
  }
  const ManagerStats stats = manager->Stats();
  const std::pair<const char*, uint64_t> counters[] = {{"osprey_model_loads_total", stats.loads},
                                                       {"osprey_model_unloads_total", stats.unloads},
                                                       {"osprey_model_evictions_total", stats.evictions},
                                                       {"osprey_model_load_failures_total", stats.load_failures}};
  for (const auto& [name, value] : counters) out << "# TYPE " << name << " counter\n" << name << " " << value << "\n";
  out << "# HELP osprey_accounted_bytes Accounted weight bytes of each loaded model (shared weights in each).\n"
      << "# TYPE osprey_accounted_bytes gauge\n";
  for (const ModelIndexEntry& entry : manager->Index())
    if (entry.status == ModelStatus::kReady)
      out << "osprey_accounted_bytes{model=\"" << PrometheusLabel(entry.name) << "\"} " << entry.weight_bytes << "\n";
  out << "# HELP osprey_model_runtime_bytes Execution arenas and plan-private constants of each loaded model.\n"
      << "# TYPE osprey_model_runtime_bytes gauge\n";
  for (const ModelIndexEntry& entry : manager->Index())
    if (entry.status == ModelStatus::kReady)
      out << "osprey_model_runtime_bytes{model=\"" << PrometheusLabel(entry.name) << "\"} " << entry.runtime_bytes
          << "\n";
  {
    std::vector<std::pair<std::string, PlanCache::Stats>> plan_stats;
    {
      std::lock_guard<std::mutex> lock(served_mu);
      for (auto it = served.begin(); it != served.end();) {
        if (std::shared_ptr<LoadedModel> loaded = it->second.lock()) {
          plan_stats.emplace_back(it->first, loaded->model->plan_cache().stats());
          ++it;
        } else {
          it = served.erase(it);  // unloaded: its counters went with it
        }
      }
    }
    out << "# HELP osprey_plan_cache_hits_total Compiled-plan cache hits of each loaded model.\n"
        << "# TYPE osprey_plan_cache_hits_total counter\n";
    for (const auto& [name, st] : plan_stats)
      out << "osprey_plan_cache_hits_total{model=\"" << PrometheusLabel(name) << "\"} " << st.hits << "\n";
    out << "# HELP osprey_plan_cache_misses_total Compiled-plan cache misses (compilations) of each loaded model.\n"
        << "# TYPE osprey_plan_cache_misses_total counter\n";
    for (const auto& [name, st] : plan_stats)
      out << "osprey_plan_cache_misses_total{model=\"" << PrometheusLabel(name) << "\"} " << st.misses << "\n";
  }
  out << "# HELP osprey_accounted_bytes_total Accounted bytes of all loaded models, shared weights counted once.\n"
      << "# TYPE osprey_accounted_bytes_total gauge\n"
      << "osprey_accounted_bytes_total " << stats.accounted_bytes << "\n";
  out << "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
      << "# TYPE process_resident_memory_bytes gauge\n"
      << "process_resident_memory_bytes " << ResidentBytes() << "\n";
  out << scheduler->MetricsText();
  return out.str();
}

std::string InferenceServer::MetricsText() { return impl_->MetricsText(); }

}  // namespace osprey::serve
