// REST routing: KServe v2 paths to the protocol-neutral operations (server_ops.cc), the classify endpoint
// (classify_route.cc) and /metrics (server_metrics.cc).
#include "serve/server.h"

#include <chrono>
#include <optional>
#include <sstream>

#include "osprey/error.h"
#include "serve/classify_route.h"
#include "serve/model_config.h"
#include "serve/responses.h"
#include "serve/server_impl.h"
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
    case ErrorCode::kDeadlineExceeded:
      return 504;
    case ErrorCode::kCancelled:
      return 499;  // nginx's "client closed request": logged, never seen by the client
    default:
      return 500;
  }
}

// A REST request's cancel check: its client closed the connection (HttpRequest::client_gone).
Deadline ClientGone(const HttpRequest& request) {
  Deadline d;
  if (request.client_gone) {
    d.cancelled = request.client_gone;
    d.cancel_reason = "the client closed the connection";
  }
  return d;
}

HttpResponse ErrorAnswer(const Error& e) {
  if (dynamic_cast<const RequestTooLarge*>(&e)) return ErrorResponse(413, e.what());
  HttpResponse r = ErrorResponse(StatusForError(e.code()), e.what());
  if (dynamic_cast<const QueueFullError*>(&e)) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// The "parameters" of a repository load/unload body (null when absent or the body is empty).
json RepositoryParameters(const std::string& body) {
  const json parsed = ParseJsonBody(body, true);
  if (!parsed.is_object()) throw Error(ErrorCode::kInvalidArgument, "repository: body must be a JSON object");
  auto it = parsed.find("parameters");
  return it == parsed.end() ? json() : *it;
}

struct Route {
  std::string path;
  std::vector<std::string> seg;
  std::map<std::string, std::string> query;
};

Route Split(const std::string& target) {
  Route r;
  r.path = target;
  std::string query_text;
  if (size_t q = r.path.find('?'); q != std::string::npos) {
    query_text = r.path.substr(q + 1);
    r.path.resize(q);
  }
  // Segments are split before they are decoded: a model name holding an encoded '/' stays one segment (and is
  // refused as a name).
  std::stringstream ss(r.path);
  std::string s;
  while (std::getline(ss, s, '/'))
    if (!s.empty()) r.seg.push_back(PercentDecode(s, "URL path"));
  r.query = ParseQuery(query_text);
  return r;
}

// Triton's shared memory extensions: /v2/systemsharedmemory/{status, unregister} and .../region/{name}/{status,
// register, unregister}. CUDA shared memory holds no regions here (request tensors live in host memory): its status is
// empty, unregister a no-op, and register refused saying what to use instead.
HttpResponse SharedMemoryRoute(InferenceServer& server, const HttpRequest& request, const Route& route) {
  const std::vector<std::string>& seg = route.seg;
  const bool cuda = seg[1] == "cudasharedmemory";
  std::string region, action;
  if (seg.size() == 3) {
    action = seg[2];
  } else if (seg.size() == 5 && seg[2] == "region") {
    region = seg[3];
    action = seg[4];
  }
  if (action != "status" && action != "unregister" && !(action == "register" && !region.empty()))
    return ErrorResponse(404, "no route for " + request.method + " " + route.path);
  if (request.method != (action == "status" ? "GET" : "POST"))
    return ErrorResponse(405, "method " + request.method + " not allowed on " + route.path);
  if (cuda) {
    if (action == "register")
      throw Error(ErrorCode::kUnsupported,
                  "CUDA shared memory is not supported: osprey takes request tensors in host memory; register system "
                  "shared memory instead (/v2/systemsharedmemory, with --allow-shared-memory)");
    if (action == "status" && !region.empty())
      throw Error(ErrorCode::kNotFound, "CUDA shared memory region '" + region + "' is not registered");
    return JsonResponse(200, action == "status" ? json::array() : json::object());
  }
  if (action == "status") return JsonResponse(200, server.SharedMemoryStatus(region));
  if (action == "unregister") {
    server.UnregisterSharedMemory(region);
    return JsonResponse(200, json::object());
  }
  const std::string what = "register shared memory region '" + region + "'";
  const json body = ParseJsonBody(request.body, false);
  if (!body.is_object() || !body.contains("key") || !body["key"].is_string() || !body.contains("byte_size"))
    throw Error(ErrorCode::kInvalidArgument, what +
                                                 ": the body must be {\"key\": \"/name\", \"offset\": N, "
                                                 "\"byte_size\": N} (offset may be left out)");
  const uint64_t offset = body.contains("offset") ? NonNegativeParameter(body["offset"], what, "offset") : 0;
  server.RegisterSharedMemory(region, body["key"].get<std::string>(), offset,
                              NonNegativeParameter(body["byte_size"], what, "byte_size"));
  return JsonResponse(200, json::object());
}

}  // namespace

