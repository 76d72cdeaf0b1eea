#include "serve/batcher.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "osprey/runtime.h"
#include "serve/prometheus.h"

namespace osprey::serve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::micro>(end - start).count();
}

// A request answered without running because its deadline passed while it waited.
Error Late(const Deadline& deadline, const std::string& model, Clock::time_point since, const char* where) {
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.1f", MicrosSince(since, Clock::now()) / 1000);
  return Error(ErrorCode::kDeadlineExceeded, "deadline exceeded (" + deadline.reason + "): model '" + model +
                                                 "': not run, it waited " + ms + " ms " + where);
}

// Waits for `ready` until the deadline (without one: for as long as it takes); false when the deadline passed first.
template <class Ready>
bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, const Deadline& deadline, Ready ready) {
  if (!deadline.set()) {
    cv.wait(lock, ready);
    return true;
  }
  return cv.wait_until(lock, deadline.at, ready);
}

// A request whose sender went away before it ran: answered (to no one) without running.
Error Gone(const Deadline& deadline, const std::string& model) {
  return Error(ErrorCode::kCancelled, "cancelled (" + deadline.cancel_reason + "): model '" + model + "': not run");
}

// Runs `model` under the request's deadline and cancel check (RunDeadline), when it has either.
Scheduler::Outputs RunWithin(Model& model, const std::map<std::string, Tensor>& inputs, const Deadline& deadline) {
  if (!deadline.set() && !deadline.cancelled) return model.Run(inputs);
  const RunDeadline run_deadline(deadline.at, deadline.reason, deadline.cancelled, deadline.cancel_reason);
  return model.Run(inputs);
}

const std::vector<double> kBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

struct LaneMetrics {
  Histogram batch{&kBatchBuckets};
  Histogram queue;
  Histogram compute;
};

// One queued request of a batched model.
struct Pending {
  std::shared_ptr<LoadedModel> loaded;
  std::map<std::string, Tensor> inputs;
  int64_t rows = 0;
  std::string key;  // requests with equal non-empty keys may share a batch; empty = runs alone
  Clock::time_point enqueued;
  Deadline deadline;
  bool done = false;
  Scheduler::Outputs outputs;
  std::exception_ptr error;
};

// One model's queue, executors and metrics.
struct Lane {
  std::string name;
  std::mutex mu;
  std::condition_variable work_cv;  // executors: work queued, forming finished, stop
  std::condition_variable done_cv;  // callers: a request finished, a direct stream freed
  std::deque<std::shared_ptr<Pending>> queue;
  std::vector<std::string> forming;  // batch keys executors are gathering requests for (one executor per key)
  bool stop = false;
  int streams = 1;  // concurrent runs allowed now: the loaded model's (its instance_group count, else --streams)
  int running = 0;  // direct path: runs in progress
  int waiting = 0;  // direct path: callers waiting for a stream
  std::vector<std::thread> executors;
  std::mutex metrics_mu;
  LaneMetrics metrics;
  uint64_t last_ms = 0;  // under metrics_mu
};

uint64_t NowMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The batch key of a request: the model instance, then each input's dtype and dims after the first. Empty (never
// batched with another) when the rows cannot be told apart: a rank-0 input, inputs disagreeing on dim 0, no rows, or a
// graph input whose batch dim is fixed.
std::string BatchKey(const LoadedModel& loaded, const std::map<std::string, Tensor>& inputs, int64_t* rows) {
  *rows = -1;
  std::ostringstream key;
  key << static_cast<const void*>(&loaded);
  for (const ValueInfo& info : loaded.model->graph().input_infos)
    if (info.has_shape && (info.dims.empty() || info.dims[0].value >= 0)) return "";
  for (const auto& [name, t] : inputs) {
    if (t.rank() == 0) return "";
    if (*rows < 0) *rows = t.dim(0);
    if (t.dim(0) != *rows) return "";
    key << '|' << name << ':' << static_cast<int>(t.dtype());
    for (int64_t d = 1; d < t.rank(); ++d) key << ',' << t.dim(d);
  }
  if (*rows <= 0) return "";
  return key.str();
}

}  // namespace

