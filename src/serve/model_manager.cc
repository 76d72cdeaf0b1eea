#include "serve/model_manager.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "osprey/device.h"
#include "osprey/error.h"
#include "osprey/onnx.h"
#include "serve/log.h"
#include "serve/model_config.h"

namespace osprey::serve {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool IsVersionName(const std::string& s) {
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A model name is one directory below the repository root: no separators, and no leading '.' (hidden directories,
// "." and "..", are never models: the scan skips them and every route refuses them).
bool IsModelName(const std::string& s) {
  return !s.empty() && s[0] != '.' && s.find('/') == std::string::npos && s.find('\\') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

// The numeric version directories of `name_dir` holding model.onnx, in increasing order.
std::vector<std::string> VersionsOf(const fs::path& name_dir) {
  std::error_code ec;
  std::vector<std::string> versions;
  for (fs::directory_iterator it(name_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string v = it->path().filename().string();
    std::error_code ec2;
    if (IsVersionName(v) && fs::is_regular_file(it->path() / "model.onnx", ec2)) versions.push_back(v);
  }
  std::sort(versions.begin(), versions.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return versions;
}

// OpenModelDirectory, except that a model without config.json whose input is not an image (preprocessing cannot be
// derived) still opens: the server serves any model through `infer`; only `classify` needs the preprocessing.
// A tensor model (not an image classifier) may have a config.json that says nothing about images: only
// "precision", "device", "batching", "warmup", "description". An image model's config.json ("input", "preprocess")
// must load as one: its error stands.
bool ConfigIsForImages(const std::string& text) {
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !root.is_object() || root.contains("input") || root.contains("preprocess") || root.contains("postprocess");
}

ModelDirectory OpenForServing(const fs::path& name_dir, const std::string& version) {
  const fs::path version_dir = name_dir / version;
  try {
    return OpenModelDirectory(name_dir.string(), version);
  } catch (const Error& e) {
    std::error_code ec;
    const fs::path config = version_dir / "config.json";
    const bool has_config = fs::exists(config, ec);
    std::string config_text;
    if (has_config) {
      std::ifstream in(config, std::ios::binary);
      config_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (e.code() != ErrorCode::kInvalidArgument || (has_config && ConfigIsForImages(config_text))) throw;
    ModelDirectory md;
    md.name = name_dir.filename().string();
    md.version = version;
    md.model_path = (version_dir / "model.onnx").string();
    OnnxImportOptions import_options;
    import_options.validate_ops = false;
    md.graph = LoadOnnxModel(md.model_path, import_options);  // throws the import error when that was the problem
    md.derived = true;
    md.preprocess = PreprocessSpec{};
    if (has_config) {
      md.config_path = config.string();
      PostprocessSpec unused;
      ParseModelConfig(config_text, md.config_path, &md.preprocess, &unused, &md.batching, &md.precision, &md.device);
      md.preprocess = PreprocessSpec{};
    }
    md.preprocess.input.clear();
    FindLabels(md, version_dir.string(), name_dir.string());
    return md;
  }
}

std::string FormatSeconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", std::round(seconds * 1000) / 1000);
  return text;
}

void ReturnMemoryToOs() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace

int64_t ResidentCeiling(int64_t memory_budget_bytes) {
  if (memory_budget_bytes <= 0) return 0;
  const int64_t extra = memory_budget_bytes / 10 + (int64_t{20} << 20);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // a budget of exabytes: no ceiling to speak of
  return memory_budget_bytes > kMax - extra ? kMax : memory_budget_bytes + extra;
}

int64_t ResidentCeiling(const ManagerOptions& options) {
  return options.bound_resident ? ResidentCeiling(options.memory_budget_bytes) : 0;
}

int64_t ProcessResidentBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

struct ModelManager::Impl {
  using Key = std::pair<std::string, std::string>;  // (name, version)

  struct Entry {
    std::string name;
    std::string version;
    ModelStatus status = ModelStatus::kUnavailable;
    std::string reason;
    std::shared_ptr<LoadedModel> loaded;
    Clock::time_point last_used;
    uint64_t lru_tick = 0;
    std::condition_variable cv;  // signalled when a load finishes (status leaves kLoading)
  };

  ManagerOptions options;
  std::shared_ptr<WeightStore> weight_store = std::make_shared<WeightStore>();

  std::mutex mu;
  std::map<Key, std::unique_ptr<Entry>> entries;
  std::map<std::string, std::string> latest;  // name -> latest version on disk, as of the last scan
  std::map<std::string, std::string> problems;  // name -> why its directory cannot be served, as of the last scan
  // name -> the versions its config.pbtxt version_policy allows (models with a config.pbtxt), as of the last scan
  std::map<std::string, std::vector<std::string>> policy_versions;
  // Config files checked by a scan, re-read only when they change (path -> write time, size, the result).
  struct FileCheck {
    fs::file_time_type mtime;
    uintmax_t size = 0;
    std::string problem;                                     // "" when it parsed
    std::shared_ptr<const inference::ModelConfig> declared;  // config.pbtxt only
  };
  std::map<std::string, FileCheck> file_checks;
  // name -> the configuration a load request gave (Triton's "config" parameter), used instead of config.pbtxt
  std::map<std::string, std::shared_ptr<const inference::ModelConfig>> overrides;
  std::set<std::string> logged_problems;        // "name: problem" already in the log
  std::map<Key, std::shared_ptr<const ModelDescription>> descriptions;  // read without loading (Describe)
  int64_t reserved_bytes = 0;                 // size estimates of loads in progress
  uint64_t tick = 0;
  ManagerStats stats;

  std::condition_variable idle_cv;
  bool stopping = false;
  bool budget_check = false;  // AfterRun: the housekeeping pass runs now
  bool resident_warned = false;          // memory_above_ceiling logged
  Clock::time_point last_trim{};         // TrimFreeHeapLocked's last look
  std::atomic<int64_t> last_wake_ms{0};  // AfterRun's last wake (steady clock), to wake at most every kWakeMs
  std::atomic<bool> wake_pending{false};  // AfterRun came within kWakeMs of the last wake: the next pass comes soon
  static constexpr int64_t kWakeMs = 20;
  std::thread idle_thread;

  // A config file's check, from the cache when the file has not changed since (so that the index, /metrics and
  // readiness, which rescan, do not re-parse every model's files each time). `check` parses it, throwing Error.
  FileCheck CheckedFile(const fs::path& path, const std::function<FileCheck()>& check) {
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    const uintmax_t size = ec ? 0 : fs::file_size(path, ec);
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = file_checks.find(path.string());
      if (!ec && it != file_checks.end() && it->second.mtime == mtime && it->second.size == size) return it->second;
    }
    FileCheck result;
    try {
      result = check();
    } catch (const Error& e) {
      result.problem = e.what();
    }
    result.mtime = mtime, result.size = size;
    std::lock_guard<std::mutex> lock(mu);
    if (file_checks.size() > 4096) file_checks.clear();
    return file_checks[path.string()] = result;
  }

  // Reads the repository (without the lock: it touches the disk), then replaces `latest`, `policy_versions` and
  // `problems`. Problems found here (a directory without <version>/model.onnx, a config.json or config.pbtxt that does
  // not parse) are kept for the index and logged once each.
  void Scan() {
    std::map<std::string, std::string> found, trouble;
    std::map<std::string, std::vector<std::string>> policies;
    std::error_code ec;
    for (fs::directory_iterator it(options.repository, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (!it->is_directory(ec2)) continue;
      const std::string name = it->path().filename().string();
      if (!IsModelName(name)) continue;
      std::vector<std::string> versions = VersionsOf(it->path());
      if (versions.empty()) {
        trouble[name] = "no version directory holding model.onnx (expected " + name + "/<number>/model.onnx)";
        continue;
      }
      const fs::path pbtxt = it->path() / "config.pbtxt";
      if (fs::is_regular_file(pbtxt, ec2)) {
        const FileCheck check = CheckedFile(pbtxt, [&] {
          FileCheck c;
          c.declared = std::make_shared<const inference::ModelConfig>(ReadDeclaredConfig(it->path()));
          return c;
        });
        if (!check.problem.empty()) {
          trouble[name] = check.problem;
        } else {
          std::vector<std::string> allowed;
          for (const std::string& v : versions)
            if (VersionAllowed(*check.declared, v, versions)) allowed.push_back(v);
          policies[name] = allowed;
          versions = allowed;
          if (versions.empty()) {
            trouble[name] = pbtxt.string() + ": its version_policy allows none of the versions on disk";
            continue;
          }
        }
      }
      found[name] = versions.back();
      const fs::path config = it->path() / versions.back() / "config.json";
      if (fs::is_regular_file(config, ec2)) {
        const FileCheck check = CheckedFile(config, [&] {
          std::ifstream in(config);
          std::stringstream text;
          text << in.rdbuf();
          PreprocessSpec pre;
          PostprocessSpec post;
          BatchingSpec batching;
          std::string precision;
          ParseModelConfig(text.str(), config.string(), &pre, &post, &batching, &precision);
          return FileCheck{};
        });
        if (!check.problem.empty()) trouble[name] = check.problem;
      }
    }
    std::vector<std::pair<std::string, std::string>> to_log;
    {
      std::lock_guard<std::mutex> lock(mu);
      latest = std::move(found);
      policy_versions = std::move(policies);
      problems = std::move(trouble);
      for (const auto& [name, problem] : problems)
        if (logged_problems.insert(name + ": " + problem).second) to_log.emplace_back(name, problem);
    }
    for (const auto& [name, problem] : to_log)
      log::Event(log::Level::kWarning, "repository_problem", "model '" + name + "' cannot be served: " + problem,
                 {{"model", name}, {"problem", problem}});
  }

  Entry& EntryLocked(const std::string& name, const std::string& version) {
    auto& slot = entries[{name, version}];
    if (!slot) {
      slot = std::make_unique<Entry>();
      slot->name = name;
      slot->version = version;
    }
    return *slot;
  }

  // Weights, every loaded model's runtime bytes (its plans' constants and packs, the arenas its runs hold) and the
  // idle execution arenas, which the process's models share (TrimSharedArenas).
  int64_t AccountedLocked() const {
    int64_t total = weight_store->BytesLive() + SharedArenaBytes();
    for (const auto& [key, e] : entries)
      if (e->loaded) total += e->loaded->model->RuntimeBytes();
    return total;
  }

  // Drops the manager's handle. The memory is freed now when no request holds the model, else when the last one
  // drops it. The caller returns freed memory to the OS once the lock is released.
  void UnloadLocked(Entry& e, const std::string& reason) {
    const int64_t bytes = e.loaded ? e.loaded->model->WeightBytes() + e.loaded->model->RuntimeBytes() : 0;
    e.loaded.reset();
    TrimSharedArenas(0);  // what the unloaded model's runs left idle goes with it (the others take new ones)
    e.status = ModelStatus::kUnavailable;
    e.reason = reason;
    ++stats.unloads;
    log::Event(log::Level::kInfo, "model_unloaded", "model '" + e.name + "' version " + e.version + " unloaded (" +
                                                        reason + ")",
               {{"model", e.name}, {"version", e.version}, {"reason", reason}, {"bytes", bytes}});
  }

  // The least recently used ready model that no request holds, other than `keep`; null when there is none.
  Entry* EvictionCandidateLocked(const Entry* keep, bool on_device_only = false) {
    Entry* best = nullptr;
    for (auto& [key, e] : entries) {
      if (e.get() == keep || e->status != ModelStatus::kReady || !e->loaded || e->loaded.use_count() > 1) continue;
      if (on_device_only && e->loaded->device.kind == Device::kHost) continue;
      if (!best || e->lru_tick < best->lru_tick) best = e.get();
    }
    return best;
  }

  // Evicts until `extra_bytes` more fit the budget, and until osprey's device bytes fit --gpu-memory-budget (models
  // on a device go, least recently used first; a model's device bytes are known once its plans exist, so this runs
  // after loads and in housekeeping). Returns false when models in use leave no room.
  bool MakeRoomLocked(int64_t extra_bytes, const Entry* keep, bool* evicted) {
    if (options.gpu_memory_budget_bytes > 0) {
      while (Allocator::Host().BytesLive(Device::kCuda) > options.gpu_memory_budget_bytes) {
        Entry* victim = EvictionCandidateLocked(keep, /*on_device_only=*/true);
        if (!victim) break;  // the models in use hold it; the next housekeeping pass tries again
        UnloadLocked(*victim, "evicted: GPU memory budget (--gpu-memory-budget " +
                                  std::to_string(options.gpu_memory_budget_bytes) + " bytes)");
        ++stats.evictions;
        *evicted = true;
      }
    }
    if (options.memory_budget_bytes <= 0) return true;
    // Idle execution arenas go before any model does.
    if (AccountedLocked() + reserved_bytes + extra_bytes > options.memory_budget_bytes) TrimSharedArenas(0);
    while (AccountedLocked() + reserved_bytes + extra_bytes > options.memory_budget_bytes) {
      Entry* victim = EvictionCandidateLocked(keep);
      if (!victim) return false;
      UnloadLocked(*victim, "evicted: memory budget (--memory-budget " +
                                std::to_string(options.memory_budget_bytes) + " bytes)");
      ++stats.evictions;
      *evicted = true;
    }
    return true;
  }

  // The budget's second rule, on what the kernel sees: while the process's resident memory is above
  // ResidentCeiling, idle execution arenas go first, then the least recently used idle models (never `keep`, the most
  // recent), one at a time with the freed memory given back before the next reading. Only where it can work: when RSS
  // less every evictable model's own bytes is still above the ceiling (the process itself, or models in use, hold it),
  // nothing goes and it is logged once. Called with the lock held; releases it around each return of memory.
  bool EvictForResidentLocked(std::unique_lock<std::mutex>& lock, const Entry* keep) {
    const int64_t ceiling = ResidentCeiling(options);
    if (ceiling <= 0) return false;
    bool evicted = false;
    for (int round = 0; round < 1024; ++round) {
      int64_t resident = options.resident_bytes ? options.resident_bytes() : ProcessResidentBytes();
      if (resident <= ceiling) break;
      if (round == 0) {  // idle execution arenas (a burst's) and freed heap go before any model does
        if (SharedArenaBytes() > 0) TrimSharedArenas(0);
        lock.unlock();
        ReturnMemoryToOs();
        lock.lock();
        if (stopping) break;
        resident = options.resident_bytes ? options.resident_bytes() : ProcessResidentBytes();
        if (resident <= ceiling) break;
      }
      int64_t evictable = 0;
      for (const auto& [key, e] : entries)
        if (e.get() != keep && e->status == ModelStatus::kReady && e->loaded && e->loaded.use_count() == 1)
          evictable += e->loaded->model->WeightBytes() - e->loaded->model->SharedWeightBytes() +
                       e->loaded->model->RuntimeBytes();
      Entry* victim = EvictionCandidateLocked(keep);
      if (!victim || resident - evictable > ceiling) {
        if (!resident_warned) {
          resident_warned = true;
          log::Event(log::Level::kWarning, "memory_above_ceiling",
                     "resident memory " + std::to_string(resident >> 20) + " MiB is above the budget's ceiling of " +
                         std::to_string(ceiling >> 20) +
                         " MiB (--memory-budget + 10% + 20 MiB) and evicting idle "
                         "models cannot bring it under: the process itself or models in use hold it; raise "
                         "--memory-budget for the budget to bound resident memory",
                     {{"resident_bytes", resident}, {"ceiling_bytes", ceiling}, {"evictable_bytes", evictable}});
        }
        break;
      }
      UnloadLocked(*victim, "evicted: resident memory " + std::to_string(resident >> 20) +
                                " MiB above the budget's ceiling of " + std::to_string(ceiling >> 20) +
                                " MiB (--memory-budget " + std::to_string(options.memory_budget_bytes) +
                                " bytes + 10% + 20 MiB)");
      ++stats.evictions;
      evicted = true;
      lock.unlock();
      ReturnMemoryToOs();
      lock.lock();
      if (stopping) break;
    }
    return evicted;
  }

  // Idle release (issue 16): a device that no loaded or loading model uses gets its context released, so the process
  // holds no memory on it (CUDA: the primary context is reset). Only when osprey holds no device bytes at all: a
  // request may still run an unloaded model; the housekeeping pass tries again. The next model placed there creates
  // a new context (Compile).
  void ReleaseUnusedDevicesLocked() {
    DeviceBackend* backend = GetDeviceBackend(Device::kCuda);
    if (backend == nullptr) return;
    std::set<int> used;
    for (const auto& [key, e] : entries) {
      if (e->status == ModelStatus::kLoading) return;  // it may be compiling on a device now
      if (e->loaded && e->loaded->device.kind == Device::kCuda) used.insert(e->loaded->device.ordinal);
    }
    if (Allocator::Host().BytesLive(Device::kCuda) != 0) return;
    const int count = backend->DeviceCount();
    for (int ordinal = 0; ordinal < count; ++ordinal) {
      if (used.count(ordinal) || !backend->ContextActive(ordinal)) continue;
      try {
        backend->ReleaseContext(ordinal);
        ++stats.device_releases;
        log::Event(log::Level::kInfo, "device_released",
                   "cuda:" + std::to_string(ordinal) + " released (no loaded model uses it): the server holds no "
                   "memory on it until the next model placed there",
                   {{"device", "cuda:" + std::to_string(ordinal)}});
      } catch (const std::exception& ex) {
        log::Event(log::Level::kWarning, "device_release_failed",
                   "cuda:" + std::to_string(ordinal) + " could not be released: " + ex.what(),
                   {{"device", "cuda:" + std::to_string(ordinal)}, {"error", std::string(ex.what())}});
      }
    }
  }

  void Touch(Entry& e) {
    e.last_used = Clock::now();
    e.lru_tick = ++tick;
  }

  // Loads `e` (status already kLoading, lock released by the caller). Returns with the lock held and status set.
  void LoadLocked(std::unique_lock<std::mutex>& lock, Entry& e) {
    const fs::path name_dir = fs::path(options.repository) / e.name;
    log::Event(log::Level::kInfo, "model_loading", "loading model '" + e.name + "' version " + e.version,
               {{"model", e.name}, {"version", e.version}});
    const auto load_start = Clock::now();
    // Read first, outside the lock: a model costs the bytes of its weights that no loaded model shares, known only
    // once they are read (a tenant on a loaded backbone costs its head, not its file size). Evicting for the file size
    // would push out the very models it shares with.
    lock.unlock();
    std::optional<ModelDirectory> parsed;
    std::string failure;
    int64_t estimate = 0;
    try {
      parsed = OpenForServing(name_dir, e.version);
      // Twice: the kernels pack (reorder) most weights into a second copy at the first request.
      estimate = 2 * weight_store->BytesNotStored(parsed->graph);
    } catch (const std::exception& ex) {
      failure = ex.what();
      if (failure.empty()) failure = "unknown error";
    }
    lock.lock();
    bool evicted = false;
    if (parsed && !MakeRoomLocked(estimate, &e, &evicted)) {
      const int64_t accounted = AccountedLocked();
      e.status = ModelStatus::kUnavailable;
      e.cv.notify_all();
      lock.unlock();
      parsed.reset();
      if (evicted) ReturnMemoryToOs();
      lock.lock();
      throw Error(ErrorCode::kResourceExhausted,
                  "model '" + e.name + "' (version " + e.version + ") needs about " + std::to_string(estimate) +
                      " bytes, but the memory budget is " + std::to_string(options.memory_budget_bytes) +
                      " bytes and " + std::to_string(accounted + reserved_bytes) +
                      " are held by models in use or being loaded");
    }
    reserved_bytes += estimate;
    lock.unlock();
    if (evicted) ReturnMemoryToOs();

    std::shared_ptr<LoadedModel> loaded;
    try {
      if (!parsed) throw std::runtime_error(failure);
      ModelDirectory md = std::move(*parsed);
      parsed.reset();
      const inference::ModelConfig declared = DeclaredConfig(name_dir);
      ApplyBatching(declared, &md);
      auto config = std::make_shared<const inference::ModelConfig>(
          ServingConfig(md, declared, options.max_batch_size, options.streams));
      ModelOptions model_options;
      model_options.compile.num_threads = options.threads;
      model_options.compile.precision =
          md.precision.empty() ? options.precision : ParsePrecision(md.precision, md.config_path + ": precision");
      const DeviceSpec device =
          md.device.empty() ? options.device : ParseDevice(md.device, md.config_path + ": device");
      if (device.kind != Device::kHost) {
        InitDevices();
        RequireDevice(device);  // no GPU, or osprey built without CUDA: the load fails saying so
      }
      model_options.compile.device = device;
      model_options.weight_store = weight_store;
      auto model = std::make_unique<Model>(std::move(md.graph), model_options);
      // The directory keeps the graph with the interned weights (the same buffers as the model's): no second copy.
      md.graph = model->graph();
      if (!md.batching.warmup.empty() || declared.model_warmup_size() > 0) {
        const double ms = RunWarmup(*model, md, declared, name_dir.string());
        log::Event(log::Level::kInfo, "model_warmup",
                   "model '" + e.name + "' version " + e.version + " warmed up in " + FormatSeconds(ms / 1000) + " s",
                   {{"model", e.name}, {"version", e.version}, {"ms", static_cast<int64_t>(ms)}});
      }
      loaded = std::make_shared<LoadedModel>();
      loaded->name = e.name;
      loaded->version = e.version;
      loaded->directory = std::move(md);
      loaded->model = std::move(model);
      loaded->streams = config->instance_group(0).count();
      loaded->config = std::move(config);
      loaded->device = model_options.compile.device;
    } catch (const std::exception& ex) {
      failure = ex.what();
      if (failure.empty()) failure = "unknown error";
    }

    lock.lock();
    reserved_bytes -= estimate;
    const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - load_start).count();
    if (loaded) {
      log::Event(log::Level::kInfo, "model_loaded",
                 "model '" + e.name + "' version " + e.version + " ready in " + FormatSeconds(load_ms / 1000) + " s",
                 {{"model", e.name},
                  {"version", e.version},
                  {"ms", static_cast<int64_t>(load_ms)},
                  {"weight_bytes", loaded->model->WeightBytes()},
                  {"shared_bytes", loaded->model->SharedWeightBytes()}});
      e.loaded = std::move(loaded);
      e.status = ModelStatus::kReady;
      e.reason.clear();
      ++stats.loads;
      Touch(e);
      // The estimate may be short (arenas come at the first request). Others go if the budget is now exceeded.
      bool evicted_after = false;
      MakeRoomLocked(0, &e, &evicted_after);
      if (evicted_after) {
        lock.unlock();
        ReturnMemoryToOs();
        lock.lock();
      }
    } else {
      log::Event(log::Level::kError, "model_load_failed",
                 "model '" + e.name + "' version " + e.version + " failed to load: " + failure,
                 {{"model", e.name}, {"version", e.version}, {"error", failure}});
      e.status = ModelStatus::kFailed;
      e.reason = failure;
      ++stats.load_failures;
      lock.unlock();
      ReturnMemoryToOs();  // a half-built model may have allocated a lot
      lock.lock();
    }
    e.cv.notify_all();
  }

  // The configuration a load request gave for the model, else its config.pbtxt.
  inference::ModelConfig DeclaredConfig(const fs::path& name_dir) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = overrides.find(name_dir.filename().string());
      if (it != overrides.end()) return *it->second;
    }
    return ReadDeclaredConfig(name_dir);
  }

  // config.pbtxt in the model's directory, when there is one (its ignored fields logged once per model).
  inference::ModelConfig ReadDeclaredConfig(const fs::path& name_dir) {
    const fs::path path = name_dir / "config.pbtxt";
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return {};
    std::vector<std::string> ignored;
    inference::ModelConfig declared = ReadConfigPbtxt(path.string(), &ignored);
    if (!ignored.empty()) {
      std::string fields;
      for (const std::string& f : ignored) fields += (fields.empty() ? "" : ", ") + f;
      bool first;
      {
        std::lock_guard<std::mutex> lock(mu);
        first = logged_problems.insert(path.string() + ": ignored " + fields).second;
      }
      if (first)
        log::Event(log::Level::kWarning, "config_ignored",
                   path.string() + ": osprey does not use these fields and ignores them: " + fields,
                   {{"file", path.string()}, {"fields", ignored}});
    }
    return declared;
  }

  // The version a request for `name` (and `version`, "" = the latest the policy allows) is served by. Uses the last
  // scan's results (no file is read per request); a miss rescans once, for a model or version added since.
  std::string ResolveVersion(const std::string& name, const std::string& version) {
    if (!IsModelName(name)) throw Error(ErrorCode::kNotFound, "model '" + name + "': not a valid model name");
    if (!version.empty()) {
      std::error_code ec;
      if (!IsVersionName(version) ||
          !fs::is_regular_file(fs::path(options.repository) / name / version / "model.onnx", ec))
        throw Error(ErrorCode::kNotFound, "model '" + name + "' has no version '" + version + "' in the repository");
      auto excluded = [&] {
        std::lock_guard<std::mutex> lock(mu);
        auto it = policy_versions.find(name);
        return it != policy_versions.end() &&
               std::find(it->second.begin(), it->second.end(), version) == it->second.end();
      };
      if (excluded()) {
        Scan();
        if (excluded())
          throw Error(ErrorCode::kNotFound, "model '" + name + "' version " + version +
                                                " is not served: its config.pbtxt version_policy excludes it");
      }
      return version;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = latest.find(name);
      if (it != latest.end()) return it->second;
    }
    Scan();  // a model added since the last scan
    std::lock_guard<std::mutex> lock(mu);
    auto it = latest.find(name);
    if (it != latest.end()) return it->second;
    if (auto problem = problems.find(name); problem != problems.end())
      throw Error(ErrorCode::kUnavailable, "model '" + name + "' cannot be served: " + problem->second);
    throw Error(ErrorCode::kNotFound, "model '" + name + "' not found in the repository " + options.repository);
  }

  std::shared_ptr<LoadedModel> Acquire(const std::string& name, const std::string& requested, bool retry_failed) {
    const std::string version = ResolveVersion(name, requested);
    std::unique_lock<std::mutex> lock(mu);
    Entry& e = EntryLocked(name, version);
    if (retry_failed && e.status == ModelStatus::kFailed) e.status = ModelStatus::kUnavailable;
    for (;;) {
      switch (e.status) {
        case ModelStatus::kReady:
          Touch(e);
          return e.loaded;
        case ModelStatus::kLoading:
          e.cv.wait(lock, [&] { return e.status != ModelStatus::kLoading; });
          break;
        case ModelStatus::kFailed:
          throw Error(ErrorCode::kUnavailable, "model '" + name + "' failed to load: " + e.reason);
        case ModelStatus::kUnavailable:
          e.status = ModelStatus::kLoading;
          LoadLocked(lock, e);
          if (e.status == ModelStatus::kFailed)
            throw Error(ErrorCode::kUnavailable, "model '" + name + "' failed to load: " + e.reason);
          break;
      }
    }
  }

  // Freed heap that glibc keeps rather than returns (a gRPC flood's receive buffers, a burst's small allocations:
  // fragments of its arenas, which M_TRIM_THRESHOLD never reaches) goes back to the OS when malloc's free lists hold
  // 64 MiB or more, looked at every 5 s (mallinfo2 takes every arena's lock; the pass itself can run every 20 ms
  // under load). A trim of pages already given back costs ~2 ms per GiB of free lists (measured).
  void TrimFreeHeapLocked(std::unique_lock<std::mutex>& lock, Clock::time_point now) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    if (now - last_trim < std::chrono::seconds(5)) return;
    last_trim = now;
    if (mallinfo2().fordblks < (size_t{64} << 20)) return;
    lock.unlock();
    ReturnMemoryToOs();
    lock.lock();
#else
    (void)lock;
    (void)now;
#endif
  }

  // Housekeeping, every `period`: frees execution arenas idle for arena_idle_seconds, and unloads models idle for
  // idle_unload_seconds (when set); then gives freed heap back to the OS.
  void IdleLoop() {
    const double idle = options.idle_unload_seconds;
    const double arena_idle = options.arena_idle_seconds;  // <= 0: arenas are kept
    const auto period = std::chrono::duration<double>(
        options.housekeeping_seconds > 0
            ? options.housekeeping_seconds
            : std::clamp(std::min(idle > 0 ? idle / 4 : 1.0, arena_idle > 0 ? arena_idle / 2 : 1.0), 0.01, 1.0));
    const auto idle_limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(idle));
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      idle_cv.wait_for(lock, period, [&] { return stopping || budget_check || wake_pending.load(); });
      if (!stopping && !budget_check && wake_pending.load()) {
        // A request that ended too soon after the last wake to wake the pass itself: the pass runs kWakeMs after it.
        const auto due = Clock::time_point(std::chrono::milliseconds(last_wake_ms.load() + kWakeMs));
        idle_cv.wait_until(lock, due, [&] { return stopping || budget_check; });
      }
      wake_pending.store(false);
      budget_check = false;
      if (stopping) break;
      const auto now = Clock::now();
      TrimFreeHeapLocked(lock, now);
      if (stopping) break;
      bool unloaded = false;
      std::vector<std::shared_ptr<LoadedModel>> ready;
      for (auto& [key, e] : entries)
        if (e->status == ModelStatus::kReady && e->loaded) ready.push_back(e->loaded);
      lock.unlock();
      size_t trimmed = 0;
      if (arena_idle > 0) {
        trimmed += TrimSharedArenas(arena_idle);
        for (const auto& loaded : ready) trimmed += loaded->model->TrimArenas(arena_idle);
      }
      ready.clear();
      lock.lock();
      if (stopping) break;
      unloaded = trimmed > 0;
      // Plans compiled by requests since the last load (packed weights, arenas) can push the accounted bytes over the
      // budget: the least recently used models go, never the most recent one (it would only be loaded again).
      const bool over_host = options.memory_budget_bytes > 0 && AccountedLocked() > options.memory_budget_bytes;
      const bool over_device = options.gpu_memory_budget_bytes > 0 &&
                               Allocator::Host().BytesLive(Device::kCuda) > options.gpu_memory_budget_bytes;
      const Entry* newest = nullptr;
      for (const auto& [key, e] : entries)
        if (e->loaded && (!newest || e->lru_tick > newest->lru_tick)) newest = e.get();
      if (over_host || over_device) {
        bool evicted = false;
        MakeRoomLocked(0, newest, &evicted);
        unloaded = unloaded || evicted;
      }
      if (options.memory_budget_bytes > 0) {
        if (unloaded) {  // what was freed above goes back now, so that the reading below sees it
          lock.unlock();
          ReturnMemoryToOs();
          lock.lock();
          unloaded = false;
        }
        EvictForResidentLocked(lock, newest);  // gives back what it frees itself
        if (stopping) break;
      }
      ReleaseUnusedDevicesLocked();
      if (idle <= 0) {
        if (unloaded) {
          lock.unlock();
          ReturnMemoryToOs();
          lock.lock();
        }
        continue;
      }
      for (auto& [key, e] : entries) {
        if (e->status != ModelStatus::kReady || !e->loaded) continue;
        if (e->loaded.use_count() > 1) {
          e->last_used = now;  // a request still holds it: it counts as used
          continue;
        }
        if (now - e->last_used >= idle_limit) {
          UnloadLocked(*e, "idle: unused for " + FormatSeconds(idle) + " s (--idle-unload)");
          unloaded = true;
        }
      }
      if (unloaded) ReleaseUnusedDevicesLocked();
      if (unloaded) {
        lock.unlock();
        ReturnMemoryToOs();
        lock.lock();
      }
    }
  }
};

