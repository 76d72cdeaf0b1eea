#include "serve/model_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>

#include "osprey/error.h"
#include "osprey/runtime.h"
#include "serve/tensor_json.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

Error Bad(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }

// Parse errors with their line, and the fields the parser read past (its "has no field named" warnings).
class Collector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    errors.push_back("line " + std::to_string(line + 1) + ", column " + std::to_string(column + 1) + ": " + message);
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    // 'Message type "inference.ModelConfig" has no field named "optimization".'
    const std::string type = Quoted(message, "Message type \"");
    const std::string field = Quoted(message, "has no field named \"");
    if (!field.empty()) {
      const size_t dot = type.rfind('.');
      ignored.push_back((dot == std::string::npos ? type : type.substr(dot + 1)) + "." + field);
    } else {
      ignored.push_back("line " + std::to_string(line + 1) + ": " + message);
    }
  }
  std::vector<std::string> errors, ignored;

 private:
  static std::string Quoted(const std::string& text, const std::string& before) {
    const size_t start = text.find(before);
    if (start == std::string::npos) return "";
    const size_t from = start + before.size(), end = text.find('"', from);
    return end == std::string::npos ? "" : text.substr(from, end - from);
  }
};

bool BatchableInputs(const Graph& graph) {
  if (graph.input_infos.empty()) return false;
  for (const ValueInfo& info : graph.input_infos)
    if (!info.has_shape || info.dims.empty() || info.dims[0].value >= 0) return false;
  return true;
}

// The graph's dims of a tensor as Triton reports them: -1 for variable dims, without the batch dim when batching.
std::vector<int64_t> ReportedDims(const ValueInfo& info, bool batched) {
  std::vector<int64_t> dims;
  if (!info.has_shape) return {-1};
  for (size_t i = batched ? 1 : 0; i < info.dims.size(); ++i) dims.push_back(info.dims[i].value < 0 ? -1 : info.dims[i].value);
  return dims;
}

template <class Declared>
void CheckDeclared(const Declared& declared, const ValueInfo& info, bool batched, const char* kind) {
  const std::string what = std::string("config.pbtxt ") + kind + " '" + declared.name() + "'";
  if (declared.data_type() != inference::TYPE_INVALID && declared.data_type() != TritonDType(info.dtype))
    throw Bad(what + ": data_type " + inference::DataType_Name(declared.data_type()) + " but the model's is " +
              inference::DataType_Name(TritonDType(info.dtype)));
  if (declared.dims_size() == 0 || !info.has_shape) return;
  const std::vector<int64_t> model = ReportedDims(info, batched);
  bool ok = static_cast<size_t>(declared.dims_size()) == model.size();
  for (size_t i = 0; ok && i < model.size(); ++i)
    ok = declared.dims(static_cast<int>(i)) == -1 || model[i] == -1 || declared.dims(static_cast<int>(i)) == model[i];
  if (!ok) {
    std::string d;
    for (int64_t v : declared.dims()) d += (d.empty() ? "" : ", ") + std::to_string(v);
    throw Bad(what + ": dims [" + d + "] do not fit the model's " + info.ShapeString() +
              (batched ? " (without the batch dim, as max_batch_size > 0)" : ""));
  }
}

json Dims(const google::protobuf::RepeatedField<int64_t>& dims) { return json(std::vector<int64_t>(dims.begin(), dims.end())); }

// The keys of a JSON configuration that `type` has no field for (by proto name or JSON name), as "Type.key",
// recursing into message fields (objects, and arrays of objects; CheckJsonDepth bounded the nesting).
void UnknownJsonFields(const json& object, const google::protobuf::Descriptor& type,
                       std::vector<std::string>* unknown) {
  for (const auto& [key, value] : object.items()) {
    const google::protobuf::FieldDescriptor* field = type.FindFieldByName(key);
    for (int i = 0; !field && i < type.field_count(); ++i)
      if (type.field(i)->json_name() == key) field = type.field(i);
    if (!field) {
      unknown->push_back(type.name() + "." + key);
      continue;
    }
    if (field->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE || field->is_map()) continue;
    const google::protobuf::Descriptor& inner = *field->message_type();
    if (value.is_object()) UnknownJsonFields(value, inner, unknown);
    if (value.is_array())
      for (const json& item : value)
        if (item.is_object()) UnknownJsonFields(item, inner, unknown);
  }
}