Deadline RequestDeadline(Clock::time_point arrived, double max_seconds, int64_t timeout_us, const Deadline& transport) {
  Deadline deadline = transport;
  auto earlier = [&](double seconds, std::string reason) {
    if (!(seconds > 0)) return;
    seconds = std::min(seconds, 1e7);  // ~4 months: far enough, and no overflow of the clock
    const auto at = arrived + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    if (at < deadline.at) {
      deadline.at = at;
      deadline.reason = std::move(reason);
    }
  };
  char text[48];
  std::snprintf(text, sizeof text, "--max-request-seconds %g", max_seconds);
  earlier(max_seconds, text);
  earlier(static_cast<double>(timeout_us) * 1e-6, "parameters.timeout " + std::to_string(timeout_us) + " us");
  return deadline;
}

Tensor ConcatRows(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw Error(ErrorCode::kInternal, "ConcatRows: no tensors");
  Shape shape = parts[0].shape();
  if (shape.empty()) throw Error(ErrorCode::kInternal, "ConcatRows: rank-0 tensor");
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    if (p.dtype() != parts[0].dtype() || p.rank() != parts[0].rank() ||
        !std::equal(p.shape().begin() + 1, p.shape().end(), shape.begin() + 1))
      throw Error(ErrorCode::kInternal, "ConcatRows: " + ShapeToString(p.shape()) + " does not fit " +
                                            ShapeToString(shape) + " after dim 0");
    rows += p.dim(0);
  }
  shape[0] = rows;
  Tensor out(parts[0].dtype(), shape);
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    if (p.nbytes()) std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

Tensor SliceRows(const Tensor& t, int64_t begin, int64_t count) {
  if (t.rank() == 0 || begin < 0 || count < 0 || begin + count > t.dim(0))
    throw Error(ErrorCode::kInternal, "SliceRows: rows [" + std::to_string(begin) + ", " +
                                          std::to_string(begin + count) + ") of " + ShapeToString(t.shape()));
  Shape shape = t.shape();
  shape[0] = count;
  Tensor out(t.dtype(), shape);
  const size_t row_bytes = t.dim(0) ? t.nbytes() / static_cast<size_t>(t.dim(0)) : 0;
  if (out.nbytes())
    std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + row_bytes * static_cast<size_t>(begin), out.nbytes());
  return out;
}

struct Scheduler::Impl {
  SchedulerOptions options;
  std::mutex lanes_mu;
  std::map<std::string, std::unique_ptr<Lane>> lanes;

  Lane* LaneFor(const std::string& name) {
    std::lock_guard<std::mutex> lock(lanes_mu);
    std::unique_ptr<Lane>& lane = lanes[name];
    if (!lane) {
      lane = std::make_unique<Lane>();
      lane->name = name;
    }
    return lane.get();
  }

  Outputs RunDirect(Lane* lane, const std::shared_ptr<LoadedModel>& loaded, const std::map<std::string, Tensor>& in,
                    const Deadline& deadline);
  Outputs RunBatched(Lane* lane, const std::shared_ptr<LoadedModel>& loaded, std::map<std::string, Tensor> in,
                     const Deadline& deadline);
  void Executor(Lane* lane, int index);
  // The model's concurrent runs (LoadedModel::streams, else --streams), set on its lane (under lane->mu).
  void SetStreams(Lane* lane, const LoadedModel& loaded) {
    lane->streams = std::max(1, loaded.streams > 0 ? loaded.streams : options.streams);
  }
  // The oldest queued request an idle executor may start: one whose key no executor is gathering for.
  static std::deque<std::shared_ptr<Pending>>::iterator Startable(Lane* lane) {
    const std::vector<std::string>& forming = lane->forming;
    for (auto it = lane->queue.begin(); it != lane->queue.end(); ++it)
      if ((*it)->key.empty() || std::find(forming.begin(), forming.end(), (*it)->key) == forming.end()) return it;
    return lane->queue.end();
  }
  void RunBatch(Lane* lane, const std::vector<std::shared_ptr<Pending>>& batch);
};