ModelManager::ModelManager(ManagerOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  impl_->options = options_;
  impl_->Scan();
  impl_->idle_thread = std::thread([this] { impl_->IdleLoop(); });
}

ModelManager::~ModelManager() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->idle_cv.notify_all();
  if (impl_->idle_thread.joinable()) impl_->idle_thread.join();
}

std::shared_ptr<LoadedModel> ModelManager::Acquire(const std::string& name, const std::string& version) {
  return impl_->Acquire(name, version, /*retry_failed=*/false);
}

void ModelManager::Load(const std::string& name, std::shared_ptr<const inference::ModelConfig> config) {
  impl_->Scan();  // an explicit load picks up a version added since
  impl_->ResolveVersion(name, "");  // kNotFound before anything is kept for a name that is not in the repository
  bool reloaded = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->overrides.find(name);
    const bool changes = config || it != impl_->overrides.end();  // a new configuration, or back to config.pbtxt
    if (config)
      impl_->overrides[name] = std::move(config);
    else if (it != impl_->overrides.end())
      impl_->overrides.erase(it);
    if (changes) {
      for (auto d = impl_->descriptions.begin(); d != impl_->descriptions.end();)
        d = d->first.first == name ? impl_->descriptions.erase(d) : std::next(d);
      for (auto& [key, e] : impl_->entries)
        if (key.first == name && e->status == ModelStatus::kReady) {
          impl_->UnloadLocked(*e, "unloaded: reloading with the configuration of a load request");
          reloaded = true;
        }
    }
  }
  if (reloaded) ReturnMemoryToOs();
  impl_->Acquire(name, "", /*retry_failed=*/true);
}

