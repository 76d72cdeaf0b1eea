// InferenceServer's protocol-neutral operations: what the REST routes (server.cc) and the gRPC service
// (grpc_server.cc) both answer.
#include <algorithm>
#include <chrono>

#include "osprey/error.h"
#include "osprey/image.h"
#include "serve/log.h"
#include "serve/model_config.h"
#include "serve/server_impl.h"
#include "serve/tensor_json.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

Error BadRequest(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }

json TensorsMetadata(const std::vector<ValueInfo>& infos) {
  json out = json::array();
  for (const ValueInfo& info : infos)
    out.push_back({{"name", info.name}, {"datatype", KServeDType(info.dtype)}, {"shape", MetadataShape(info)}});
  return out;
}

json Duration(uint64_t count, double us) {
  return {{"count", count}, {"ns", static_cast<uint64_t>(std::max(0.0, us) * 1000.0)}};
}

// Repository load/unload parameters: a load's "config" (Triton's configuration override, a JSON string) is parsed and
// returned; "file:" contents are refused (osprey loads model files from the repository only); anything else is
// logged as ignored.
std::shared_ptr<const inference::ModelConfig> CheckRepositoryParameters(const std::string& action,
                                                                        const std::string& model,
                                                                        const json& parameters) {
  std::shared_ptr<const inference::ModelConfig> config;
  if (parameters.is_null()) return config;
  if (!parameters.is_object()) throw BadRequest(action + " '" + model + "': 'parameters' must be an object");
  for (const auto& [key, value] : parameters.items()) {
    if (key == "config" && action == "load") {
      if (!value.is_string())
        throw BadRequest("load '" + model + "': parameter 'config' must be a string: the configuration as JSON");
      std::vector<std::string> ignored;
      config = std::make_shared<const inference::ModelConfig>(
          ParseConfigJson(value.get<std::string>(), "load '" + model + "': parameter 'config'", &ignored));
      if (!ignored.empty()) {
        std::string fields;
        for (const std::string& f : ignored) fields += (fields.empty() ? "" : ", ") + f;
        const std::string what = "load '" + model + "': osprey does not use these fields of the configuration: ";
        log::Event(log::Level::kWarning, "config_ignored", what + fields, {{"model", model}, {"fields", ignored}});
      }
      continue;
    }
    if (key.rfind("file:", 0) == 0)
      throw Error(ErrorCode::kUnsupported,
                  action + " '" + model + "': parameter '" + key +
                      "' is not supported: osprey loads model files from its repository only; copy them into " +
                      "<repository>/" + model + "/<version>/ and load again");
    log::Event(log::Level::kWarning, "parameter_ignored", action + " '" + model + "': parameter '" + key + "' ignored",
               {{"model", model}, {"parameter", key}});
  }
  return config;
}

}  // namespace

const char* StateName(ModelStatus status) {
  switch (status) {
    case ModelStatus::kReady: return "READY";
    case ModelStatus::kLoading: return "LOADING";
    default: return "UNAVAILABLE";
  }
}

void InferenceServer::Impl::Record(const std::string& model, bool ok, double us) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  RequestMetrics& m = metrics[model];
  (ok ? m.success : m.failure)++;
  (ok ? m.success_us : m.failure_us) += us;
  m.duration.Add(us);
}

InferenceServer::Impl::Activity InferenceServer::Impl::ActivityOf(const std::string& model) {
  Activity a;
  {
    std::lock_guard<std::mutex> lock(metrics_mu);
    if (auto it = metrics.find(model); it != metrics.end()) a.requests = it->second;
  }
  a.runs = scheduler->ModelCounters(model);
  return a;
}

std::shared_ptr<LoadedModel> InferenceServer::Impl::AcquireModel(const std::string& model, const std::string& version) {
  std::shared_ptr<LoadedModel> loaded = manager->Acquire(model, version);
  std::lock_guard<std::mutex> lock(served_mu);
  std::weak_ptr<LoadedModel>& slot = served[loaded->name];
  if (slot.lock() != loaded) slot = loaded;
  return loaded;
}

std::shared_ptr<ImagePreprocessor> InferenceServer::Impl::PreprocessorFor(const LoadedModel& loaded) {
  const PreprocessSpec& spec = loaded.directory.preprocess;
  const std::string key = loaded.name + "/" + loaded.version + "/" + spec.ToJson();
  std::lock_guard<std::mutex> lock(preprocessors_mu);
  auto it = preprocessors.find(key);
  if (it != preprocessors.end()) return it->second;
  CheckPreprocessSpec(spec, loaded.model->graph());
  CompileOptions options;
  options.num_threads = manager->options().threads;
  // Entries for versions no longer served are dropped wholesale now and then; they are small (plans for small graphs).
  if (preprocessors.size() > 256) preprocessors.clear();
  auto pre = std::make_shared<ImagePreprocessor>(spec, options);
  preprocessors[key] = pre;
  return pre;
}

