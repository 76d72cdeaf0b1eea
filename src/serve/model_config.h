#pragma once
// A model's serving configuration in Triton's terms (inference::ModelConfig, src/serve/proto/inference.proto): read
// from an optional Triton `config.pbtxt` in the model directory, completed from the model itself, and reported by
// GET /v2/models/{m}/config and the gRPC ModelConfig call (what perf_analyzer and model_analyzer ask first).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "osprey/model_dir.h"
#include "serve/proto/inference.pb.h"

namespace osprey::serve {

/// Reads a Triton config.pbtxt. Fields osprey uses (max_batch_size, dynamic_batching.max_queue_delay_microseconds,
/// input/output names, types and dims, version_policy, model_warmup) go into `config`; every other field is read past
/// and named in `ignored` ("ModelConfig.optimization", "ModelConfig.instance_group", ...). Throws Error
/// kInvalidArgument naming the file and line when the text does not parse.
inference::ModelConfig ReadConfigPbtxt(const std::string& path, std::vector<std::string>* ignored);

/// The same from Triton's JSON form (a repository load request's "config" parameter: proto field names or their
/// lowerCamelCase JSON names, enums by name, 64-bit numbers as numbers or strings); `what` names it in messages.
/// Unknown fields are named in `ignored` like the pbtxt reader's; the checks are the same.
inference::ModelConfig ParseConfigJson(const std::string& text, const std::string& what,
                                       std::vector<std::string>* ignored);

/// The configuration osprey serves `md` with: `declared` (from config.pbtxt, may be empty) checked against the graph —
/// a declared input or output must exist with the same data type and dims — and completed from it (inputs, outputs,
/// labels, max_batch_size: the batching config, else `server_max_batch` when every input's first dim is variable, else
/// 0), plus dynamic_batching from config.json's batching. Throws kInvalidArgument naming the field that disagrees.
inference::ModelConfig ServingConfig(const ModelDirectory& md, const inference::ModelConfig& declared,
                                     int64_t server_max_batch, int streams);

/// Concurrent runs of a model (its streams): the sum of its declared instance_group counts (a count of 0 is Triton's
/// default, 1; at most kMaxInstances, checked when the configuration is read), else `streams` (--streams).
inline constexpr int kMaxInstances = 64;
int Instances(const inference::ModelConfig& declared, int streams);

/// Applies config.pbtxt's batching to `md` when config.json set none: dynamic_batching with max_batch_size > 0 turns
/// osprey's dynamic batching on.
void ApplyBatching(const inference::ModelConfig& declared, ModelDirectory* md);

/// True when `version` may be served under the config's version_policy (latest N of `available`, all, or specific).
bool VersionAllowed(const inference::ModelConfig& config, const std::string& version,
                    const std::vector<std::string>& available);

/// Triton's JSON form of a ModelConfig (what GET /v2/models/{m}/config answers): proto field names, enum names as
/// strings, numbers as numbers.
nlohmann::json ConfigJson(const inference::ModelConfig& config);

/// "TYPE_FP32" etc. for an osprey dtype, and the reverse (throws kInvalidArgument for types osprey has no tensor for).
inference::DataType TritonDType(DType dtype);
DType FromTritonDType(inference::DataType type, const std::string& what);

}  // namespace osprey::serve

namespace osprey {
class Model;
}

namespace osprey::serve {

/// Runs the warmup requests a model's configuration asks for, once each (count times for model_warmup): config.json
/// "warmup" batch sizes with zero inputs (variable dims other than the batch must be the image input's, filled from
/// its preprocessing), then config.pbtxt model_warmup entries (zero_data, random_data, or input_data_file read from
/// `<model>/warmup/`). Returns milliseconds spent; throws Error naming the warmup and input that cannot be built.
double RunWarmup(Model& model, const ModelDirectory& md, const inference::ModelConfig& declared,
                 const std::string& name_dir);

}  // namespace osprey::serve
