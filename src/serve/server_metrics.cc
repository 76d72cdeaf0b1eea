// GET /metrics: Prometheus text of the server's request metrics, model manager counters, memory and the scheduler's
// histograms.
#include <sstream>

#include "serve/server_impl.h"

namespace osprey::serve {

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
  return out.str();
}

}  // namespace osprey::serve
