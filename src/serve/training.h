#pragma once
// Head training over HTTP (`osprey serve --allow-training`): POST /v2/repository/models/{name}/train starts a
// background job that trains a classifier head on a backbone of the repository (include/osprey/heads.h) from uploaded
// labelled images (multipart: field name = label) or a dataset folder under --training-data-root; GET
// .../train/status reports progress and then the training report. When a job finishes, the new version is loaded.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve/http_server.h"

namespace osprey::serve {

struct TrainingOptions {
  bool enabled = false;
  std::string repository;      // models are written to <repository>/<name>/<version>
  std::string data_root;       // server-side datasets must lie under it ("" = uploads only)
  int64_t max_images = 10000;  // per job (uploaded parts, or files in a server-side dataset)
  int max_jobs = 1;            // running at once; more are refused with 503
  int threads = 0;             // intra-op threads of a job's backbone runs
};

class TrainingService {
 public:
  /// `on_done(name)` runs after a job wrote its version (the server loads it).
  TrainingService(TrainingOptions options, std::function<void(const std::string&)> on_done);
  ~TrainingService();  // waits for running jobs
  /// Starts a job for model `name`; returns the job's status (HTTP 202). Throws Error (4xx) for bad requests and
  /// kUnavailable when --max-training-jobs are running.
  nlohmann::json Start(const std::string& name, const HttpRequest& request,
                       const std::map<std::string, std::string>& query);
  /// The latest job of `name`: state (queued, running, done, failed), progress lines, report or error.
  nlohmann::json Status(const std::string& name) const;

 private:
  struct Job;
  void Run(std::shared_ptr<Job> job);
  TrainingOptions options_;
  std::function<void(const std::string&)> on_done_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> latest_;  // by model name
  std::vector<std::pair<std::thread, std::shared_ptr<Job>>> threads_;  // finished ones are joined by the next Start
  int running_ = 0;
  int64_t next_id_ = 1;
};

}  // namespace osprey::serve