Scheduler::Outputs Scheduler::Impl::RunDirect(Lane* lane, const std::shared_ptr<LoadedModel>& loaded,
                                              const std::map<std::string, Tensor>& inputs, const Deadline& deadline) {
  const auto enqueued = Clock::now();
  {
    std::unique_lock<std::mutex> lock(lane->mu);
    SetStreams(lane, *loaded);
    if (lane->running >= lane->streams) {
      if (lane->waiting >= options.max_queue)
        throw QueueFullError("model '" + loaded->name + "': the queue is full (" + std::to_string(options.max_queue) +
                             " requests waiting, --max-queue); retry later");
      ++lane->waiting;
      const bool free = WaitUntil(lane->done_cv, lock, deadline, [&] { return lane->running < lane->streams; });
      --lane->waiting;
      if (!free) throw Late(deadline, loaded->name, enqueued, "for a stream (--streams)");
    }
    ++lane->running;
  }
  struct Release {
    Lane* lane;
    ~Release() {
      std::lock_guard<std::mutex> lock(lane->mu);
      --lane->running;
      lane->done_cv.notify_all();
    }
  } release{lane};
  const auto start = Clock::now();
  Outputs outputs = RunWithin(*loaded->model, inputs, deadline);
  const auto end = Clock::now();
  int64_t rows = 1;
  if (!inputs.empty() && inputs.begin()->second.rank() > 0) rows = inputs.begin()->second.dim(0);
  std::lock_guard<std::mutex> lock(lane->metrics_mu);
  lane->last_ms = NowMs();
  lane->metrics.batch.Add(static_cast<double>(rows));
  lane->metrics.queue.Add(MicrosSince(enqueued, start));
  lane->metrics.compute.Add(MicrosSince(start, end));
  return outputs;
}

Scheduler::Outputs Scheduler::Impl::RunBatched(Lane* lane, const std::shared_ptr<LoadedModel>& loaded,
                                               std::map<std::string, Tensor> inputs, const Deadline& deadline) {
  auto pending = std::make_shared<Pending>();
  pending->loaded = loaded;
  pending->deadline = deadline;
  pending->key = BatchKey(*loaded, inputs, &pending->rows);
  pending->inputs = std::move(inputs);
  std::unique_lock<std::mutex> lock(lane->mu);
  if (static_cast<int>(lane->queue.size()) >= options.max_queue)
    throw QueueFullError("model '" + loaded->name + "': the queue is full (" + std::to_string(options.max_queue) +
                         " requests waiting, --max-queue); retry later");
  SetStreams(lane, *loaded);
  while (static_cast<int>(lane->executors.size()) < lane->streams) {
    const int index = static_cast<int>(lane->executors.size());
    lane->executors.emplace_back([this, lane, index] { Executor(lane, index); });
  }
  pending->enqueued = Clock::now();
  lane->queue.push_back(pending);
  lane->work_cv.notify_all();
  if (!WaitUntil(lane->done_cv, lock, deadline, [&] { return pending->done; })) {
    // Still queued: leave the queue unanswered by a run. Already taken by an executor: its run stops by itself.
    auto it = std::find(lane->queue.begin(), lane->queue.end(), pending);
    if (it != lane->queue.end()) {
      lane->queue.erase(it);
      throw Late(deadline, loaded->name, pending->enqueued, "in its queue");
    }
    lane->done_cv.wait(lock, [&] { return pending->done; });
  }
  if (pending->error) std::rethrow_exception(pending->error);
  return std::move(pending->outputs);
}

