#pragma once
// The inference server's routes: KServe v2 / Open Inference Protocol REST (health, metadata, JSON and binary-tensor
// infer, repository extension), the image classify endpoint, per-model stats and Prometheus metrics. Transport-free:
// Handle() maps one HttpRequest to one HttpResponse, so it can be tested and fuzzed without sockets.
#include <memory>
#include <string>

#include "serve/batcher.h"
#include "serve/http_server.h"
#include "serve/kserve.h"
#include "serve/model_manager.h"

namespace osprey::serve {

class InferenceServer {
 public:
  /// `manager` must outlive the server. `version` is reported by GET /v2. `scheduling`: streams per model and the
  /// per-model queue limit (dynamic batching itself is configured per model in config.json). `limits`: per-request
  /// work limits (rows, images, decoded megapixels).
  explicit InferenceServer(ModelManager* manager, std::string version = "", SchedulerOptions scheduling = {},
                           RequestLimits limits = {});
  /// Requests that must answer at once whatever the load (health, server metadata, metrics): the HTTP server runs
  /// them on its I/O threads, and everything else on its workers.
  static bool RunsInline(const HttpRequest& request);
  ~InferenceServer();
  /// Thread-safe. Never throws: every failure is a 4xx/5xx answer with body {"error": "..."}.
  HttpResponse Handle(const HttpRequest& request);
  /// The /metrics text (Prometheus exposition format).
  std::string MetricsText();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::serve