InferenceServer::InferenceServer(ModelManager* manager, std::string version, SchedulerOptions scheduling,
                                 RequestLimits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->manager = manager;
  impl_->limits = limits;
  impl_->version = std::move(version);
  impl_->scheduler = std::make_unique<Scheduler>(scheduling);
}

InferenceServer::~InferenceServer() = default;

void InferenceServer::EnableTraining(TrainingOptions options) {
  ModelManager* manager = impl_->manager;
  impl_->training = std::make_unique<TrainingService>(std::move(options), [manager](const std::string& name) {
    manager->Load(name);  // the new version (the highest) replaces the one being served
  });
}

void InferenceServer::EnableSharedMemory(size_t max_regions, uint64_t max_read_bytes) {
  impl_->shared_memory = std::make_unique<SharedMemoryRegions>(max_regions, max_read_bytes);
}

bool InferenceServer::RunsInline(const HttpRequest& request) {
  if (request.method != "GET") return false;
  std::string_view path(request.target);
  path = path.substr(0, path.find('?'));
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path == "/metrics" || path == "/v2" || path == "/v2/health/live" || path == "/v2/health/ready";
}

std::string InferenceServer::Lane(const HttpRequest& request) {
  try {
    const std::vector<std::string> seg = Split(request.target).seg;
    if (seg.size() >= 3 && seg[0] == "v2" && seg[1] == "models" && seg[2] != "stats") return seg[2];
    if (seg.size() >= 4 && seg[0] == "v2" && seg[1] == "repository" && seg[2] == "models") return seg[3];
  } catch (const Error&) {  // a malformed path: Handle answers it
  }
  return "";
}