// The model's concurrent runs its instance groups declare: their counts summed, a count of 0 (Triton's default) as 1.
int64_t InstanceSum(const inference::ModelConfig& config) {
  int64_t total = 0;
  for (const auto& g : config.instance_group()) total += g.count() <= 0 ? 1 : g.count();
  return total;
}

// The checks and "not acted on" notes both readers share; `path` names the source in messages.
inference::ModelConfig CheckedConfig(inference::ModelConfig config, const std::string& path,
                                     std::vector<std::string> skipped, std::vector<std::string>* ignored);

}  // namespace

inference::DataType TritonDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return inference::TYPE_FP32;
    case DType::kF16: return inference::TYPE_FP16;
    case DType::kBF16: return inference::TYPE_BF16;
    case DType::kI8: return inference::TYPE_INT8;
    case DType::kU8: return inference::TYPE_UINT8;
    case DType::kI32: return inference::TYPE_INT32;
    case DType::kI64: return inference::TYPE_INT64;
    case DType::kBool: return inference::TYPE_BOOL;
  }
  return inference::TYPE_INVALID;
}

DType FromTritonDType(inference::DataType type, const std::string& what) {
  switch (type) {
    case inference::TYPE_FP32: return DType::kF32;
    case inference::TYPE_FP16: return DType::kF16;
    case inference::TYPE_BF16: return DType::kBF16;
    case inference::TYPE_INT8: return DType::kI8;
    case inference::TYPE_UINT8: return DType::kU8;
    case inference::TYPE_INT32: return DType::kI32;
    case inference::TYPE_INT64: return DType::kI64;
    case inference::TYPE_BOOL: return DType::kBool;
    default:
      throw Bad(what + ": data type " + inference::DataType_Name(type) + " has no osprey tensor type");
  }
}

inference::ModelConfig ReadConfigPbtxt(const std::string& path, std::vector<std::string>* ignored) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  inference::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  Collector collector;
  parser.RecordErrorsTo(&collector);
  parser.AllowUnknownField(true);
  parser.SetRecursionLimit(16);
  if (!parser.ParseFromString(text.str(), &config) || !collector.errors.empty())
    throw Bad(path + ": not a valid Triton model configuration: " +
              (collector.errors.empty() ? std::string("parse error") : collector.errors.front()));
  return CheckedConfig(std::move(config), path, collector.ignored, ignored);
}

inference::ModelConfig ParseConfigJson(const std::string& text, const std::string& what,
                                       std::vector<std::string>* ignored) {
  json parsed;
  try {
    CheckJsonDepth(text);
    parsed = json::parse(text, nullptr, true, false);
  } catch (const json::exception& e) {
    throw Bad(what + ": not JSON: " + e.what());
  }
  if (!parsed.is_object()) throw Bad(what + ": must be a JSON object (Triton's model configuration)");
  std::vector<std::string> skipped;
  UnknownJsonFields(parsed, *inference::ModelConfig::descriptor(), &skipped);
  inference::ModelConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &config, options);
  if (!status.ok()) throw Bad(what + ": not a valid Triton model configuration: " + std::string(status.message()));
  return CheckedConfig(std::move(config), what, skipped, ignored);
}

