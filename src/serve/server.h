#pragma once
// The inference server: KServe v2 / Open Inference Protocol over REST (health, metadata, JSON and binary-tensor infer,
// repository extension, Triton's config/statistics/classification extensions), the image classify endpoint and
// Prometheus metrics. Transport-free: Handle() maps one HttpRequest to one HttpResponse (server.cc), and the
// protocol-neutral operations below (server_ops.cc) serve the gRPC API too (grpc_server.cc).
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "serve/batcher.h"
#include "serve/http_server.h"
#include "serve/kserve.h"
#include "serve/model_manager.h"
#include "serve/training.h"

namespace inference {
class ModelConfig;
}

namespace osprey::serve {

class InferenceServer {
 public:
  /// `manager` must outlive the server. `version` is reported by GET /v2. `scheduling`: streams per model and the
  /// per-model queue limit (dynamic batching itself is configured per model in config.json). `limits`: per-request
  /// work limits (rows, images, decoded megapixels).
  explicit InferenceServer(ModelManager* manager, std::string version = "", SchedulerOptions scheduling = {},
                           RequestLimits limits = {});
  ~InferenceServer();
  /// Thread-safe. Never throws: every failure is a 4xx/5xx answer with body {"error": "..."}.
  HttpResponse Handle(const HttpRequest& request);
  /// Turns on POST /v2/repository/models/{name}/train (see training.h); a finished job's version is loaded. Call
  /// before serving.
  void EnableTraining(TrainingOptions options);
  /// Turns on Triton's system shared memory extension (shared_memory.h): at most `max_regions` registered regions, and
  /// inputs of at most `max_read_bytes` each read from them. Call before serving.
  void EnableSharedMemory(size_t max_regions, uint64_t max_read_bytes);
  /// Requests that must answer at once whatever the load (health, server metadata, metrics): the HTTP server runs
  /// them on its I/O threads, and everything else on its workers.
  static bool RunsInline(const HttpRequest& request);
  /// The worker lane of a request (HttpServerOptions::lane): the model a /v2/models/{name}/... or
  /// /v2/repository/models/{name}/... path names, else "".
  static std::string Lane(const HttpRequest& request);
  /// The /metrics text (Prometheus exposition format).
  std::string MetricsText();

  // Protocol-neutral operations (REST and gRPC). Each throws osprey::Error (kNotFound for unknown models, ...).
  nlohmann::json ServerMetadata() const;
  /// Whether the model (and version, when given) is loaded and ready; kNotFound when it is not in the repository.
  bool ModelReady(const std::string& model, const std::string& version);
  /// KServe model metadata; never loads the model.
  nlohmann::json ModelMetadata(const std::string& model, const std::string& version);
  /// Triton's model configuration; never loads the model.
  std::shared_ptr<const inference::ModelConfig> ModelConfig(const std::string& model, const std::string& version);
  /// Triton's statistics ({"model_stats": [...]}) of `model` ("" = every model in the repository) plus osprey's
  /// memory figures (state, weight/shared/unique/runtime bytes) in each entry.
  nlohmann::json Statistics(const std::string& model, const std::string& version);
  /// The repository index: name, version, state, reason.
  nlohmann::json RepositoryIndex(bool ready_only);
  /// Triton's repository load/unload; `parameters` (may be null) other than none are refused or logged.
  void LoadModel(const std::string& model, const nlohmann::json& parameters);
  void UnloadModel(const std::string& model, const nlohmann::json& parameters);
  /// The system shared memory extension; kUnsupported while it is off (EnableSharedMemory).
  nlohmann::json SharedMemoryStatus(const std::string& region);
  void RegisterSharedMemory(const std::string& region, const std::string& key, uint64_t offset, uint64_t byte_size);
  void UnregisterSharedMemory(const std::string& region);

  struct InferResult {
    std::shared_ptr<LoadedModel> loaded;
    InferRequest request;                               // as decoded (header: outputs, parameters, id)
    std::vector<std::pair<std::string, Tensor>> results;  // graph outputs in order
    const SharedMemoryRegions* shared_memory = nullptr;   // for SelectOutputs (null: the extension is off)
  };
  /// Decodes one infer request with `decode` (given the model's inputs, the limits, the image decoder for BYTES inputs
  /// and the shared memory regions, null when off), runs it through the scheduler and records its statistics.
  /// QueueFullError when the model's queue is full. Its deadline is the earliest of the request's parameters.timeout,
  /// --max-request-seconds (both from the call) and `transport`'s (a gRPC call's); past it, kDeadlineExceeded.
  using Decoder = std::function<InferRequest(const std::vector<ValueInfo>& inputs, const RequestLimits&,
                                             const ImageInputDecoder&, const SharedMemoryRegions*)>;
  InferResult Infer(const std::string& model, const std::string& version, const Decoder& decode,
                    const Deadline& transport = {});

  struct Impl;  // server_impl.h

 private:
  InferResult InferUntimed(const std::string& model, const std::string& version, const Decoder& decode,
                           std::chrono::steady_clock::time_point arrived, const Deadline& transport);
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::serve
