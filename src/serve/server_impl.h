#pragma once
// InferenceServer's state, shared by its files: server.cc (REST routing), server_ops.cc (the protocol-neutral
// operations), server_metrics.cc (/metrics). Internal to the server.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "osprey/classify.h"
#include "serve/prometheus.h"
#include "serve/server.h"

namespace osprey::serve {

struct RequestMetrics {
  uint64_t success = 0, failure = 0;
  double success_us = 0, failure_us = 0;
  Histogram duration;
};

struct InferenceServer::Impl {
  ModelManager* manager = nullptr;
  std::string version;
  std::unique_ptr<Scheduler> scheduler;  // infer runs: dynamic batching, streams, queue limit
  RequestLimits limits;
  std::unique_ptr<TrainingService> training;  // null unless EnableTraining
  std::unique_ptr<SharedMemoryRegions> shared_memory;  // null unless EnableSharedMemory
  SharedMemoryRegions& SharedMemory();                 // kUnsupported naming the flag while it is off

  std::mutex metrics_mu;
  std::map<std::string, RequestMetrics> metrics;  // per model, infer and classify requests
  void Record(const std::string& model, bool ok, double us);
  // What one model did: its requests (infer and classify) and its runs through the scheduler. The statistics
  // extension and /metrics' Triton families both read it.
  struct Activity {
    RequestMetrics requests;
    Scheduler::Counters runs;
  };
  Activity ActivityOf(const std::string& model);
  // Machine-wide CPU busy share since the previous call (since boot the first time), from /proc/stat.
  std::mutex cpu_mu;
  uint64_t cpu_busy = 0, cpu_total = 0;
  double CpuUtilization();

  std::mutex preprocessors_mu;
  std::map<std::string, std::shared_ptr<ImagePreprocessor>> preprocessors;
  std::shared_ptr<ImagePreprocessor> PreprocessorFor(const LoadedModel& loaded);
  // Decodes and preprocesses one encoded image for `loaded`, within the request's budget (kInvalidArgument when it
  // cannot).
  Tensor ImagePixels(const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget);
  Tensor EncodedImagesInput(const LoadedModel& loaded, const ValueInfo& info,
                            const std::vector<std::string_view>& images, ImageBudget* budget, const std::string& what);

  // Models served through infer/classify, for their plan-cache counters in /metrics. Weak, so unloads still free them.
  std::mutex served_mu;
  std::map<std::string, std::weak_ptr<LoadedModel>> served;
  std::shared_ptr<LoadedModel> AcquireModel(const std::string& model, const std::string& version);
};

/// "READY", "LOADING" or "UNAVAILABLE" (KServe/Triton state names).
const char* StateName(ModelStatus status);

}  // namespace osprey::serve