void ModelManager::AfterRun() {
  if (options_.memory_budget_bytes <= 0 && options_.gpu_memory_budget_bytes <= 0) return;
  // At most one wake per kWakeMs: under a stream of requests the pass must not run once per request. A request within
  // kWakeMs of the last wake leaves a pending wake instead, which the pass takes kWakeMs after its last run.
  constexpr int64_t kWakeMs = Impl::kWakeMs;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  int64_t last = impl_->last_wake_ms.load(std::memory_order_relaxed);
  if (now - last < kWakeMs || !impl_->last_wake_ms.compare_exchange_strong(last, now)) {
    if (!impl_->wake_pending.exchange(true)) {
      { std::lock_guard<std::mutex> lock(impl_->mu); }  // the pass is waiting (and gets the notice) or will see it
      impl_->idle_cv.notify_all();
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->budget_check = true;
  }
  impl_->idle_cv.notify_all();
}

void ModelManager::Unload(const std::string& name) {
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [key, e] : impl_->entries) {
      if (key.first != name || e->status != ModelStatus::kReady) continue;
      impl_->UnloadLocked(*e, "unloaded: by request");
      found = true;
    }
    if (found) impl_->ReleaseUnusedDevicesLocked();
  }
  if (!found) throw Error(ErrorCode::kNotFound, "model '" + name + "' is not loaded");
  ReturnMemoryToOs();
}