namespace {

inference::ModelConfig CheckedConfig(inference::ModelConfig config, const std::string& path,
                                     std::vector<std::string> skipped, std::vector<std::string>* ignored) {
  // Declared (so that the config endpoint can report them) but not acted on.
  for (const auto& g : config.instance_group()) {
    if (g.count() < 0 || g.count() > kMaxInstances)
      throw Bad(path + ": instance_group count " + std::to_string(g.count()) + ": 0 to " +
                std::to_string(kMaxInstances) + " (concurrent runs of the model)");
    if (g.kind() != inference::ModelInstanceGroup::KIND_AUTO && g.kind() != inference::ModelInstanceGroup::KIND_CPU)
      skipped.push_back("ModelInstanceGroup.kind " + inference::ModelInstanceGroup::Kind_Name(g.kind()) +
                        " (the model runs where config.json's device or --device puts it)");
  }
  if (const int64_t instances = InstanceSum(config); instances > kMaxInstances)
    throw Bad(path + ": instance_group counts sum to " + std::to_string(instances) + ", more than " +
              std::to_string(kMaxInstances) + " concurrent runs of the model");
  if (config.dynamic_batching().preferred_batch_size_size() > 0)
    skipped.push_back("ModelDynamicBatching.preferred_batch_size");
  if (!config.platform().empty() && config.platform() != "onnxruntime_onnx" && config.platform() != "osprey_onnx")
    skipped.push_back("ModelConfig.platform '" + config.platform() + "' (osprey runs model.onnx)");
  if (!config.default_model_filename().empty() && config.default_model_filename() != "model.onnx")
    throw Bad(path + ": default_model_filename '" + config.default_model_filename() +
              "': osprey serves <version>/model.onnx only");
  for (const auto& w : config.model_warmup())
    for (const auto& [name, input] : w.inputs())
      if (input.data_type() != inference::TYPE_INVALID) (void)FromTritonDType(input.data_type(), path + ": model_warmup");
  if (ignored) *ignored = std::move(skipped);
  return config;
}

}  // namespace

inference::ModelConfig ServingConfig(const ModelDirectory& md, const inference::ModelConfig& declared,
                                     int64_t server_max_batch, int streams) {
  inference::ModelConfig config = declared;
  const Graph& graph = md.graph;
  const bool batchable = BatchableInputs(graph);
  int64_t max_batch = declared.max_batch_size();
  if (max_batch > 0 && !batchable)
    throw Bad("config.pbtxt: max_batch_size " + std::to_string(max_batch) +
              " needs every model input to have a variable first (batch) dim");
  if (max_batch <= 0) {
    if (md.batching.max_batch_size > 0)
      max_batch = md.batching.max_batch_size;
    else if (batchable)
      max_batch = server_max_batch > 0 ? server_max_batch : std::numeric_limits<int32_t>::max();
    else
      max_batch = 0;
  }
  config.set_max_batch_size(static_cast<int32_t>(std::min<int64_t>(max_batch, std::numeric_limits<int32_t>::max())));
  const bool batched = config.max_batch_size() > 0;
  config.set_name(md.name);
  config.set_platform("osprey_onnx");
  config.set_backend("osprey");
  config.set_default_model_filename("model.onnx");
  if (!config.has_version_policy()) config.mutable_version_policy()->mutable_latest()->set_num_versions(1);

  auto fill = [&](auto* list, const std::vector<ValueInfo>& infos, const char* kind) {
    for (const auto& d : *list)
      if (std::none_of(infos.begin(), infos.end(), [&](const ValueInfo& i) { return i.name == d.name(); }))
        throw Bad(std::string("config.pbtxt ") + kind + " '" + d.name() + "': the model has no such " + kind);
    auto declared_list = *list;
    list->Clear();
    for (const ValueInfo& info : infos) {
      auto* t = list->Add();
      for (const auto& d : declared_list)
        if (d.name() == info.name) {
          CheckDeclared(d, info, batched, kind);
          *t = d;
        }
      t->set_name(info.name);
      t->set_data_type(TritonDType(info.dtype));
      t->clear_dims();
      for (int64_t v : ReportedDims(info, batched)) t->add_dims(v);
    }
  };
  fill(config.mutable_input(), graph.input_infos, "input");
  fill(config.mutable_output(), graph.output_infos, "output");
  if (!md.labels.empty() && config.output_size() > 0 && config.output(0).label_filename().empty())
    config.mutable_output(0)->set_label_filename("labels.txt");
  if (md.batching.max_batch_size > 0)
    config.mutable_dynamic_batching()->set_max_queue_delay_microseconds(
        static_cast<uint64_t>(md.batching.max_queue_delay_us));
  config.clear_instance_group();
  auto* group = config.add_instance_group();
  group->set_name(md.name);
  group->set_kind(inference::ModelInstanceGroup::KIND_CPU);
  group->set_count(Instances(declared, streams));
  return config;
}

int Instances(const inference::ModelConfig& declared, int streams) {
  if (declared.instance_group_size() == 0) return streams;
  return static_cast<int>(std::clamp<int64_t>(InstanceSum(declared), 1, kMaxInstances));
}

