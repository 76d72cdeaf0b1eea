// osprey bench MODEL [--batch N] [--threads T] [--warmup W] [--iters N] [--json] [--profile [--top N]] [--streams S]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <exception>
#include <numeric>
#include <thread>

#include "cli/common.h"
#include "osprey/onnx.h"

namespace osprey::cli {

namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

double Round3(double v) { return std::round(v * 1000.0) / 1000.0; }

// "bf16 in 40 of 53 Conv/Gemm/MatMul kernels (the others fp32)": what --precision bf16 / auto chose, from the plan's
// kernel names (the bf16 kernels are named *Bf16*, their fp32 twins *F32*; GemvF32, the one-row product, is fp32).
std::string Bf16Summary(const std::map<std::string, int>& kernels) {
  int bf16 = 0, f32 = 0;
  for (const auto& [name, n] : kernels) {
    const bool family = name.rfind("Conv", 0) == 0 || name.rfind("Gemm", 0) == 0 || name.rfind("MatMul", 0) == 0 ||
                        name == "GemvF32";
    if (family && name.find("Bf16Dnnl") != std::string::npos) bf16 += n;
    if (family && name.find("F32") != std::string::npos) f32 += n;
  }
  return "bf16 in " + std::to_string(bf16) + " of " + std::to_string(bf16 + f32) +
         " Conv/Gemm/MatMul kernels (the others fp32: faster here, or no bf16 kernel)";
}

// The inputs given as files (--input), and random ones for every other graph input, with `batch` in the first dim
// where that dim is symbolic.
std::map<std::string, Tensor> BenchInputs(const Graph& graph, const BenchOptions& options, int64_t* batch_used) {
  std::map<std::string, int64_t> dims = ParseDimOverrides(options.dims);
  std::map<std::string, Tensor> inputs = ReadInputFiles(graph, options.inputs);
  uint64_t rng = options.seed;
  int64_t batch = options.batch > 0 ? options.batch : 0;
  // The batch symbol takes the batch size wherever it appears, so inputs that share it stay consistent.
  if (options.batch > 0)
    for (const ValueInfo& info : graph.input_infos)
      if (!info.dims.empty() && info.dims[0].value < 0 && info.dims[0].symbol != "?")
        dims.emplace(info.dims[0].symbol, options.batch);
  for (const ValueInfo& info : graph.input_infos) {
    if (inputs.count(info.name)) {
      if (batch == 0 && inputs[info.name].rank() > 0) batch = inputs[info.name].shape()[0];
      continue;
    }
    Shape shape = ConcreteInputShape(info, dims);
    if (!info.dims.empty()) {
      const Dim& first = info.dims[0];
      if (first.value < 0) {
        if (options.batch > 0) shape[0] = options.batch;
      } else if (options.batch > 0 && first.value != options.batch) {
        throw Error(ErrorCode::kInvalidArgument, "--batch " + std::to_string(options.batch) + ": input '" + info.name +
                                                     "' has a fixed batch dim of " + std::to_string(first.value) + " " +
                                                     info.ShapeString());
      }
      if (batch == 0) batch = shape[0];
    }
    inputs[info.name] = RandomInput(info.dtype, shape, &rng);
  }
  *batch_used = batch > 0 ? batch : 1;
  return inputs;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Throughput mode: `streams` threads share the one compiled `model` (Model::Run is thread-safe); each runs `warmup`
// untimed then `iters` timed runs. All streams start timing together (after every stream's warmup); wall time ends
// when the last one finishes.
int RunStreams(Model& model, const std::map<std::string, Tensor>& inputs, const BenchOptions& options,
               int64_t batch, double first_run_ms, std::ostream& out) {
  const int streams = options.streams;
  std::vector<std::vector<double>> times(streams);
  std::vector<std::exception_ptr> errors(streams);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::chrono::steady_clock::time_point wall_start;
  std::vector<std::thread> threads;
  threads.reserve(streams);
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      try {
        for (int i = 0; i < options.warmup; ++i) model.Run(inputs);
      } catch (...) {
        errors[s] = std::current_exception();
      }
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      if (errors[s]) return;
      try {
        times[s].reserve(options.iters);
        for (int i = 0; i < options.iters; ++i) {
          auto start = std::chrono::steady_clock::now();
          model.Run(inputs);
          times[s].push_back(MsSince(start));
        }
      } catch (...) {
        errors[s] = std::current_exception();
      }
    });
  }
  while (ready.load() < streams) std::this_thread::yield();
  wall_start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();
  double wall_ms = MsSince(wall_start);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);

  std::vector<double> medians, all;
  for (const std::vector<double>& t : times) {
    medians.push_back(Median(t));
    all.insert(all.end(), t.begin(), t.end());
  }
  const double images = static_cast<double>(batch) * streams * options.iters;
  const double images_per_s = wall_ms > 0 ? images * 1000.0 / wall_ms : 0.0;
  const double median_all = Median(all);
  const int threads_per_stream = EffectiveThreads(options.threads);

  if (options.json) {
    nlohmann::json j;
    j["model"] = options.model;
    j["batch"] = batch;
    j["streams"] = streams;
    j["threads"] = threads_per_stream;
    j["warmup"] = options.warmup;
    j["iters"] = options.iters;
    j["first_run_ms"] = Round3(first_run_ms);
    j["wall_ms"] = Round3(wall_ms);
    j["images_per_s"] = Round3(images_per_s);
    j["median_ms"] = Round3(median_all);
    nlohmann::json per = nlohmann::json::array();
    for (double m : medians) per.push_back(Round3(m));
    j["stream_median_ms"] = per;
    j["reference"] = options.reference;
    j["precision"] = options.precision;
    j["device"] = options.device;
    out << j.dump() << "\n";
    return 0;
  }
  out << "model:       " << options.model << "\n";
  out << "batch:       " << batch << "   streams: " << streams << " x threads: " << threads_per_stream
      << "   warmup: " << options.warmup << "   iters per stream: " << options.iters
      << (options.reference ? "   (reference kernels)" : "") << "\n";
  out << "first run:   " << Fixed(first_run_ms, 2) << " ms (compile + run)\n";
  out << "throughput:  " << Fixed(images_per_s, 1) << " images/s (" << Fixed(images, 0) << " images in "
      << Fixed(wall_ms, 1) << " ms wall)\n";
  out << "latency:     median " << Fixed(median_all, 3) << " ms over all streams; per stream:";
  for (double m : medians) out << " " << Fixed(m, 3);
  out << " ms\n";
  return 0;
}