std::vector<ModelIndexEntry> ModelManager::Index() {
  impl_->Scan();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<ModelIndexEntry> rows;
  auto row_of = [](const std::string& name, const std::string& version, const Impl::Entry* e) {
    ModelIndexEntry row;
    row.name = name;
    row.version = version;
    row.reason = "not loaded yet";
    if (e) {
      row.status = e->status;
      if (e->status == ModelStatus::kFailed)
        row.reason = "failed: " + e->reason;
      else if (e->status == ModelStatus::kReady || e->status == ModelStatus::kLoading)
        row.reason.clear();
      else if (!e->reason.empty())
        row.reason = e->reason;
      if (e->status == ModelStatus::kReady && e->loaded) {
        row.weight_bytes = e->loaded->model->WeightBytes();
        row.shared_bytes = e->loaded->model->SharedWeightBytes();
        row.runtime_bytes = e->loaded->model->RuntimeBytes();
        row.device_bytes = e->loaded->model->DeviceBytes();
      }
    }
    return row;
  };
  // Each model on disk at its latest version, then other versions that are loaded, loading or failed.
  for (const auto& [name, version] : impl_->latest) {
    auto it = impl_->entries.find({name, version});
    rows.push_back(row_of(name, version, it == impl_->entries.end() ? nullptr : it->second.get()));
    auto problem = impl_->problems.find(name);
    if (problem != impl_->problems.end() && rows.back().status != ModelStatus::kReady)
      rows.back().reason = "invalid: " + problem->second;
  }
  for (const auto& [name, problem] : impl_->problems)
    if (!impl_->latest.count(name)) {
      ModelIndexEntry row;
      row.name = name;
      row.status = ModelStatus::kFailed;
      row.reason = "invalid: " + problem;
      rows.push_back(row);
    }
  for (const auto& [key, e] : impl_->entries) {
    auto it = impl_->latest.find(key.first);
    if (it != impl_->latest.end() && it->second == key.second) continue;
    if (e->status == ModelStatus::kUnavailable) continue;
    rows.push_back(row_of(key.first, key.second, e.get()));
  }
  std::sort(rows.begin(), rows.end(), [](const ModelIndexEntry& a, const ModelIndexEntry& b) {
    if (a.name != b.name) return a.name < b.name;
    return a.version.size() != b.version.size() ? a.version.size() < b.version.size() : a.version < b.version;
  });
  return rows;
}