void ApplyBatching(const inference::ModelConfig& declared, ModelDirectory* md) {
  if (md->batching.max_batch_size > 0 || !declared.has_dynamic_batching() || declared.max_batch_size() <= 0) return;
  md->batching.max_batch_size = declared.max_batch_size();
  md->batching.max_queue_delay_us = static_cast<int64_t>(
      std::min<uint64_t>(declared.dynamic_batching().max_queue_delay_microseconds(), 60'000'000));
}

bool VersionAllowed(const inference::ModelConfig& config, const std::string& version,
                    const std::vector<std::string>& available) {
  if (!config.has_version_policy()) return true;
  const auto& policy = config.version_policy();
  const int64_t v = std::stoll(version);
  switch (policy.policy_choice_case()) {
    case inference::ModelVersionPolicy::kAll:
      return true;
    case inference::ModelVersionPolicy::kSpecific:
      return std::find(policy.specific().versions().begin(), policy.specific().versions().end(), v) !=
             policy.specific().versions().end();
    default: {
      std::vector<int64_t> numbers;
      for (const std::string& a : available) numbers.push_back(std::stoll(a));
      std::sort(numbers.rbegin(), numbers.rend());
      const size_t keep = std::max<uint32_t>(1, policy.latest().num_versions());
      for (size_t i = 0; i < numbers.size() && i < keep; ++i)
        if (numbers[i] == v) return true;
      return false;
    }
  }
}

json ConfigJson(const inference::ModelConfig& config) {
  json out = {{"name", config.name()},
              {"platform", config.platform()},
              {"backend", config.backend()},
              {"max_batch_size", config.max_batch_size()},
              {"default_model_filename", config.default_model_filename()}};
  const auto& policy = config.version_policy();
  if (policy.has_all())
    out["version_policy"] = {{"all", json::object()}};
  else if (policy.has_specific())
    out["version_policy"] = {{"specific", {{"versions", Dims(policy.specific().versions())}}}};
  else
    out["version_policy"] = {{"latest", {{"num_versions", std::max<uint32_t>(1, policy.latest().num_versions())}}}};
  out["input"] = json::array();
  for (const auto& t : config.input())
    out["input"].push_back({{"name", t.name()},
                            {"data_type", inference::DataType_Name(t.data_type())},
                            {"format", inference::ModelInput::Format_Name(t.format())},
                            {"dims", Dims(t.dims())}});
  out["output"] = json::array();
  for (const auto& t : config.output())
    out["output"].push_back({{"name", t.name()},
                             {"data_type", inference::DataType_Name(t.data_type())},
                             {"dims", Dims(t.dims())},
                             {"label_filename", t.label_filename()}});
  if (config.has_dynamic_batching())
    out["dynamic_batching"] = {
        {"preferred_batch_size", std::vector<int32_t>(config.dynamic_batching().preferred_batch_size().begin(),
                                                      config.dynamic_batching().preferred_batch_size().end())},
        {"max_queue_delay_microseconds", config.dynamic_batching().max_queue_delay_microseconds()}};
  out["instance_group"] = json::array();
  for (const auto& g : config.instance_group())
    out["instance_group"].push_back(
        {{"name", g.name()}, {"kind", inference::ModelInstanceGroup::Kind_Name(g.kind())}, {"count", g.count()}});
  out["model_warmup"] = json::array();
  for (const auto& w : config.model_warmup()) {
    json inputs = json::object();
    for (const auto& [name, in] : w.inputs()) {
      json i = {{"data_type", inference::DataType_Name(in.data_type())}, {"dims", Dims(in.dims())}};
      if (in.has_zero_data()) i["zero_data"] = in.zero_data();
      if (in.has_random_data()) i["random_data"] = in.random_data();
      if (in.has_input_data_file()) i["input_data_file"] = in.input_data_file();
      inputs[name] = i;
    }
    out["model_warmup"].push_back({{"name", w.name()}, {"batch_size", w.batch_size()}, {"inputs", inputs},
                                   {"count", w.count()}});
  }
  return out;
}

}  // namespace osprey::serve

