// osprey serve --model-repository DIR [--host H] [--port P] [--memory-budget SIZE] [--idle-unload S] [--load M ...]
//              [--streams S] [--threads T] [--max-queue N] [--http-threads N] [--max-body-size SIZE]
//              [--max-request-memory SIZE] [--read-timeout S] [--workers N] [--max-batch-size N] [--max-images N]
//              [--max-request-megapixels N]
//              [--max-request-seconds S]
#include "cli/serve.h"

#include <malloc.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "cli/common.h"
#include "osprey/error.h"
#include "serve/grpc_server.h"
#include "serve/http_server.h"
#include "serve/log.h"
#include "serve/model_manager.h"
#include "serve/request_memory.h"
#include "serve/responses.h"
#include "serve/server.h"

namespace osprey::cli {

namespace {

struct ServeCommandOptions {
  std::string repository;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = -1;
  int metrics_port = -1;
  std::string memory_budget = "0";
  std::string gpu_memory_budget = "0";
  std::string memory_budget_rss = "on";
  std::string device = "cpu";
  std::string precision = "fp32";  // default of models whose config.json has no "precision"
  double idle_unload = 0;
  double arena_idle = 2;
  std::vector<std::string> load;
  int threads = 0;
  int streams = 1;
  int max_queue = 256;
  int http_threads = 4;
  int workers = 4;
  std::string log_level = "info";
  std::string log_format = "text";
  bool access_log = false;
  bool allow_shared_memory = false;
  int max_shared_memory_regions = 64;
  serve::RequestLimits limits;
  std::string max_body_size = "64M";
  std::string max_request_memory = "1G";
  double read_timeout = 30;
  serve::TrainingOptions training;
};

ServeCommandOptions& Options() {
  static ServeCommandOptions options;
  return options;
}

// The curl example for the start line: the demo model's sample when the repository has it, else the first model's
// metadata (MODEL when the repository is empty).
std::string CurlExample(const std::string& url, const std::vector<serve::ModelIndexEntry>& index,
                        const std::string& repository) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : index) {
    const fs::path sample = fs::path(repository) / entry.name / "samples" / "3_0.png";
    if (entry.name == "digits" && fs::exists(sample, ec))  // the demo repository: a classification to paste
      return "curl -s -H 'Content-Type: image/png' --data-binary @" + sample.string() + " " + url +
             "/v2/models/digits/classify";
  }
  // Any other model may not be an image classifier: its KServe metadata (inputs, outputs) always answers.
  const std::string model = index.empty() ? "MODEL" : index.front().name;
  return "curl -s " + url + "/v2/models/" + model + " (its inputs and outputs; then POST tensors to .../infer, or "
         "images to .../classify for a classifier)";
}

}  // namespace

int64_t ParseByteSize(const std::string& text, const std::string& flag) {
  auto bad = [&]() {
    return Error(ErrorCode::kInvalidArgument,
                 flag + ": expected a size such as 512M, 2G or 1048576 (bytes), got '" + text + "'");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0 || i > 24) throw bad();
  double value;
  try {
    size_t pos = 0;
    value = std::stod(text.substr(0, i), &pos);
    if (pos != i) throw bad();
  } catch (const std::logic_error&) {
    throw bad();
  }
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double scale = 1;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K")
    scale = 1024.0;
  else if (unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad();
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 0) || bytes > 9.0e18) throw bad();
  return static_cast<int64_t>(bytes);
}

ServeCommand InProcessServe() {
  return {AddServeCommand, [] { return RunServeCommand(std::cout); }};
}

CLI::App* AddServeCommand(CLI::App& app) {
  CLI::App* serve =
      app.add_subcommand("serve", "Serve a model repository (KServe v2 REST and gRPC, Triton extensions, classify)");
  AddServeOptions(serve);
  return serve;
}

