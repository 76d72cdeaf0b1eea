#pragma once
// Per-model scheduling for the server: dynamic batching (config.json "batching"), streams (S concurrent runs per model:
// its instance_group count, else --streams)
// and the per-model queue limit. Requests for a model with max_batch_size > 0 are queued; S executor threads each take
// the oldest request, wait up to max_queue_delay_us for compatible ones (same model version, same dtypes and non-batch
// dims, rows summing to at most max_batch_size), concatenate them along dim 0, run the model once and hand each request
// exactly its own rows. Models without batching run on the caller's thread, at most S at a time.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "osprey/error.h"
#include "osprey/tensor.h"
#include "serve/model_manager.h"

namespace osprey::serve {

/// When a request must be answered by (steady clock; none by default) and why ("parameters.timeout 5000 us", ...),
/// and whether whoever sent it went away (`cancelled`: a closed connection, a cancelled gRPC call; thread-safe).
struct Deadline {
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::time_point::max();
  std::string reason;
  std::function<bool()> cancelled;
  std::string cancel_reason;
  bool set() const { return at != std::chrono::steady_clock::time_point::max(); }
  bool Cancelled() const { return cancelled && cancelled(); }
};

/// The deadline of a request that arrived at `arrived`, the earliest of: `max_seconds` after it (--max-request-seconds;
/// 0 = none), a client's `timeout_us` microseconds after it (parameters.timeout, Triton's; 0 = none) and `transport`'s
/// (a gRPC call's deadline).
Deadline RequestDeadline(std::chrono::steady_clock::time_point arrived, double max_seconds, int64_t timeout_us = 0,
                         const Deadline& transport = {});

struct SchedulerOptions {
  int streams = 1;      // concurrent runs (batches or requests) per model
  int max_queue = 256;  // requests waiting per model; beyond it new ones get QueueFullError
};

/// A model's queue is full: answered 503 with Retry-After.
class QueueFullError : public Error {
 public:
  explicit QueueFullError(const std::string& message) : Error(ErrorCode::kUnavailable, message) {}
};

class Scheduler {
 public:
  using Outputs = std::vector<std::pair<std::string, Tensor>>;

  explicit Scheduler(SchedulerOptions options);
  /// Runs what is queued, then stops the executors.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Runs `inputs` (already checked against the model's declared inputs) on `loaded`, batched with other requests when
  /// its config asks for it. Returns the outputs for this request's rows only. Thread-safe; blocks until done. Throws
  /// QueueFullError when the model's queue holds max_queue requests, and whatever Model::Run throws. With a
  /// deadline: a request still waiting for a stream or a batch when it passes is answered kDeadlineExceeded without
  /// running, and a run past it stops at its next step (RunDeadline; a batch only once every request in it is late).
  /// A cancelled request (Deadline::cancelled) is not started, and its run stops at its next step (kCancelled).
  Outputs Run(const std::shared_ptr<LoadedModel>& loaded, std::map<std::string, Tensor> inputs,
              const Deadline& deadline = {});

  /// Prometheus text for osprey_batch_size, osprey_queue_duration_us and osprey_compute_duration_us (per model).
  std::string MetricsText();

  /// Totals of one model's runs through Run(), for Triton-style statistics.
  struct Counters {
    uint64_t executions = 0;   // model runs (a batch counts once)
    uint64_t inferences = 0;   // rows run (batch items)
    uint64_t requests = 0;     // requests run
    double queue_us = 0;       // summed over requests
    double compute_us = 0;     // summed over requests (each request counts its batch's run)
    uint64_t last_ms = 0;      // wall-clock time of the last run's end, milliseconds since the epoch (0: none)
    uint64_t pending = 0;      // requests waiting now: for a stream, or in the batching queue
  };
  Counters ModelCounters(const std::string& model);

  const SchedulerOptions& options() const { return options_; }

 private:
  struct Impl;
  SchedulerOptions options_;
  std::unique_ptr<Impl> impl_;
};

/// Concatenates tensors of equal dtype and equal dims after the first along dim 0 (exposed for tests).
Tensor ConcatRows(const std::vector<Tensor>& parts);
/// Rows [begin, begin + count) of `t` along dim 0, as a new tensor (exposed for tests).
Tensor SliceRows(const Tensor& t, int64_t begin, int64_t count);

}  // namespace osprey::serve