namespace osprey::serve {
namespace {

Tensor WarmupTensor(const std::string& what, DType dtype, const Shape& shape, const inference::ModelWarmup::Input* in,
                    const std::string& name_dir, uint64_t seed) {
  Tensor t = Tensor::Zeros(dtype, shape);
  if (!in || in->zero_data() || in->input_data_type_case() == inference::ModelWarmup::Input::INPUT_DATA_TYPE_NOT_SET)
    return t;
  if (in->has_random_data()) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
      switch (dtype) {
        case DType::kF32: t.data<float>()[i] = static_cast<float>(u); break;
        case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(u * 256); break;
        case DType::kBool: t.data<bool>()[i] = u < 0.5; break;
        default: break;  // other types stay zero: any value is valid for them
      }
    }
    return t;
  }
  const std::string file = in->input_data_file();
  if (file.empty() || file.find('/') != std::string::npos || file[0] == '.')
    throw Bad(what + ": input_data_file '" + file + "' must be a file name inside the model's warmup/ folder");
  const std::string path = name_dir + "/warmup/" + file;
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw Bad(what + ": cannot read " + path);
  std::string bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  if (bytes.size() != t.nbytes())
    throw Bad(what + ": " + path + " has " + std::to_string(bytes.size()) + " bytes; shape " + ShapeToString(shape) +
              " of " + DTypeName(dtype) + " needs " + std::to_string(t.nbytes()));
  if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

double RunWarmup(Model& model, const ModelDirectory& md, const inference::ModelConfig& declared,
                 const std::string& name_dir) {
  const auto start = std::chrono::steady_clock::now();
  const Graph& graph = model.graph();
  // config.json: batch sizes, zeros.
  for (int64_t batch : md.batching.warmup) {
    std::map<std::string, Tensor> inputs;
    for (const ValueInfo& info : graph.input_infos) {
      const std::string what = "config.json warmup (batch " + std::to_string(batch) + "): input '" + info.name + "'";
      if (!info.has_shape) throw Bad(what + " has no declared shape; use config.pbtxt model_warmup with dims");
      Shape shape;
      for (size_t i = 0; i < info.dims.size(); ++i) {
        int64_t d = info.dims[i].value;
        if (d < 0 && i == 0) d = batch;
        if (d < 0 && info.name == md.preprocess.input && info.dims.size() == 4) {
          const bool nchw = md.preprocess.layout == "NCHW";
          const size_t h = nchw ? 2 : 1, w = nchw ? 3 : 2, c = nchw ? 1 : 3;
          d = i == h ? md.preprocess.crop_height : i == w ? md.preprocess.crop_width
              : i == c                                   ? md.preprocess.channels()
                                                         : d;
        }
        if (d < 0)
          throw Bad(what + " " + info.ShapeString() +
                    " has a variable dim besides the batch; use config.pbtxt model_warmup with explicit dims");
        shape.push_back(d);
      }
      inputs[info.name] = Tensor::Zeros(info.dtype, shape);
    }
    model.Run(inputs);
  }
  // config.pbtxt model_warmup.
  for (const auto& w : declared.model_warmup()) {
    const std::string warmup = "config.pbtxt model_warmup '" + w.name() + "'";
    std::map<std::string, Tensor> inputs;
    for (const auto& [name, in] : w.inputs()) {
      const std::string what = warmup + ": input '" + name + "'";
      auto info = std::find_if(graph.input_infos.begin(), graph.input_infos.end(),
                               [&](const ValueInfo& i) { return i.name == name; });
      if (info == graph.input_infos.end()) throw Bad(what + ": the model has no such input");
      const DType dtype =
          in.data_type() == inference::TYPE_INVALID ? info->dtype : FromTritonDType(in.data_type(), what);
      Shape shape;
      if (w.batch_size() > 0 && declared.max_batch_size() > 0) shape.push_back(w.batch_size());
      for (int64_t d : in.dims()) {
        if (d < 0) throw Bad(what + ": dims must be concrete, found " + std::to_string(d));
        shape.push_back(d);
      }
      inputs[name] = WarmupTensor(what, dtype, shape, &in, name_dir, std::hash<std::string>()(name));
    }
    try {
      for (uint32_t i = 0; i < std::max<uint32_t>(1, w.count()); ++i) model.Run(inputs);
    } catch (const Error& e) {
      throw Error(e.code(), warmup + ": " + e.what());
    }
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace osprey::serve