Tensor InferenceServer::Impl::ImagePixels(const LoadedModel& loaded, std::string_view encoded, ImageBudget* budget) {
  std::shared_ptr<ImagePreprocessor> pre = PreprocessorFor(loaded);
  DecodeOptions decode_options = DecodeOptionsFor(loaded.directory.preprocess);
  decode_options.max_pixels = budget->PixelsLeft(decode_options.max_pixels);
  decode_options.limit_name = budget->LimitName();
  DecodeInfo info;
  Tensor image = DecodeImage(encoded.data(), encoded.size(), decode_options, &info);
  budget->Spend(info.stored_width * info.stored_height);
  return pre->Run(image);
}

Tensor InferenceServer::Impl::EncodedImagesInput(const LoadedModel& loaded, const ValueInfo& info,
                                                 const std::vector<std::string_view>& images, ImageBudget* budget,
                                                 const std::string& what) {
  const PreprocessSpec& spec = loaded.directory.preprocess;
  if (spec.input.empty())
    throw BadRequest(what + ": BYTES (encoded images) need a model with preprocessing (config.json); model '" +
                     loaded.name + "' has none, so send its input as numbers");
  if (spec.input != info.name)
    throw BadRequest(what + ": BYTES (encoded images) are accepted only for the image input '" + spec.input +
                     "' of model '" + loaded.name + "'");
  std::vector<Tensor> pixels;
  pixels.reserve(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    try {
      pixels.push_back(ImagePixels(loaded, images[i], budget));
    } catch (const Error& e) {
      throw Error(e.code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument,
                  what + ": image " + std::to_string(i) + ": " + e.what());
    }
  }
  return StackTensors(pixels);
}

SharedMemoryRegions& InferenceServer::Impl::SharedMemory() {
  if (!shared_memory)
    throw Error(ErrorCode::kUnsupported,
                "system shared memory is off on this server (start it with --allow-shared-memory)");
  return *shared_memory;
}

json InferenceServer::ServerMetadata() const {
  json extensions = {"binary_tensor_data", "model_repository",    "statistics",
                     "classification",     "model_configuration", "classify"};
  if (impl_->shared_memory) extensions.push_back("system_shared_memory");
  return {{"name", "osprey"}, {"version", impl_->version}, {"extensions", extensions}};
}

json InferenceServer::SharedMemoryStatus(const std::string& region) { return impl_->SharedMemory().Status(region); }

void InferenceServer::RegisterSharedMemory(const std::string& region, const std::string& key, uint64_t offset,
                                           uint64_t byte_size) {
  impl_->SharedMemory().Register(region, key, offset, byte_size);
  log::Event(log::Level::kInfo, "shared_memory_registered",
             "shared memory region '" + region + "' registered: '" + key + "' bytes " + std::to_string(offset) + ".." +
                 std::to_string(offset + byte_size),
             {{"region", region}, {"key", key}, {"offset", offset}, {"byte_size", byte_size}});
}

void InferenceServer::UnregisterSharedMemory(const std::string& region) { impl_->SharedMemory().Unregister(region); }

bool InferenceServer::ModelReady(const std::string& model, const std::string& version) {
  bool known = false;
  for (const ModelIndexEntry& entry : impl_->manager->Index()) {
    if (entry.name != model) continue;
    known = true;
    if (entry.status == ModelStatus::kReady && (version.empty() || version == entry.version)) return true;
  }
  if (!known) throw Error(ErrorCode::kNotFound, "model '" + model + "' is not in the repository");
  return false;
}

json InferenceServer::ModelMetadata(const std::string& model, const std::string& version) {
  std::shared_ptr<const ModelDescription> d = impl_->manager->Describe(model, version);
  return {{"name", d->name},
          {"versions", {d->version}},
          {"platform", "onnx"},
          {"inputs", TensorsMetadata(d->inputs)},
          {"outputs", TensorsMetadata(d->outputs)}};
}

std::shared_ptr<const inference::ModelConfig> InferenceServer::ModelConfig(const std::string& model,
                                                                           const std::string& version) {
  return impl_->manager->Describe(model, version)->config;
}