// Executor `index` of a lane takes work while index < lane->streams (a reload with fewer instances idles the rest).
void Scheduler::Impl::Executor(Lane* lane, int index) {
  std::unique_lock<std::mutex> lock(lane->mu);
  for (;;) {
    lane->work_cv.wait(lock,
                       [&] { return lane->stop || (index < lane->streams && Startable(lane) != lane->queue.end()); });
    auto start = Startable(lane);
    if (start == lane->queue.end()) {
      if (lane->stop && lane->queue.empty()) return;
      lane->work_cv.wait(lock);  // stopping: wait for the gathering executors to take the rest
      continue;
    }
    std::vector<std::shared_ptr<Pending>> batch{*start};
    lane->queue.erase(start);
    const Pending& head = *batch[0];
    const BatchingSpec& spec = head.loaded->directory.batching;
    int64_t rows = head.rows;
    if (!head.key.empty()) {
      lane->forming.push_back(head.key);
      const auto deadline = head.enqueued + std::chrono::microseconds(spec.max_queue_delay_us);
      for (;;) {
        for (auto it = lane->queue.begin(); it != lane->queue.end() && rows < spec.max_batch_size;) {
          if ((*it)->key == head.key && rows + (*it)->rows <= spec.max_batch_size) {
            rows += (*it)->rows;
            batch.push_back(*it);
            it = lane->queue.erase(it);
          } else {
            ++it;
          }
        }
        if (rows >= spec.max_batch_size || lane->stop || Clock::now() >= deadline) break;
        lane->work_cv.wait_until(lock, deadline);
      }
      lane->forming.erase(std::find(lane->forming.begin(), lane->forming.end(), head.key));
      lane->work_cv.notify_all();  // another executor may now gather for this key
    }
    lock.unlock();
    RunBatch(lane, batch);
    lock.lock();
    for (const auto& p : batch) p->done = true;
    lane->done_cv.notify_all();
  }
}

// Runs one batch; fills each request's outputs or error (does not mark them done).
void Scheduler::Impl::RunBatch(Lane* lane, const std::vector<std::shared_ptr<Pending>>& taken) {
  const auto start = Clock::now();
  // Requests already past their deadline or cancelled are answered without running; the rest run with theirs (a
  // batch with the latest deadline of them, none if one has none, and cancelled only when all of them are: it stops
  // only when no request in it wants the answer any more).
  std::vector<std::shared_ptr<Pending>> batch;
  for (const auto& p : taken) {
    if (p->deadline.set() && start >= p->deadline.at)
      p->error = std::make_exception_ptr(Late(p->deadline, lane->name, p->enqueued, "in its queue"));
    else if (p->deadline.Cancelled())
      p->error = std::make_exception_ptr(Gone(p->deadline, lane->name));
    else
      batch.push_back(p);
  }
  if (batch.empty()) return;
  Model& model = *batch[0]->loaded->model;
  std::vector<double> compute_us;
  std::vector<double> batch_rows;
  auto run_alone = [&](Pending* p) {
    const auto t0 = Clock::now();
    try {
      p->outputs = RunWithin(*p->loaded->model, p->inputs, p->deadline);
    } catch (...) {
      p->error = std::current_exception();
    }
    const double us = MicrosSince(t0, Clock::now());
    batch_rows.push_back(static_cast<double>(std::max<int64_t>(p->rows, 1)));
    return us;
  };
  if (batch.size() == 1) {
    compute_us.push_back(run_alone(batch[0].get()));
  } else {
    bool ok = false;
    int64_t total = 0;
    for (const auto& p : batch) total += p->rows;
    try {
      std::map<std::string, Tensor> joined;
      for (const auto& [name, t] : batch[0]->inputs) {
        std::vector<Tensor> parts;
        parts.reserve(batch.size());
        for (const auto& p : batch) parts.push_back(p->inputs.at(name));
        joined[name] = ConcatRows(parts);
      }
      Deadline latest;
      latest.at = batch[0]->deadline.at;
      bool all_can_cancel = true;
      for (const auto& p : batch) {
        if (p->deadline.at >= latest.at) {
          latest.at = p->deadline.at;
          latest.reason = p->deadline.reason;
        }
        all_can_cancel &= static_cast<bool>(p->deadline.cancelled);
      }
      if (all_can_cancel) {
        latest.cancel_reason = "every request of the batch was cancelled";
        latest.cancelled = [&batch] {
          return std::all_of(batch.begin(), batch.end(), [](const auto& p) { return p->deadline.Cancelled(); });
        };
      }
      Outputs outputs = RunWithin(model, joined, latest);
      const double us = MicrosSince(start, Clock::now());
      // Every output must carry the batch along dim 0 to be split; otherwise the requests run one by one.
      ok = true;
      for (const auto& [name, t] : outputs) ok &= t.rank() > 0 && t.dim(0) == total;
      if (ok) {
        int64_t offset = 0;
        for (const auto& p : batch) {
          p->outputs.clear();
          for (const auto& [name, t] : outputs) p->outputs.emplace_back(name, SliceRows(t, offset, p->rows));
          offset += p->rows;
        }
        batch_rows.push_back(static_cast<double>(total));
        compute_us.assign(batch.size(), us);
      }
    } catch (...) {
      ok = false;  // a batched failure is retried per request, so each gets its own answer
    }
    if (!ok)
      for (const auto& p : batch) compute_us.push_back(run_alone(p.get()));
  }
  std::lock_guard<std::mutex> lock(lane->metrics_mu);
  lane->last_ms = NowMs();
  for (double r : batch_rows) lane->metrics.batch.Add(r);
  for (size_t i = 0; i < batch.size(); ++i) {
    lane->metrics.queue.Add(MicrosSince(batch[i]->enqueued, start));
    lane->metrics.compute.Add(i < compute_us.size() ? compute_us[i] : 0.0);
  }
}

