// GET /metrics: Prometheus text of the server's request metrics, model manager counters, memory and the scheduler's
// histograms, and Triton's metric families (nv_*) for the dashboards, alerts and tools written against Triton.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "serve/server_impl.h"

namespace osprey::serve {
namespace {

// "model=\"m\",version=\"v\"" for one index entry.
std::string TritonLabels(const ModelIndexEntry& entry) {
  return "model=\"" + PrometheusLabel(entry.name) + "\",version=\"" + PrometheusLabel(entry.version) + "\"";
}

std::string Number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// /proc/meminfo's MemTotal and MemAvailable, bytes (0 when unreadable).
std::pair<uint64_t, uint64_t> MemoryTotalAndAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0, total = 0, available = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemTotal:") total = value * 1024;
    if (key == "MemAvailable:") available = value * 1024;
  }
  return {total, available};
}

// Triton's per-model families (its metric names, types and labels; docs/serving.md, "Metrics"), then its CPU ones.
void WriteTritonFamilies(std::ostringstream& out, InferenceServer::Impl& impl,
                         const std::vector<ModelIndexEntry>& index) {
  std::vector<std::pair<const ModelIndexEntry*, InferenceServer::Impl::Activity>> rows;
  for (const ModelIndexEntry& entry : index) {
    InferenceServer::Impl::Activity a = impl.ActivityOf(entry.name);
    if (entry.status == ModelStatus::kReady || a.requests.success + a.requests.failure > 0)
      rows.emplace_back(&entry, std::move(a));
  }
  using Activity = InferenceServer::Impl::Activity;
  const struct {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const Activity&);
  } families[] = {
      {"nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
       [](const Activity& a) { return static_cast<double>(a.requests.success); }},
      {"nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
       [](const Activity& a) { return static_cast<double>(a.requests.failure); }},
      {"nv_inference_count", "counter", "Number of inferences performed (a batch of n counts n)",
       [](const Activity& a) { return static_cast<double>(a.runs.inferences); }},
      {"nv_inference_exec_count", "counter", "Number of model executions performed (a batch counts once)",
       [](const Activity& a) { return static_cast<double>(a.runs.executions); }},
      {"nv_inference_pending_request_count", "gauge", "Instantaneous number of requests waiting to run",
       [](const Activity& a) { return static_cast<double>(a.runs.pending); }},
      {"nv_inference_request_duration_us", "counter",
       "Cumulative inference request duration of successful "
       "requests in microseconds (decoding, queue and run)",
       [](const Activity& a) { return a.requests.success_us; }},
      {"nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
       [](const Activity& a) { return a.runs.queue_us; }},
      {"nv_inference_compute_input_duration_us", "counter",
       "Cumulative compute input duration in microseconds (osprey decodes inputs before the queue: 0)",
       [](const Activity&) { return 0.0; }},
      {"nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
       [](const Activity& a) { return a.runs.compute_us; }},
      {"nv_inference_compute_output_duration_us", "counter",
       "Cumulative inference compute output duration in microseconds (outputs are encoded after the run: 0)",
       [](const Activity&) { return 0.0; }},
  };
  for (const auto& family : families) {
    out << "# HELP " << family.name << " " << family.help << "\n# TYPE " << family.name << " " << family.type << "\n";
    for (const auto& [entry, activity] : rows)
      out << family.name << "{" << TritonLabels(*entry) << "} " << Number(family.value(activity)) << "\n";
  }
  const auto [total, available] = MemoryTotalAndAvailable();
  out << "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0], all cores, since the previous scrape\n"
      << "# TYPE nv_cpu_utilization gauge\n"
      << "nv_cpu_utilization " << Number(impl.CpuUtilization()) << "\n"
      << "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes\n"
      << "# TYPE nv_cpu_memory_total_bytes gauge\n"
      << "nv_cpu_memory_total_bytes " << total << "\n"
      << "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes\n"
      << "# TYPE nv_cpu_memory_used_bytes gauge\n"
      << "nv_cpu_memory_used_bytes " << (total > available ? total - available : 0) << "\n";
}

}  // namespace

double InferenceServer::Impl::CpuUtilization() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return 0;
  const uint64_t idle_all = idle + iowait;
  const uint64_t total = user + nice + system + idle_all + irq + softirq + steal;
  const uint64_t busy = total - idle_all;
  std::lock_guard<std::mutex> lock(cpu_mu);
  const uint64_t d_total = total - cpu_total, d_busy = busy - cpu_busy;
  cpu_total = total;
  cpu_busy = busy;
  if (d_total == 0 || d_busy > d_total) return 0.0;
  return static_cast<double>(d_busy) / static_cast<double>(d_total);
}