json InferenceServer::Statistics(const std::string& model, const std::string& version) {
  json stats = json::array();
  bool found = false;
  for (const ModelIndexEntry& entry : impl_->manager->Index()) {
    if (entry.version.empty()) continue;  // a directory that is not a model
    if (!model.empty() && entry.name != model) continue;
    if (!version.empty() && entry.version != version) continue;
    found = true;
    const Impl::Activity activity = impl_->ActivityOf(entry.name);
    const RequestMetrics& m = activity.requests;
    const Scheduler::Counters& c = activity.runs;
    json inference_stats = {{"success", Duration(m.success, m.success_us)},
                            {"fail", Duration(m.failure, m.failure_us)},
                            {"queue", Duration(c.requests, c.queue_us)},
                            {"compute_input", Duration(c.requests, 0)},
                            {"compute_infer", Duration(c.requests, c.compute_us)},
                            {"compute_output", Duration(c.requests, 0)},
                            {"cache_hit", Duration(0, 0)},
                            {"cache_miss", Duration(0, 0)}};
    stats.push_back({{"name", entry.name},
                     {"version", entry.version},
                     {"last_inference", c.last_ms},
                     {"inference_count", c.inferences},
                     {"execution_count", c.executions},
                     {"inference_stats", inference_stats},
                     {"batch_stats", json::array()},
                     {"memory_usage", json::array()},
                     {"state", StateName(entry.status)},
                     {"reason", entry.reason},
                     {"request_success_count", m.success},
                     {"request_failure_count", m.failure},
                     {"weight_bytes", entry.weight_bytes},
                     {"shared_bytes", entry.shared_bytes},
                     {"unique_bytes", entry.weight_bytes - entry.shared_bytes},
                     {"runtime_bytes", entry.runtime_bytes},
                     {"device_bytes", entry.device_bytes}});
  }
  if (!model.empty() && !found)
    throw Error(ErrorCode::kNotFound, "model '" + model + "'" + (version.empty() ? "" : " version " + version) +
                                          " is not in the repository");
  return {{"model_stats", stats}};
}

json InferenceServer::RepositoryIndex(bool ready_only) {
  json out = json::array();
  for (const ModelIndexEntry& entry : impl_->manager->Index()) {
    if (ready_only && entry.status != ModelStatus::kReady) continue;
    out.push_back(
        {{"name", entry.name}, {"version", entry.version}, {"state", StateName(entry.status)}, {"reason", entry.reason}});
  }
  return out;
}

void InferenceServer::LoadModel(const std::string& model, const json& parameters) {
  impl_->manager->Load(model, CheckRepositoryParameters("load", model, parameters));
}

void InferenceServer::UnloadModel(const std::string& model, const json& parameters) {
  CheckRepositoryParameters("unload", model, parameters);
  try {
    impl_->manager->Unload(model);
  } catch (const Error& e) {
    // Unloading a model that exists but is not loaded is a no-op, as in Triton.
    if (e.code() != ErrorCode::kNotFound) throw;
    bool known = false;
    for (const ModelIndexEntry& entry : impl_->manager->Index()) known |= entry.name == model;
    if (!known) throw;
  }
}

InferenceServer::InferResult InferenceServer::Infer(const std::string& model, const std::string& version,
                                                    const Decoder& decode, const Deadline& transport) {
  const auto start = std::chrono::steady_clock::now();
  auto micros = [&] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  };
  try {
    InferResult result = InferUntimed(model, version, decode, start, transport);
    impl_->Record(model, true, micros());
    return result;
  } catch (const Error& e) {
    // Unknown models are not recorded, so requests cannot grow the label set without bound.
    if (e.code() != ErrorCode::kNotFound) impl_->Record(model, false, micros());
    throw;
  } catch (const std::exception&) {
    impl_->Record(model, false, micros());
    throw;
  }
}

InferenceServer::InferResult InferenceServer::InferUntimed(const std::string& model, const std::string& version,
                                                           const Decoder& decode,
                                                           std::chrono::steady_clock::time_point arrived,
                                                           const Deadline& transport) {
  InferResult result;
  result.loaded = impl_->AcquireModel(model, version);
  const LoadedModel& loaded = *result.loaded;
  ImageBudget budget(impl_->limits);
  result.shared_memory = impl_->shared_memory.get();
  result.request = decode(
      loaded.model->graph().input_infos, impl_->limits,
      [&](const ValueInfo& info, const std::vector<std::string_view>& images, const std::string& what) {
        return impl_->EncodedImagesInput(loaded, info, images, &budget, what);
      },
      result.shared_memory);
  if (!result.request.ignored_parameters.empty()) {
    std::string names;
    for (const std::string& p : result.request.ignored_parameters) names += (names.empty() ? "" : ", ") + p;
    log::Event(log::Level::kWarning, "parameter_ignored",
               "infer '" + model + "': osprey does not act on these request parameters: " + names,
               {{"model", model}, {"parameters", result.request.ignored_parameters}});
  }
  const Deadline deadline = RequestDeadline(arrived, impl_->limits.max_seconds, result.request.timeout_us, transport);
  result.results = impl_->scheduler->Run(result.loaded, std::move(result.request.inputs), deadline);
  impl_->manager->AfterRun();
  return result;
}

}  // namespace osprey::serve