void AddServeOptions(CLI::App* serve) {
  ServeCommandOptions& o = Options();
  serve->add_option("--model-repository", o.repository, "Directory of <name>/<version>/model.onnx")->required();
  serve->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  serve->add_option("--port", o.port, "Port (0 = any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  serve->add_option("--grpc-port", o.grpc_port,
                    "Also serve the KServe v2 gRPC API on this port (Triton's default: 8001; 0 = any free port; "
                    "-1 = no gRPC)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  serve
      ->add_option("--metrics-port", o.metrics_port,
                   "Also serve GET /metrics alone on this port, as Triton does (its default: 8002; 0 = any free port; "
                   "-1 = only on --port)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  serve
      ->add_option("--memory-budget", o.memory_budget,
                   "Memory for models, e.g. 512M, 2G (0 = none): least recently used idle models are unloaded to keep "
                   "their accounted bytes under it, and the process's resident memory under it + 10% + 20 MiB")
      ->capture_default_str();
  serve
      ->add_option("--memory-budget-rss", o.memory_budget_rss,
                   "on: --memory-budget also keeps the process's resident memory (RSS) under it + 10% + 20 MiB; off: "
                   "only the models' accounted bytes (a process whose RSS holds more than the server: Python, other "
                   "libraries)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  serve->add_option("--device", o.device,
                    "Where models run unless their config.json says \"device\": cpu, cuda (= cuda:0) or cuda:N. A GPU "
                    "no loaded model uses is given back (its CUDA context released: 0 MiB held)")
      ->capture_default_str();
  serve->add_option("--precision", o.precision,
                    std::string("Models whose config.json does not say \"precision\": ") + kPrecisionHelp)
      ->check(CLI::IsMember(PrecisionNames()))
      ->capture_default_str();
  serve->add_option("--gpu-memory-budget", o.gpu_memory_budget,
                    "GPU bytes of loaded models, e.g. 8G (0 = none): least recently used GPU models are unloaded past it")
      ->capture_default_str();
  serve->add_option("--idle-unload", o.idle_unload, "Unload models unused for this many seconds (0 = never)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  serve->add_option("--arena-idle", o.arena_idle,
                    "Free execution memory (arenas, shared by all models) unused for this many seconds, so a burst of "
                    "large requests does not pin it (0 = keep it: no re-allocation after a pause)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  serve->add_option("--load", o.load, "Load these models at start (repeatable)");
  serve->add_option("--threads", o.threads, "Intra-op threads per model run (0 = all cores)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  serve->add_option("--streams", o.streams, "Concurrent runs (requests or batches) per model, each with --threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  serve->add_option("--max-queue", o.max_queue,
                    "Requests waiting per model, and waiting for a worker; beyond it 503 with Retry-After")
      ->check(CLI::Range(1, INT_MAX))
      ->capture_default_str();
  serve->add_option("--http-threads", o.http_threads,
                    "HTTP I/O threads: they read, parse and write, and answer health and metrics themselves")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  serve->add_option("--workers", o.workers,
                    "Threads that run requests (infer, classify, metadata, repository); beyond them and --max-queue "
                    "waiting, 503 with Retry-After")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  serve->add_option("--max-batch-size", o.limits.max_batch_size,
                    "Rows (dim 0) per request for inputs with a variable batch dim; more get 413 (0 = no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  serve->add_option("--max-images", o.limits.max_images,
                    "Encoded images per request (BYTES inputs, classify parts); more get 413 (0 = no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  serve->add_option("--max-request-megapixels", o.limits.max_megapixels,
                    "Decoded megapixels per request, summed over its images (0 = no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  serve
      ->add_option("--max-request-seconds", o.limits.max_seconds,
                   "Seconds from a request's arrival to its answer: a request still queued then gets 504 without "
                   "running, a run past it stops at its next step (0 = no limit; a client may ask for less with "
                   "parameters.timeout in microseconds or a gRPC deadline)")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  serve->add_option("--log-level", o.log_level, "debug, info, warning, error or off (logs go to stderr)")
      ->capture_default_str();
  serve->add_option("--log-format", o.log_format, "text, or json (one object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  serve->add_flag("--access-log", o.access_log, "Log every request (method, path, model, status, bytes, microseconds); "
                                                "failed requests are always logged");
  serve->add_option("--max-body-size", o.max_body_size, "Largest request body; larger ones get 413")
      ->capture_default_str();
  serve
      ->add_option(
          "--max-request-memory", o.max_request_memory,
          "Request bytes held at once over all connections and both protocols (bodies as they arrive, "
          "waiting and running); a REST request that does not fit gets 503 with Retry-After (before its body "
          "is read when its Content-Length does not fit), a gRPC call UNAVAILABLE; also gRPC's memory quota for "
          "messages still arriving (at least 2 x --max-body-size + 16M; 0 = no limit)")
      ->capture_default_str();
  serve->add_option("--read-timeout", o.read_timeout, "Seconds a client may take to send a request or stay idle")
      ->check(CLI::Range(0.01, 1e6))
      ->capture_default_str();
  serve->add_flag("--allow-shared-memory", o.allow_shared_memory,
                  "Accept Triton's system shared memory extension (/v2/systemsharedmemory, its gRPC methods, "
                  "perf_analyzer --shared-memory system): clients on this host register POSIX shared memory objects "
                  "and pass tensors through them. Off by default: a client could then have the server read any "
                  "shared memory object the server's user can open");
  serve
      ->add_option("--max-shared-memory-regions", o.max_shared_memory_regions,
                   "Shared memory regions registered at once (each holds a file descriptor)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  serve->add_flag("--allow-training", o.training.enabled,
                  "Accept POST /v2/repository/models/{name}/train: a classifier head trained on a backbone of the "
                  "repository from uploaded images (docs/heads.md); uploads are bounded by --max-body-size");
  serve->add_option("--training-data-root", o.training.data_root,
                    "Folder under which training requests may name server-side datasets (default: uploads only)");
  serve->add_option("--max-training-images", o.training.max_images, "Images per training job")
      ->check(CLI::Range(int64_t{2}, int64_t{10'000'000}))
      ->capture_default_str();
  serve->add_option("--max-training-jobs", o.training.max_jobs, "Training jobs running at once (more get 503)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
}

int RunServeCommand(std::ostream& out) {
  const ServeCommandOptions& o = Options();
  serve::log::Options log_options;
  log_options.level = serve::log::ParseLevel(o.log_level);
  log_options.json = o.log_format == "json";
  log_options.access = o.access_log;
  serve::log::Configure(log_options);
  std::error_code ec;
  if (!std::filesystem::is_directory(o.repository, ec))
    throw Error(ErrorCode::kNotFound, "--model-repository: '" + o.repository + "' is not a directory");
  // Give every large allocation its own mapping, whichever thread makes it. glibc otherwise raises its mmap threshold
  // after the first large free and keeps later weight buffers inside per-thread arenas, where malloc_trim cannot
  // return them: measured ~50 MiB left resident after unloading five 16 MiB models (tests/serve/test_memory.py).
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  serve::ManagerOptions manager_options;
  manager_options.repository = o.repository;
  manager_options.memory_budget_bytes = ParseByteSize(o.memory_budget, "--memory-budget");
  manager_options.bound_resident = o.memory_budget_rss == "on";
  manager_options.idle_unload_seconds = o.idle_unload;
  manager_options.device = ParseDevice(o.device, "--device");
  manager_options.precision = ParsePrecision(o.precision, "--precision");
  manager_options.gpu_memory_budget_bytes = ParseByteSize(o.gpu_memory_budget, "--gpu-memory-budget");
  manager_options.arena_idle_seconds = o.arena_idle;
  manager_options.threads = o.threads;
  manager_options.max_batch_size = o.limits.max_batch_size;
  manager_options.streams = o.streams;
  serve::log::Event(serve::log::Level::kInfo, "start", "osprey serve " + std::string(kOspreyVersion) + " starting",
                    {{"repository", o.repository},
                     {"host", o.host},
                     {"port", o.port},
                     {"memory_budget", manager_options.memory_budget_bytes},
                     {"memory_budget_rss", o.memory_budget_rss},
                     {"device", o.device},
                     {"idle_unload_s", o.idle_unload},
                     {"threads", o.threads},
                     {"streams", o.streams},
                     {"workers", o.workers},
                     {"http_threads", o.http_threads},
                     {"max_queue", o.max_queue},
                     {"max_body_size", ParseByteSize(o.max_body_size, "--max-body-size")},
                     {"max_request_memory", ParseByteSize(o.max_request_memory, "--max-request-memory")},
                     {"max_batch_size", o.limits.max_batch_size},
                     {"max_images", o.limits.max_images},
                     {"max_request_megapixels", o.limits.max_megapixels},
                     {"max_request_seconds", o.limits.max_seconds},
                     {"access_log", o.access_log},
                     {"shared_memory", o.allow_shared_memory}});
  serve::ModelManager manager(manager_options);
  for (const std::string& model : o.load) manager.Load(model);

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (static_cast<int64_t>(o.streams) * (o.threads == 0 ? cores : o.threads) > cores)
    std::cerr << "osprey serve: warning: --streams " << o.streams << " x --threads "
              << (o.threads == 0 ? std::to_string(cores) + " (all cores)" : std::to_string(o.threads))
              << " exceeds the " << cores << " cores; runs will compete for them" << std::endl;
  serve::SchedulerOptions scheduling;
  scheduling.streams = o.streams;
  scheduling.max_queue = o.max_queue;
  serve::InferenceServer server(&manager, kOspreyVersion, scheduling, o.limits);
  if (o.training.enabled) {
    serve::TrainingOptions training = o.training;
    training.repository = o.repository;
    training.threads = o.threads;
    server.EnableTraining(training);
  }
  if (o.allow_shared_memory)
    server.EnableSharedMemory(static_cast<size_t>(o.max_shared_memory_regions),
                              static_cast<uint64_t>(ParseByteSize(o.max_body_size, "--max-body-size")));
  serve::HttpServerOptions http_options;
  http_options.host = o.host;
  http_options.port = o.port;
  http_options.io_threads = o.http_threads;
  http_options.max_body_bytes = ParseByteSize(o.max_body_size, "--max-body-size");
  http_options.read_timeout_seconds = o.read_timeout;
  http_options.worker_threads = o.workers;
  http_options.max_pending = o.max_queue;
  http_options.run_inline = serve::InferenceServer::RunsInline;
  http_options.lane = serve::InferenceServer::Lane;
  http_options.request_memory =
      std::make_shared<serve::RequestMemory>(ParseByteSize(o.max_request_memory, "--max-request-memory"));
  serve::HttpServer http(http_options, [&server](const serve::HttpRequest& r) { return server.Handle(r); });

  std::unique_ptr<serve::GrpcServer> grpc;
  if (o.grpc_port >= 0) {
    serve::GrpcServerOptions grpc_options;
    grpc_options.host = o.host;
    grpc_options.port = o.grpc_port;
    grpc_options.max_message_bytes = http_options.max_body_bytes;
    grpc_options.threads = o.workers;
    grpc_options.waiting = o.max_queue;
    grpc_options.request_memory = http_options.request_memory;
    grpc = std::make_unique<serve::GrpcServer>(&server, grpc_options);
  }
  // --metrics-port: a listener of its own that answers GET /metrics only (Prometheus scrape configs written for
  // Triton point at a port of their own), on one I/O thread, stopped with the main server.
  struct MetricsListener {
    std::unique_ptr<serve::HttpServer> server;
    std::thread thread;
    ~MetricsListener() {
      if (!server) return;
      server->Stop();
      if (thread.joinable()) thread.join();
    }
  } metrics_listener;
  if (o.metrics_port >= 0) {
    serve::HttpServerOptions metrics_options;
    metrics_options.host = o.host;
    metrics_options.port = o.metrics_port;
    metrics_options.io_threads = 1;
    metrics_options.max_body_bytes = 4096;
    metrics_options.read_timeout_seconds = o.read_timeout;
    metrics_options.stop_on_signals = false;
    metrics_listener.server =
        std::make_unique<serve::HttpServer>(metrics_options, [&server](const serve::HttpRequest& r) {
          const std::string path = r.target.substr(0, r.target.find('?'));
          if (path != "/metrics")
            return serve::ErrorResponse(404,
                                        "this port (--metrics-port) serves GET /metrics only; the API is on --port");
          return server.Handle(r);
        });
    metrics_listener.thread = std::thread([&metrics_listener] { metrics_listener.server->Run(); });
  }
  const serve::HttpServer* metrics = metrics_listener.server.get();
  const std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  const std::string url = "http://" + host + ":" + std::to_string(http.port());
  const std::vector<serve::ModelIndexEntry> index = manager.Index();
  out << "osprey serve: listening on " << url << " (" << index.size() << " model(s) in " << o.repository << ")"
      << (grpc ? ", gRPC on " + host + ":" + std::to_string(grpc->port()) : std::string())
      << (metrics ? ", metrics on " + host + ":" + std::to_string(metrics->port()) : std::string())
      << "; try: " << CurlExample(url, index, o.repository) << std::endl;
  http.Run();
  if (grpc) grpc->Shutdown();
  out << "osprey serve: stopped" << std::endl;
  return 0;
}

}  // namespace osprey::cli