std::string InferenceServer::MetricsText() {
  Impl& impl = *impl_;
  std::ostringstream out;
  std::map<std::string, RequestMetrics> snapshot;
  {
    std::lock_guard<std::mutex> lock(impl.metrics_mu);
    snapshot = impl.metrics;
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
  const ManagerStats stats = impl.manager->Stats();
  const std::vector<ModelIndexEntry> index = impl.manager->Index();
  const std::pair<const char*, uint64_t> counters[] = {{"osprey_model_loads_total", stats.loads},
                                                       {"osprey_model_unloads_total", stats.unloads},
                                                       {"osprey_model_evictions_total", stats.evictions},
                                                       {"osprey_model_load_failures_total", stats.load_failures}};
  for (const auto& [name, value] : counters) out << "# TYPE " << name << " counter\n" << name << " " << value << "\n";
  out << "# HELP osprey_accounted_bytes Accounted weight bytes of each loaded model (shared weights in each).\n"
      << "# TYPE osprey_accounted_bytes gauge\n";
  for (const ModelIndexEntry& entry : index)
    if (entry.status == ModelStatus::kReady)
      out << "osprey_accounted_bytes{model=\"" << PrometheusLabel(entry.name) << "\"} " << entry.weight_bytes << "\n";
  out << "# HELP osprey_model_runtime_bytes Execution arenas and plan-private constants of each loaded model.\n"
      << "# TYPE osprey_model_runtime_bytes gauge\n";
  for (const ModelIndexEntry& entry : index)
    if (entry.status == ModelStatus::kReady)
      out << "osprey_model_runtime_bytes{model=\"" << PrometheusLabel(entry.name) << "\"} " << entry.runtime_bytes
          << "\n";
  out << "# HELP osprey_model_device_bytes GPU bytes of each loaded model: device arenas and its weights' device "
         "copies (shared ones counted for each model).\n"
      << "# TYPE osprey_model_device_bytes gauge\n";
  for (const ModelIndexEntry& entry : index)
    if (entry.status == ModelStatus::kReady)
      out << "osprey_model_device_bytes{model=\"" << PrometheusLabel(entry.name) << "\"} " << entry.device_bytes
          << "\n";
  {
    std::vector<std::pair<std::string, PlanCache::Stats>> plan_stats;
    {
      std::lock_guard<std::mutex> lock(impl.served_mu);
      for (auto it = impl.served.begin(); it != impl.served.end();) {
        if (std::shared_ptr<LoadedModel> loaded = it->second.lock()) {
          plan_stats.emplace_back(it->first, loaded->model->plan_cache().stats());
          ++it;
        } else {
          it = impl.served.erase(it);  // unloaded: its counters went with it
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
      << "osprey_accounted_bytes_total " << stats.accounted_bytes << "\n"
      << "# HELP osprey_device_bytes GPU bytes osprey holds (weights' device copies, device arenas).\n"
      << "# TYPE osprey_device_bytes gauge\n"
      << "osprey_device_bytes " << stats.device_bytes << "\n"
      << "# HELP osprey_device_releases_total GPU contexts released because no loaded model used the device.\n"
      << "# TYPE osprey_device_releases_total counter\n"
      << "osprey_device_releases_total " << stats.device_releases << "\n";
  out << "# HELP osprey_shared_execution_bytes Idle execution arenas and kernels' per-thread scratch, shared by every "
         "model, in the accounted bytes, freed after --arena-idle seconds unused.\n"
      << "# TYPE osprey_shared_execution_bytes gauge\n"
      << "osprey_shared_execution_bytes " << SharedArenaBytes() << "\n";
  const int64_t budget = impl.manager->options().memory_budget_bytes;
  out << "# HELP osprey_memory_budget_bytes --memory-budget: the accounted bytes loaded models are kept under (0 = "
         "none).\n"
      << "# TYPE osprey_memory_budget_bytes gauge\n"
      << "osprey_memory_budget_bytes " << budget << "\n"
      << "# HELP osprey_resident_ceiling_bytes Resident memory the server evicts idle models to stay under: the budget "
         "+ 10% + 20 MiB (0 = none, or --memory-budget-rss off).\n"
      << "# TYPE osprey_resident_ceiling_bytes gauge\n"
      << "osprey_resident_ceiling_bytes " << ResidentCeiling(impl.manager->options()) << "\n";
  out << "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
      << "# TYPE process_resident_memory_bytes gauge\n"
      << "process_resident_memory_bytes " << ProcessResidentBytes() << "\n";
  out << impl.scheduler->MetricsText();
  WriteTritonFamilies(out, impl, index);
  return out.str();
}

}  // namespace osprey::serve