HttpResponse InferenceServer::Handle(const HttpRequest& request) {
  Route route;
  try {
    route = Split(request.target);
  } catch (const Error& e) {
    return ErrorAnswer(e);
  }
  const std::vector<std::string>& seg = route.seg;
  const bool get = request.method == "GET", post = request.method == "POST";
  auto not_allowed = [&] { return ErrorResponse(405, "method " + request.method + " not allowed on " + route.path); };
  auto no_route = [&] { return ErrorResponse(404, "no route for " + request.method + " " + route.path); };
  try {
    if (seg.size() == 1 && seg[0] == "metrics") {
      if (!get) return not_allowed();
      HttpResponse r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = MetricsText();
      return r;
    }
    if (seg.empty() || seg[0] != "v2") return no_route();
    if (seg.size() == 1) return get ? JsonResponse(200, ServerMetadata()) : not_allowed();
    if (seg[1] == "health" && seg.size() == 3 && (seg[2] == "live" || seg[2] == "ready"))
      return get ? JsonResponse(200, {{seg[2], true}}) : not_allowed();
    if (seg[1] == "repository" && seg.size() >= 5 && seg[2] == "models" && seg[4] == "train") {
      // Head training (training.h): POST .../train starts a job, GET .../train/status reports it.
      if (!impl_->training)
        return ErrorResponse(404, "training is off on this server (start it with --allow-training)");
      if (seg.size() == 5) {
        if (!post) return not_allowed();
        return JsonResponse(202, impl_->training->Start(seg[3], request, route.query));
      }
      if (seg.size() == 6 && seg[5] == "status") return get ? JsonResponse(200, impl_->training->Status(seg[3])) : not_allowed();
      return no_route();
    }
    if (seg[1] == "systemsharedmemory" || seg[1] == "cudasharedmemory") return SharedMemoryRoute(*this, request, route);
    if (seg[1] == "repository") {
      if (!post) return not_allowed();
      if (seg.size() == 3 && seg[2] == "index") {
        const json body = ParseJsonBody(request.body, true);
        if (!body.is_object()) throw Error(ErrorCode::kInvalidArgument, "repository index: body must be a JSON object");
        bool ready_only = false;
        if (auto it = body.find("ready"); it != body.end()) {
          if (!it->is_boolean()) throw Error(ErrorCode::kInvalidArgument, "repository index: 'ready' must be a boolean");
          ready_only = it->get<bool>();
        }
        return JsonResponse(200, RepositoryIndex(ready_only));
      }
      if (seg.size() == 5 && seg[2] == "models" && (seg[4] == "load" || seg[4] == "unload")) {
        if (seg[4] == "load")
          LoadModel(seg[3], RepositoryParameters(request.body));
        else
          UnloadModel(seg[3], RepositoryParameters(request.body));
        return JsonResponse(200, json::object());
      }
      return no_route();
    }
    if (seg[1] != "models" || seg.size() < 3) return no_route();
    if (seg.size() == 3 && seg[2] == "stats") return get ? JsonResponse(200, Statistics("", "")) : not_allowed();
    const std::string& model = seg[2];
    std::string version;
    size_t next = 3;
    if (seg.size() >= 5 && seg[3] == "versions") {
      version = seg[4];
      next = 5;
    }
    if (seg.size() - next > 1) return no_route();
    const std::string action = next < seg.size() ? seg[next] : "";
    const bool wants_post = action == "infer" || action == "classify";
    if (wants_post ? !post : !get) return not_allowed();
    if (action.empty()) return JsonResponse(200, ModelMetadata(model, version));
    if (action == "ready") {
      const bool ready = ModelReady(model, version);
      return JsonResponse(ready ? 200 : 400, {{"name", model}, {"ready", ready}});
    }
    if (action == "stats") return JsonResponse(200, Statistics(model, version));
    if (action == "config") return JsonResponse(200, ConfigJson(*ModelConfig(model, version)));
    if (!wants_post) return ErrorResponse(404, "no route for model action '" + action + "'");

    // infer (counted in Infer, for both protocols) / classify (timed and counted here).
    const auto start = std::chrono::steady_clock::now();
    HttpResponse response;
    try {
      if (action == "infer") {
        InferResult r = Infer(
            model, version,
            [&](const std::vector<ValueInfo>& inputs, const RequestLimits& limits, const ImageInputDecoder& images,
                const SharedMemoryRegions* shared_memory) {
              return DecodeInferRequest(inputs, model, request.body, request.Header("Inference-Header-Content-Length"),
                                        limits, images, shared_memory);
            },
            ClientGone(request));
        InferResponse encoded = EncodeInferResponse(
            r.request.header, r.loaded->name, r.loaded->version,
            SelectOutputs(r.request.header, model, r.results, r.loaded->directory.labels, r.shared_memory));
        response.body = std::move(encoded.body);
        if (encoded.header_length >= 0) {
          response.headers.emplace_back("Inference-Header-Content-Length", std::to_string(encoded.header_length));
          response.content_type = "application/octet-stream";
        }
      } else {
        const Deadline deadline = RequestDeadline(start, impl_->limits.max_seconds, 0, ClientGone(request));
        std::optional<RunDeadline> run_deadline;
        if (deadline.set() || deadline.cancelled)
          run_deadline.emplace(deadline.at, deadline.reason, deadline.cancelled, deadline.cancel_reason);
        response = ClassifyRequest(
            request, [&] { return impl_->AcquireModel(model, version); }, route.query, impl_->limits,
            [this](const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget) {
              return impl_->ImagePixels(loaded, encoded, budget);
            });
        impl_->manager->AfterRun();
      }
    } catch (const Error& e) {
      response = ErrorAnswer(e);
    } catch (const json::exception& e) {
      response = ErrorResponse(400, std::string("malformed request: ") + e.what());
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    // Unknown models are not recorded, so requests cannot grow the label set without bound.
    if (action == "classify" && response.status != 404) impl_->Record(model, response.status < 400, us);
    return response;
  } catch (const Error& e) {
    return ErrorAnswer(e);
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

}  // namespace osprey::serve