Scheduler::Scheduler(SchedulerOptions options) : options_(options), impl_(std::make_unique<Impl>()) {
  if (options_.streams < 1) options_.streams = 1;
  if (options_.max_queue < 1) options_.max_queue = 1;
  impl_->options = options_;
}

Scheduler::~Scheduler() {
  std::lock_guard<std::mutex> lanes_lock(impl_->lanes_mu);
  for (auto& [name, lane] : impl_->lanes) {
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stop = true;
      lane->work_cv.notify_all();
    }
    for (std::thread& t : lane->executors) t.join();
  }
}

Scheduler::Outputs Scheduler::Run(const std::shared_ptr<LoadedModel>& loaded, std::map<std::string, Tensor> inputs,
                                  const Deadline& deadline) {
  Lane* lane = impl_->LaneFor(loaded->name);
  if (loaded->directory.batching.max_batch_size > 0)
    return impl_->RunBatched(lane, loaded, std::move(inputs), deadline);
  return impl_->RunDirect(lane, loaded, inputs, deadline);
}

Scheduler::Counters Scheduler::ModelCounters(const std::string& model) {
  Counters c;
  std::lock_guard<std::mutex> lanes_lock(impl_->lanes_mu);
  auto it = impl_->lanes.find(model);
  if (it == impl_->lanes.end()) return c;
  {
    std::lock_guard<std::mutex> lock(it->second->mu);
    c.pending = static_cast<uint64_t>(it->second->waiting) + it->second->queue.size();
  }
  std::lock_guard<std::mutex> lock(it->second->metrics_mu);
  const LaneMetrics& m = it->second->metrics;
  c.executions = m.batch.count;
  c.inferences = static_cast<uint64_t>(m.batch.sum);
  c.requests = m.compute.count;
  c.queue_us = m.queue.sum;
  c.compute_us = m.compute.sum;
  c.last_ms = it->second->last_ms;
  return c;
}

std::string Scheduler::MetricsText() {
  std::vector<std::pair<std::string, LaneMetrics>> snapshot;
  {
    std::lock_guard<std::mutex> lanes_lock(impl_->lanes_mu);
    for (auto& [name, lane] : impl_->lanes) {
      std::lock_guard<std::mutex> lock(lane->metrics_mu);
      snapshot.emplace_back(name, lane->metrics);
    }
  }
  std::ostringstream out;
  const struct {
    const char* name;
    const char* help;
    Histogram LaneMetrics::*member;
  } families[] = {
      {"osprey_batch_size", "Rows per model run (requests batched together).", &LaneMetrics::batch},
      {"osprey_queue_duration_us", "Time a request waited for its run, microseconds.", &LaneMetrics::queue},
      {"osprey_compute_duration_us", "Model run time of a request (its batch's), microseconds.", &LaneMetrics::compute},
  };
  for (const auto& family : families) {
    out << "# HELP " << family.name << " " << family.help << "\n# TYPE " << family.name << " histogram\n";
    for (const auto& [name, m] : snapshot) (m.*family.member).Write(out, family.name, PrometheusLabel(name));
  }
  return out.str();
}

}  // namespace osprey::serve
