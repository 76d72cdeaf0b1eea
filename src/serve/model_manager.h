#pragma once
// Model manager for the server: the model repository, lazy loading, explicit load/unload, LRU eviction under a memory
// budget, idle unload, and memory given back to the OS. Thread-safe.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "osprey/classify.h"
#include "osprey/model_dir.h"
#include "osprey/runtime.h"

namespace inference {
class ModelConfig;
}

namespace osprey::serve {

struct ManagerOptions {
  std::string repository;            // root holding <name>/<version>/model.onnx (+ config.json, labels.txt)
  int64_t memory_budget_bytes = 0;   // 0 = unlimited. Accounted bytes (weights counted once) kept under this.
  double idle_unload_seconds = 0;    // 0 = never. Models unused this long are unloaded by a background thread.
  int threads = 0;                   // intra-op threads per model run (0 = all cores)
  double arena_idle_seconds = 2;     // execution arenas unused this long are freed (memory goes back after a burst);
                                     // <= 0 keeps them (no first-touch cost after a pause, memory stays pinned)
  int64_t max_batch_size = 0;        // the server's --max-batch-size, reported in each model's configuration
  int streams = 1;                   // the server's --streams, reported as the instance count
  DeviceSpec device;                 // where models run unless their config.json says "device" (--device)
  Precision precision = Precision::kFp32;  // unless their config.json says "precision" (--precision)
  int64_t gpu_memory_budget_bytes = 0;  // 0 = unlimited. Device bytes of loaded models kept under this (LRU).
  double housekeeping_seconds = 0;      // period of the housekeeping pass; 0 = from the idle settings, at most 1 s
  bool bound_resident = true;  // with a budget, also keep the process's RSS under ResidentCeiling (--memory-budget-rss)
  // The process's resident memory in bytes (what the housekeeping pass holds under ResidentCeiling); empty = read
  // /proc/self/statm. Tests give their own.
  std::function<int64_t()> resident_bytes;
};

/// With a memory budget, the resident memory (RSS) the housekeeping pass keeps the process under where evicting can:
/// the budget plus 10% plus 20 MiB (the binary's code, the libraries' state, the heap's fragmentation: what no model
/// accounts for). 0 without a budget.
int64_t ResidentCeiling(int64_t memory_budget_bytes);
/// ResidentCeiling of the options' budget, or 0 where they do not bound resident memory (bound_resident off).
int64_t ResidentCeiling(const ManagerOptions& options);
/// The process's resident memory (VmRSS) in bytes; 0 where /proc cannot say.
int64_t ProcessResidentBytes();

/// A loaded model. Holding the shared_ptr marks the model "in use": it is never evicted while held.
struct LoadedModel {
  std::string name;
  std::string version;
  ModelDirectory directory;
  std::unique_ptr<Model> model;
  std::shared_ptr<const inference::ModelConfig> config;  // Triton's view of it (config.pbtxt + the model)
  DeviceSpec device;                                     // where it runs
  int streams = 1;  // concurrent runs: its instance_group count, else --streams (Instances)
};

/// What metadata and config answers need, without loading the model (no weights, no plans).
struct ModelDescription {
  std::string name;
  std::string version;
  std::vector<ValueInfo> inputs, outputs;
  std::vector<std::string> labels;
  PreprocessSpec preprocess;
  std::shared_ptr<const inference::ModelConfig> config;
};

enum class ModelStatus { kUnavailable, kLoading, kReady, kFailed };

struct ModelIndexEntry {
  std::string name;
  std::string version;  // latest version found on disk (or loaded version)
  ModelStatus status = ModelStatus::kUnavailable;
  std::string reason;   // load error message, for kFailed
  int64_t weight_bytes = 0;  // accounted bytes of its weights (kReady only)
  int64_t shared_bytes = 0;  // of weight_bytes, bytes shared with another loaded model
  int64_t runtime_bytes = 0;  // execution arenas and plan-private constants (kReady only)
  int64_t device_bytes = 0;   // GPU bytes: device arenas and weights' device copies, shared ones too (kReady only)
};

struct ManagerStats {
  uint64_t loads = 0, unloads = 0, evictions = 0, load_failures = 0;
  int64_t accounted_bytes = 0;  // unique weight bytes + runtime bytes of loaded models
  int64_t device_bytes = 0;     // osprey's live device (GPU) bytes: weights' device copies, device arenas
  uint64_t device_releases = 0;  // times a device's context was released because no loaded model used it
};

class ModelManager {
 public:
  explicit ModelManager(ManagerOptions options);
  ~ModelManager();  // stops the idle thread
  /// The ready model, loading it first if needed (concurrent first requests wait for one load). `version` empty = the
  /// policy's version (latest). Throws Error kNotFound (no such model/version in the repository), kUnavailable (it
  /// failed to load: the message says why), kResourceExhausted (cannot fit the budget even after evicting).
  std::shared_ptr<LoadedModel> Acquire(const std::string& name, const std::string& version = "");
  /// The model's inputs, outputs and configuration: from the loaded model, or read from its directory without loading
  /// it (the state does not change). Same errors as Acquire, except that it never evicts or loads.
  std::shared_ptr<const ModelDescription> Describe(const std::string& name, const std::string& version = "");
  /// Explicit load (same errors as Acquire) and unload (kNotFound if not loaded). Unload returns memory to the OS.
  /// `config` (Triton's load "config" parameter) replaces the model's config.pbtxt for this and later loads, until a
  /// load without one; a load that changes the configuration in effect reloads a loaded model.
  void Load(const std::string& name, std::shared_ptr<const inference::ModelConfig> config = nullptr);
  void Unload(const std::string& name);
  /// Called after a request ran a model: with a --memory-budget, wakes the housekeeping pass at once, which evicts
  /// the least recently used models if the run's packed weights and arena pushed the accounted bytes over the budget
  /// (it would otherwise see them within a second), and holds resident memory under ResidentCeiling. At most one wake
  /// per 20 ms (a request sooner leaves one pending, run 20 ms after the last); cheap without a budget; never blocks
  /// on a load.
  void AfterRun();
  /// Every model in the repository with its state.
  std::vector<ModelIndexEntry> Index();
  ManagerStats Stats();
  const ManagerOptions& options() const { return options_; }

 private:
  struct Impl;
  ManagerOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::serve