std::shared_ptr<const ModelDescription> ModelManager::Describe(const std::string& name, const std::string& version) {
  const std::string v = impl_->ResolveVersion(name, version);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->entries.find({name, v});
    if (it != impl_->entries.end() && it->second->status == ModelStatus::kReady && it->second->loaded) {
      const LoadedModel& m = *it->second->loaded;
      auto d = std::make_shared<ModelDescription>();
      d->name = m.name;
      d->version = m.version;
      d->inputs = m.model->graph().input_infos;
      d->outputs = m.model->graph().output_infos;
      d->labels = m.directory.labels;
      d->preprocess = m.directory.preprocess;
      d->config = m.config;
      return d;
    }
    auto cached = impl_->descriptions.find({name, v});
    if (cached != impl_->descriptions.end()) return cached->second;
  }
  // Read the directory without loading: the graph's weights are dropped at once.
  const fs::path name_dir = fs::path(options_.repository) / name;
  auto d = std::make_shared<ModelDescription>();
  try {
    ModelDirectory md = OpenForServing(name_dir, v);
    const inference::ModelConfig declared = impl_->DeclaredConfig(name_dir);
    ApplyBatching(declared, &md);
    d->config = std::make_shared<const inference::ModelConfig>(
        ServingConfig(md, declared, options_.max_batch_size, options_.streams));
    d->name = name;
    d->version = v;
    d->inputs = md.graph.input_infos;
    d->outputs = md.graph.output_infos;
    d->labels = md.labels;
    d->preprocess = md.preprocess;
  } catch (const Error& e) {
    ReturnMemoryToOs();
    throw Error(ErrorCode::kUnavailable, "model '" + name + "' version " + v + " cannot be read: " + e.what());
  }
  ReturnMemoryToOs();
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->descriptions.size() > 1024) impl_->descriptions.clear();
  impl_->descriptions[{name, v}] = d;
  return d;
}

ManagerStats ModelManager::Stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ManagerStats s = impl_->stats;
  s.accounted_bytes = impl_->AccountedLocked();
  s.device_bytes = Allocator::Host().BytesLive(Device::kCuda);
  return s;
}

}  // namespace osprey::serve