struct NodeTotal {
  std::string name, op_type, kernel;
  double ms = 0;
};

}  // namespace

int RunBench(const BenchOptions& options, std::ostream& out) {
  if (options.iters < 1) throw Error(ErrorCode::kInvalidArgument, "--iters must be at least 1");
  if (options.warmup < 0) throw Error(ErrorCode::kInvalidArgument, "--warmup must be >= 0");
  if (options.batch < 0) throw Error(ErrorCode::kInvalidArgument, "--batch must be at least 1");
  if (options.streams < 0 || options.streams > 1024)
    throw Error(ErrorCode::kInvalidArgument, "--streams must be in 1..1024, got " + std::to_string(options.streams));
  if (options.streams > 0 && options.profile)
    throw Error(ErrorCode::kInvalidArgument, "--profile cannot be combined with --streams");
  if (!(options.gap_ms >= 0 && options.gap_ms <= 60000))
    throw Error(ErrorCode::kInvalidArgument, "--gap-ms must be in 0..60000");
  if (options.streams > 0 && options.gap_ms > 0)
    throw Error(ErrorCode::kInvalidArgument, "--gap-ms is for latency mode, not --streams");
  Graph graph = LoadOnnxModel(options.model);
  int64_t batch = 1;
  std::map<std::string, Tensor> inputs = BenchInputs(graph, options, &batch);

  ModelOptions model_options;
  model_options.compile.num_threads = options.threads;
  model_options.compile.precision = ParsePrecision(options.precision, "--precision");
  model_options.compile.device = ParseDevice(options.device, "--device");
  if (options.reference) {
    model_options.compile.fast_kernels = false;
    model_options.compile.fuse = false;
  }
  Model model(std::move(graph), model_options);

  auto start = std::chrono::steady_clock::now();
  model.Run(inputs);
  double first_run_ms = MsSince(start);
  if (options.streams > 0) return RunStreams(model, inputs, options, batch, first_run_ms, out);
  for (int i = 0; i < options.warmup; ++i) model.Run(inputs);

  std::vector<double> times;
  times.reserve(options.iters);
  std::vector<OpProfile> profile;
  std::map<std::string, double> op_type_ms;
  std::map<std::string, int> op_type_nodes;
  std::map<std::pair<std::string, std::string>, NodeTotal> node_ms;
  for (int i = 0; i < options.iters; ++i) {
    profile.clear();
    if (options.gap_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options.gap_ms));
    start = std::chrono::steady_clock::now();
    model.Run(inputs, options.profile ? &profile : nullptr);
    times.push_back(MsSince(start));
    for (const OpProfile& p : profile) {
      op_type_ms[p.op_type] += p.ms;
      if (i == 0) ++op_type_nodes[p.op_type];
      NodeTotal& n = node_ms[{p.node_name, p.op_type}];
      n.name = p.node_name;
      n.op_type = p.op_type;
      n.kernel = p.kernel;
      n.ms += p.ms;
    }
  }

  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  size_t n = sorted.size();
  double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  size_t p90_index = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(n))) - 1;
  double p90 = sorted[std::min(p90_index, n - 1)];
  double min = sorted.front();
  double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(n);
  double images_per_s = median > 0 ? static_cast<double>(batch) * 1000.0 / median : 0.0;
  int threads = EffectiveThreads(options.threads);

  std::vector<std::pair<std::string, double>> by_type(op_type_ms.begin(), op_type_ms.end());
  std::sort(by_type.begin(), by_type.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<NodeTotal> by_node;
  for (auto& [key, total] : node_ms) by_node.push_back(total);
  std::sort(by_node.begin(), by_node.end(), [](const NodeTotal& a, const NodeTotal& b) { return a.ms > b.ms; });
  if (options.top > 0 && by_node.size() > static_cast<size_t>(options.top)) by_node.resize(options.top);
  double profiled_total = 0;
  for (const auto& [op, ms] : by_type) profiled_total += ms;
  const double iters = options.iters;

  if (options.json) {
    nlohmann::json j;
    j["model"] = options.model;
    j["batch"] = batch;
    j["threads"] = threads;
    j["warmup"] = options.warmup;
    j["iters"] = options.iters;
    j["gap_ms"] = options.gap_ms;
    j["first_run_ms"] = Round3(first_run_ms);
    j["median_ms"] = Round3(median);
    j["p90_ms"] = Round3(p90);
    j["min_ms"] = Round3(min);
    j["mean_ms"] = Round3(mean);
    j["images_per_s"] = Round3(images_per_s);
    j["reference"] = options.reference;
    j["precision"] = options.precision;
    j["device"] = DeviceSpecName(model_options.compile.device);
    if (auto plan = model.PlanFor(inputs)) {
      j["steps"] = plan->num_steps();
      j["device_steps"] = plan->num_device_steps();
      j["copy_steps"] = plan->num_copy_steps();
      j["host_fallback_ops"] = plan->HostFallbackOps();
      j["kernels"] = plan->KernelCounts();
      j["single_thread_steps"] = plan->num_single_thread_steps();
    }
    const TuningCounts tc = KernelTuningCounts();
    j["tuning"] = {{"cached", tc.cached}, {"timed", tc.timed}, {"provisional", tc.provisional}, {"kept", tc.kept}};
    if (options.profile) {
      nlohmann::json types = nlohmann::json::array();
      for (const auto& [op, ms] : by_type)
        types.push_back({{"op_type", op},
                         {"nodes", op_type_nodes[op]},
                         {"ms_per_iter", Round3(ms / iters)},
                         {"percent", Round3(profiled_total > 0 ? 100.0 * ms / profiled_total : 0)}});
      nlohmann::json nodes = nlohmann::json::array();
      for (const NodeTotal& t : by_node)
        nodes.push_back(
            {{"node", t.name}, {"op_type", t.op_type}, {"kernel", t.kernel}, {"ms_per_iter", Round3(t.ms / iters)}});
      j["profile"] = {{"op_types", types}, {"top_nodes", nodes}};
    }
    out << j.dump() << "\n";
    return 0;
  }

  out << "model:       " << options.model << "\n";
  out << "batch:       " << batch << "   threads: " << threads << "   warmup: " << options.warmup
      << "   iters: " << options.iters << (options.reference ? "   (reference kernels)" : "")
      << (options.precision != "fp32" ? "   precision: " + options.precision : "")
      << (options.gap_ms > 0 ? "   idle before each: " + Fixed(options.gap_ms, 1) + " ms" : "") << "\n";
  if (options.precision == "bf16" || options.precision == "auto") {
    if (auto plan = model.PlanFor(inputs)) out << "             " << Bf16Summary(plan->KernelCounts()) << "\n";
  }
  if (const TuningCounts tc = KernelTuningCounts(); tc.timed + tc.provisional + tc.kept > 0) {
    out << "tuning:      " << tc.timed + tc.provisional + tc.kept << " kernel choices timed now, " << tc.cached
        << " from the tuning cache";
    if (tc.provisional + tc.kept > 0)
      out << "; " << tc.provisional + tc.kept << " timed under CPU load (provisional: timed again next time)";
    out << "\n";
  }
  if (auto plan = model.PlanFor(inputs); plan && plan->num_single_thread_steps() > 0)
    out << "threads:     " << plan->num_single_thread_steps() << " small step(s) on one thread (timed faster than on "
        << threads << ")\n";
  if (model_options.compile.device.kind != Device::kHost) {
    auto plan = model.PlanFor(inputs);
    out << "device:      " << DeviceSpecName(model_options.compile.device) << "   steps: " << plan->num_steps()
        << " (on the device: " << plan->num_device_steps() << ", copies: " << plan->num_copy_steps() << ")\n";
    const auto fallback = plan->HostFallbackOps();
    if (!fallback.empty()) {
      out << "on the CPU:  ";
      for (const auto& [op, n] : fallback) out << op << " x" << n << "  ";
      out << "(no CUDA kernel for their dtype, attributes or op)\n";
    }
  }
  out << "first run:   " << Fixed(first_run_ms, 2) << " ms (compile + run)\n";
  out << "latency:     median " << Fixed(median, 3) << " ms   p90 " << Fixed(p90, 3) << " ms   min " << Fixed(min, 3)
      << " ms   mean " << Fixed(mean, 3) << " ms\n";
  out << "throughput:  " << Fixed(images_per_s, 1) << " images/s\n";
  if (options.profile) {
    out << "\ntime per op type (ms per iteration):\n";
    size_t width = 7;
    for (const auto& [op, ms] : by_type) width = std::max(width, op.size());
    for (const auto& [op, ms] : by_type)
      out << "  " << std::left << std::setw(static_cast<int>(width)) << op << std::right << std::setw(10)
          << Fixed(ms / iters, 3) << " ms " << std::setw(6)
          << Fixed(profiled_total > 0 ? 100 * ms / profiled_total : 0, 1) << "%  (" << op_type_nodes[op] << " nodes)\n";
    out << "\n" << (options.top > 0 ? "top " + std::to_string(by_node.size()) : std::string("all"))
        << " nodes (ms per iteration):\n";
    size_t name_width = 4, type_width = 7;
    for (const NodeTotal& t : by_node) {
      name_width = std::max(name_width, t.name.size());
      type_width = std::max(type_width, t.op_type.size());
    }
    for (const NodeTotal& t : by_node)
      out << "  " << std::left << std::setw(static_cast<int>(name_width)) << t.name << "  "
          << std::setw(static_cast<int>(type_width)) << t.op_type << std::right << std::setw(10)
          << Fixed(t.ms / iters, 3) << " ms  " << t.kernel << "\n";
  }
  return 0;
}

}  // namespace osprey::cli
