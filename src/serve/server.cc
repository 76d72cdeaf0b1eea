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
#include "serve/classify_route.h"
#include "serve/kserve.h"
#include "serve/prometheus.h"
#include "serve/responses.h"
#include "serve/tensor_json.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

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

struct ModelMetrics {
  uint64_t success = 0, failure = 0;
  Histogram duration;
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
  RequestLimits limits;

  HttpResponse Route(const HttpRequest& request);
  HttpResponse ModelRoute(const HttpRequest& request, const std::string& model, const std::string& version,
                          const std::string& action, const std::map<std::string, std::string>& query);
  HttpResponse Metadata(const std::string& model, const std::string& version);
  HttpResponse Ready(const std::string& model, const std::string& version);
  HttpResponse Infer(const HttpRequest& request, const std::string& model, const std::string& version);
  HttpResponse Stats(const std::string& model);
  HttpResponse RepositoryIndex(const HttpRequest& request);
  void Record(const std::string& model, bool ok, double us);
  std::string MetricsText();
  std::shared_ptr<ImagePreprocessor> PreprocessorFor(const LoadedModel& loaded);
  // Decodes and preprocesses one encoded image for `loaded`, within the request's budget (kInvalidArgument when it
  // cannot).
  Tensor ImagePixels(const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget);
  Tensor EncodedImagesInput(const LoadedModel& loaded, const ValueInfo& info,
                            const std::vector<std::string_view>& images, ImageBudget* budget, const std::string& what);
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

Tensor InferenceServer::Impl::ImagePixels(const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget) {
  std::shared_ptr<ImagePreprocessor> pre = PreprocessorFor(loaded);
  DecodeOptions decode_options;
  decode_options.channels = loaded.directory.preprocess.channels();
  decode_options.max_pixels = budget->PixelsLeft(decode_options.max_pixels);
  decode_options.limit_name = budget->LimitName();
  DecodeInfo info;
  Tensor image = DecodeImage(encoded.data(), encoded.size(), decode_options, &info);
  budget->Spend(info.stored_width * info.stored_height);
  return pre->Run(image);
}

InferenceServer::InferenceServer(ModelManager* manager, std::string version, SchedulerOptions scheduling,
                                 RequestLimits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->manager = manager;
  impl_->limits = limits;
  impl_->version = std::move(version);
  impl_->scheduler = std::make_unique<Scheduler>(scheduling);
}

InferenceServer::~InferenceServer() = default;

bool InferenceServer::RunsInline(const HttpRequest& request) {
  if (request.method != "GET") return false;
  std::string_view path(request.target);
  path = path.substr(0, path.find('?'));
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path == "/metrics" || path == "/v2" || path == "/v2/health/live" || path == "/v2/health/ready";
}

HttpResponse InferenceServer::Handle(const HttpRequest& request) {
  try {
    return impl_->Route(request);
  } catch (const RequestTooLarge& e) {
    return ErrorResponse(413, e.what());
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
    if (action == "infer") {
      response = Infer(request, model, version);
    } else {
      response = ClassifyRequest(
          request, [&] { return AcquireModel(model, version); }, query, limits,
          [this](const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget) {
            return ImagePixels(loaded, encoded, budget);
          });
    }
  } catch (const RequestTooLarge& e) {
    response = ErrorResponse(413, e.what());
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
  std::shared_ptr<LoadedModel> loaded = AcquireModel(model, version);
  const Graph& graph = loaded->model->graph();
  ImageBudget budget(limits);
  InferRequest decoded = DecodeInferRequest(
      graph.input_infos, model, request.body, request.Header("Inference-Header-Content-Length"), limits,
      [&](const ValueInfo& info, const std::vector<std::string_view>& images, const std::string& what) {
        return EncodedImagesInput(*loaded, info, images, &budget, what);
      });
  std::vector<std::pair<std::string, Tensor>> results;
  try {
    results = scheduler->Run(loaded, std::move(decoded.inputs));
  } catch (const QueueFullError& e) {
    HttpResponse busy = ErrorResponse(503, e.what());
    busy.headers.emplace_back("Retry-After", "1");
    return busy;
  }
  InferResponse encoded = EncodeInferResponse(decoded.header, loaded->name, loaded->version, results);
  HttpResponse response;
  response.body = std::move(encoded.body);
  if (encoded.header_length >= 0) {
    response.headers.emplace_back("Inference-Header-Content-Length", std::to_string(encoded.header_length));
    response.content_type = "application/octet-stream";
  }
  return response;
}

Tensor InferenceServer::Impl::EncodedImagesInput(const LoadedModel& loaded, const ValueInfo& info,
                                                 const std::vector<std::string_view>& images, ImageBudget* budget,
                                                 const std::string& what) {
  const PreprocessSpec& spec = loaded.directory.preprocess;
  if (spec.input.empty())
    throw BadRequest(what + ": BYTES (encoded images) need a model with preprocessing (config.json); model '" +
                     loaded.name + "' has none, so send its input as numbers");
  if (spec.input != info.name)
    throw BadRequest(what + ": BYTES (encoded images) are accepted only for the image input '" + spec.input +
                     "' of model '" + loaded.name + "'");
  std::vector<Tensor> pixels;
  pixels.reserve(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    try {
      pixels.push_back(ImagePixels(loaded, images[i], budget));
    } catch (const Error& e) {
      throw Error(e.code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument,
                  what + ": image " + std::to_string(i) + ": " + e.what());
    }
  }
  return StackTensors(pixels);
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

void InferenceServer::Impl::Record(const std::string& model, bool ok, double us) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  ModelMetrics& m = metrics[model];
  (ok ? m.success : m.failure)++;
  m.duration.Add(us);
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
  for (const auto& [name, m] : snapshot) m.duration.Write(out, "osprey_request_duration_us", PrometheusLabel(name));
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
