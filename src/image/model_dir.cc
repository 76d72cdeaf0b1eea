// Model directories: locating model.onnx / config.json / labels.txt, parsing and validating config.json, and deriving
// preprocessing defaults from the model's input shape.
#include "osprey/model_dir.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "osprey/device.h"
#include "osprey/onnx.h"
#include "osprey/runtime.h"

namespace osprey {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<float> kImageNetMean = {0.485f, 0.456f, 0.406f};
const std::vector<float> kImageNetStd = {0.229f, 0.224f, 0.225f};

std::string ReadTextFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, path.string() + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool IsNumber(const std::string& s) {
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string JoinStrings(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// ---- config.json field readers: every error names the file and the field path ----

struct FieldReader {
  const std::string& source;
  std::string prefix;  // "preprocess." or ""

  [[noreturn]] void Fail(const std::string& field, const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument, source + ": field \"" + prefix + field + "\": " + what);
  }
  static std::string TypeOf(const json& v) { return v.type_name(); }

  void CheckKnown(const json& object, const std::vector<std::string>& known) const {
    std::vector<std::string> unknown;
    for (auto it = object.begin(); it != object.end(); ++it)
      if (std::find(known.begin(), known.end(), it.key()) == known.end())
        unknown.push_back("\"" + prefix + it.key() + "\"");
    if (!unknown.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  source + ": unknown field" + (unknown.size() > 1 ? "s " : " ") + JoinStrings(unknown, ", ") +
                      " (known fields" + (prefix.empty() ? "" : " of \"" + prefix.substr(0, prefix.size() - 1) + "\"") +
                      ": " + JoinStrings(known, ", ") + ")");
  }
  std::string String(const json& v, const std::string& field, const std::vector<std::string>& allowed) const {
    if (!v.is_string()) Fail(field, "expected a string, found " + TypeOf(v));
    std::string s = v.get<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end())
      Fail(field, "expected one of " + JoinStrings(allowed, ", ") + ", found \"" + s + "\"");
    return s;
  }
  int64_t PositiveInt(const json& v, const std::string& field, int64_t max_value) const {
    if (!v.is_number_integer()) Fail(field, "expected a positive integer, found " + v.dump());
    int64_t x = v.get<int64_t>();
    if (x < 1 || x > max_value)
      Fail(field, "expected an integer in 1.." + std::to_string(max_value) + ", found " + v.dump());
    return x;
  }
  float Float(const json& v, const std::string& field) const {
    if (!v.is_number()) Fail(field, "expected a number, found " + TypeOf(v));
    double d = v.get<double>();
    if (!std::isfinite(d)) Fail(field, "expected a finite number");
    return static_cast<float>(d);
  }
  std::vector<float> Floats(const json& v, const std::string& field) const {
    if (!v.is_array() || v.empty() || v.size() > 4)
      Fail(field, "expected an array of 1 to 4 numbers (one per channel, or one for all), found " + v.dump());
    std::vector<float> out;
    for (const json& x : v) out.push_back(Float(x, field));
    return out;
  }
};

constexpr int64_t kMaxImageSide = 16384;

}  // namespace

std::string ModelDirectory::Label(int64_t index) const {
  if (index >= 0 && index < static_cast<int64_t>(labels.size())) return labels[index];
  return std::to_string(index);
}

std::string PreprocessSpec::Describe(const std::string& indent) const {
  std::ostringstream out;
  auto floats = [](const std::vector<float>& v) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
    s << "]";
    return s.str();
  };
  out << indent << "input:       " << input << "\n";
  if (resize == "exact") {
    out << indent << "resize:      exact " << crop_height << "x" << crop_width << " (" << resize_mode << ")\n";
  } else if (resize == "shorter") {
    out << indent << "resize:      shorter side to " << resize_size << " (" << resize_mode << "), centre crop "
        << crop_height << "x" << crop_width << "\n";
  } else {
    out << indent << "resize:      longer side to " << resize_size << " (" << resize_mode << "), pad to " << crop_height
        << "x" << crop_width << "\n";
  }
  out << indent << "color:       " << color << "\n";
  out << indent << "scale:       " << scale << "\n";
  out << indent << "mean:        " << floats(mean) << "\n";
  out << indent << "std:         " << floats(std) << "\n";
  out << indent << "layout:      " << layout << "\n";
  out << indent << "antialias:   " << (antialias ? "true" : "false") << "\n";
  out << indent << "jpeg decode: " << (jpeg_dct_scaling ? "DCT-scaled when large" : "full size") << "\n";
  if (dtype != DType::kF32) out << indent << "element type: " << DTypeName(dtype) << " (computed in float32)\n";
  return out.str();
}

std::string PreprocessSpec::ToJson() const {
  json j;
  j["input"] = input;
  j["resize"] = resize;
  j["resize_mode"] = resize_mode;
  if (resize != "exact") j["resize_size"] = resize_size;
  j["height"] = crop_height;
  j["width"] = crop_width;
  j["color"] = color;
  j["scale"] = scale;
  j["mean"] = mean;
  j["std"] = std;
  j["layout"] = layout;
  j["antialias"] = antialias;
  j["jpeg_dct_scaling"] = jpeg_dct_scaling;
  if (dtype != DType::kF32) j["dtype"] = DTypeName(dtype);
  return j.dump();
}

PreprocessSpec DerivePreprocessSpec(const Graph& graph) {
  if (graph.input_infos.empty())
    throw Error(ErrorCode::kInvalidArgument, "model has no inputs: cannot derive preprocessing (write config.json)");
  std::vector<const ValueInfo*> candidates;
  for (const ValueInfo& info : graph.input_infos)
    if (info.has_shape && info.dims.size() == 4) candidates.push_back(&info);
  if (candidates.size() != 1) {
    std::string names;
    for (const ValueInfo& info : graph.input_infos)
      names += (names.empty() ? "" : ", ") + info.name + " " + info.ShapeString();
    throw Error(ErrorCode::kInvalidArgument,
                "cannot derive preprocessing: expected exactly one rank-4 image input, found " +
                    std::to_string(candidates.size()) + " among " + names + " (write config.json with \"input\")");
  }
  const ValueInfo& info = *candidates[0];
  PreprocessSpec spec;
  spec.input = info.name;
  spec.dtype = info.dtype;
  auto fixed = [&](int i) { return info.dims[i].value; };
  int64_t channels = 0, h = -1, w = -1;
  if (fixed(1) == 1 || fixed(1) == 3) {
    spec.layout = "NCHW";
    channels = fixed(1);
    h = fixed(2);
    w = fixed(3);
  } else if (fixed(3) == 1 || fixed(3) == 3) {
    spec.layout = "NHWC";
    channels = fixed(3);
    h = fixed(1);
    w = fixed(2);
  } else {
    throw Error(ErrorCode::kInvalidArgument, "cannot derive preprocessing: input '" + info.name + "' " +
                                                 info.ShapeString() +
                                                 " has no channel dim of 1 or 3 at position 1 (NCHW) or 3 (NHWC) "
                                                 "(write config.json)");
  }
  spec.color = channels == 1 ? "GRAY" : "RGB";
  spec.crop_height = h > 0 ? h : 224;
  spec.crop_width = w > 0 ? w : 224;
  spec.resize = "shorter";
  spec.resize_size = static_cast<int64_t>(std::lround(std::max(spec.crop_height, spec.crop_width) / 0.875));
  if (channels == 1) {
    spec.mean = {0.449f};  // ImageNet's per-channel values averaged
    spec.std = {0.226f};
  } else {
    spec.mean = kImageNetMean;
    spec.std = kImageNetStd;
  }
  return spec;
}

void CheckPreprocessSpec(const PreprocessSpec& spec, const Graph& graph) {
  const ValueInfo* info = nullptr;
  for (const ValueInfo& i : graph.input_infos)
    if (i.name == spec.input) info = &i;
  if (info == nullptr) {
    std::string names;
    for (const ValueInfo& i : graph.input_infos) names += (names.empty() ? "'" : ", '") + i.name + "'";
    throw Error(ErrorCode::kInvalidArgument,
                "preprocessing input '" + spec.input + "': the model has no such input (inputs: " + names + ")");
  }
  const std::string what = "model input '" + info->name + "' " + info->ShapeString();
  if (info->dtype != DType::kF32 && info->dtype != DType::kF16 && info->dtype != DType::kBF16)
    throw Error(ErrorCode::kInvalidArgument, what +
                                                 ": expected float32, float16 or bfloat16 for image preprocessing, "
                                                 "found " +
                                                 DTypeName(info->dtype));
  if (info->dtype != spec.dtype)
    throw Error(ErrorCode::kInvalidArgument, what + ": the preprocessing makes " + DTypeName(spec.dtype) +
                                                 " images, the model takes " + DTypeName(info->dtype));
  if (!info->has_shape || info->dims.size() != 4)
    throw Error(ErrorCode::kInvalidArgument, what + ": expected rank 4 (" + spec.layout + ")");
  const bool nchw = spec.layout == "NCHW";
  const int64_t c = info->dims[nchw ? 1 : 3].value, h = info->dims[nchw ? 2 : 1].value,
                w = info->dims[nchw ? 3 : 2].value;
  if (c >= 0 && c != spec.channels())
    throw Error(ErrorCode::kInvalidArgument, what + ": color " + spec.color + " gives " +
                                                 std::to_string(spec.channels()) + " channel(s) in layout " +
                                                 spec.layout + ", the model expects " + std::to_string(c));
  if ((h >= 0 && h != spec.crop_height) || (w >= 0 && w != spec.crop_width))
    throw Error(ErrorCode::kInvalidArgument, what + ": preprocessing makes " + std::to_string(spec.crop_height) + "x" +
                                                 std::to_string(spec.crop_width) + " images (height x width), the " +
                                                 "model expects " + std::to_string(h) + "x" + std::to_string(w) +
                                                 " in layout " + spec.layout);
  auto check_per_channel = [&](const std::vector<float>& v, const char* field) {
    if (v.size() != 1 && v.size() != static_cast<size_t>(spec.channels()))
      throw Error(ErrorCode::kInvalidArgument, std::string("preprocess.") + field + ": expected 1 or " +
                                                   std::to_string(spec.channels()) + " values for color " + spec.color +
                                                   ", found " + std::to_string(v.size()));
  };
  check_per_channel(spec.mean, "mean");
  check_per_channel(spec.std, "std");
  for (float s : spec.std)
    if (!(s != 0.0f)) throw Error(ErrorCode::kInvalidArgument, "preprocess.std: values must be non-zero");
  if (spec.resize == "shorter" && spec.resize_size < std::max(spec.crop_height, spec.crop_width))
    throw Error(ErrorCode::kInvalidArgument, "preprocess.resize_size: the shorter side (" +
                                                 std::to_string(spec.resize_size) + ") must be at least the crop " +
                                                 std::to_string(spec.crop_height) + "x" +
                                                 std::to_string(spec.crop_width));
  if (spec.resize == "longer" && spec.resize_size > std::min(spec.crop_height, spec.crop_width))
    throw Error(ErrorCode::kInvalidArgument, "preprocess.resize_size: the longer side (" +
                                                 std::to_string(spec.resize_size) + ") must fit the padded size " +
                                                 std::to_string(spec.crop_height) + "x" +
                                                 std::to_string(spec.crop_width));
}

void ParseModelConfig(const std::string& text, const std::string& source, PreprocessSpec* preprocess,
                      PostprocessSpec* postprocess, BatchingSpec* batching, std::string* precision,
                      std::string* device) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorCode::kInvalidArgument, source + ": not valid JSON: " + e.what());
  }
  FieldReader top{source, ""};
  if (!root.is_object()) throw Error(ErrorCode::kInvalidArgument, source + ": expected a JSON object at the top level");
  top.CheckKnown(root, {"input", "description", "preprocess", "postprocess", "batching", "max_batch_size",
                        "max_queue_delay_us", "precision", "warmup", "device"});
  if (root.contains("device")) {
    const std::string d = top.String(root["device"], "device", {});
    try {
      ParseDevice(d, "device");
    } catch (const Error& e) {
      top.Fail("device", e.what());
    }
    if (device) *device = d;
  }
  if (root.contains("precision")) {
    const std::string p = top.String(root["precision"], "precision", {});
    try {
      ParsePrecision(p, "precision");
    } catch (const Error& e) {
      top.Fail("precision", e.what());
    }
    if (precision) *precision = p;
  }
  if (root.contains("description")) top.String(root["description"], "description", {});
  if (root.contains("input")) {
    preprocess->input = top.String(root["input"], "input", {});
    if (preprocess->input.empty()) top.Fail("input", "expected a non-empty input name");
  }

  if (root.contains("preprocess")) {
    const json& p = root["preprocess"];
    if (!p.is_object()) top.Fail("preprocess", "expected an object, found " + std::string(p.type_name()));
    FieldReader r{source, "preprocess."};
    r.CheckKnown(
        p, {"resize", "resize_mode", "resize_size", "height", "width", "color", "scale", "mean", "std", "layout",
            "antialias", "jpeg_dct_scaling"});
    bool size_changed = false;
    if (p.contains("resize")) preprocess->resize = r.String(p["resize"], "resize", {"shorter", "exact", "longer"});
    if (p.contains("resize_mode"))
      preprocess->resize_mode = r.String(p["resize_mode"], "resize_mode", {"nearest", "bilinear", "bicubic", "area"});
    if (p.contains("height")) {
      preprocess->crop_height = r.PositiveInt(p["height"], "height", kMaxImageSide);
      size_changed = true;
    }
    if (p.contains("width")) {
      preprocess->crop_width = r.PositiveInt(p["width"], "width", kMaxImageSide);
      size_changed = true;
    }
    if (p.contains("resize_size")) {
      if (preprocess->resize == "exact")
        r.Fail("resize_size", "not used with resize \"exact\" (which resizes to height x width)");
      preprocess->resize_size = r.PositiveInt(p["resize_size"], "resize_size", kMaxImageSide);
    } else if (size_changed || p.contains("resize")) {
      const int64_t side = std::max(preprocess->crop_height, preprocess->crop_width);
      preprocess->resize_size = preprocess->resize == "shorter"
                                    ? std::lround(side / 0.875)
                                    : std::min(preprocess->crop_height, preprocess->crop_width);
    }
    if (p.contains("color")) {
      const int before = preprocess->channels();
      preprocess->color = r.String(p["color"], "color", {"RGB", "BGR", "GRAY"});
      // Derived mean/std were for the derived channel count; averaged or repeated for the configured one.
      if (preprocess->channels() != before && !p.contains("mean") && !p.contains("std")) {
        if (preprocess->channels() == 1) {
          preprocess->mean = {0.449f};
          preprocess->std = {0.226f};
        } else {
          preprocess->mean = kImageNetMean;
          preprocess->std = kImageNetStd;
        }
      }
    }
    if (p.contains("scale")) preprocess->scale = r.Float(p["scale"], "scale");
    if (p.contains("mean")) preprocess->mean = r.Floats(p["mean"], "mean");
    if (p.contains("std")) {
      preprocess->std = r.Floats(p["std"], "std");
      for (float s : preprocess->std)
        if (s == 0.0f) r.Fail("std", "values must be non-zero");
    }
    if (p.contains("layout")) preprocess->layout = r.String(p["layout"], "layout", {"NCHW", "NHWC"});
    for (auto [field, target] : {std::pair{"antialias", &preprocess->antialias},
                                 std::pair{"jpeg_dct_scaling", &preprocess->jpeg_dct_scaling}}) {
      if (!p.contains(field)) continue;
      if (!p[field].is_boolean()) r.Fail(field, "expected true or false, found " + p[field].dump());
      *target = p[field].get<bool>();
    }
  }

  if (root.contains("postprocess")) {
    const json& p = root["postprocess"];
    if (!p.is_object()) top.Fail("postprocess", "expected an object, found " + std::string(p.type_name()));
    FieldReader r{source, "postprocess."};
    r.CheckKnown(p, {"softmax", "top_k"});
    if (p.contains("softmax")) {
      if (!p["softmax"].is_boolean()) r.Fail("softmax", "expected true or false, found " + p["softmax"].dump());
      postprocess->softmax = p["softmax"].get<bool>();
    }
    if (p.contains("top_k")) postprocess->top_k = static_cast<int>(r.PositiveInt(p["top_k"], "top_k", 1000000));
  }

  // Batching: a "batching" object, or its fields at the top level (not both).
  BatchingSpec batch_spec = batching ? *batching : BatchingSpec{};
  auto read_batching = [&](const json& object, const FieldReader& r) {
    auto non_negative = [&](const char* field, int64_t max_value) {
      const json& v = object[field];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > max_value)
        r.Fail(field, "expected an integer in 0.." + std::to_string(max_value) + ", found " + v.dump());
      return v.get<int64_t>();
    };
    if (object.contains("max_batch_size")) batch_spec.max_batch_size = non_negative("max_batch_size", 1 << 20);
    if (object.contains("max_queue_delay_us"))
      batch_spec.max_queue_delay_us = non_negative("max_queue_delay_us", 60'000'000);
  };
  if (root.contains("batching")) {
    const json& b = root["batching"];
    if (!b.is_object()) top.Fail("batching", "expected an object, found " + std::string(b.type_name()));
    if (root.contains("max_batch_size") || root.contains("max_queue_delay_us"))
      top.Fail("batching",
               "give max_batch_size/max_queue_delay_us either in \"batching\" or at the top level, not both");
    FieldReader r{source, "batching."};
    r.CheckKnown(b, {"max_batch_size", "max_queue_delay_us"});
    read_batching(b, r);
  } else {
    read_batching(root, top);
  }
  if (root.contains("warmup")) {
    const json& w = root["warmup"];
    if (!w.is_array() || w.size() > 16)
      top.Fail("warmup", "expected a list of at most 16 batch sizes, e.g. [1, 8], found " + w.dump());
    batch_spec.warmup.clear();
    for (const json& b : w) {
      if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > 4096)
        top.Fail("warmup", "batch sizes must be integers in 1..4096, found " + b.dump());
      batch_spec.warmup.push_back(b.get<int64_t>());
    }
  }
  if (batching) *batching = batch_spec;
}

namespace {

// True when the first output is made by Softmax, possibly through ops that keep its values (exporters add Identity,
// Reshape, Flatten, Squeeze, Cast after it): applying softmax again would flatten the probabilities.
bool GraphEndsInSoftmax(const Graph& graph) {
  if (graph.outputs.empty()) return false;
  int value = graph.outputs[0];
  for (int hops = 0; hops < 16; ++hops) {
    const Node* producer = nullptr;
    for (const Node& n : graph.nodes)
      for (int o : n.outputs)
        if (o == value) producer = &n;
    if (!producer || !producer->domain.empty()) return false;
    if (producer->op_type == "Softmax") return true;
    static const char* const kValueKeeping[] = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"};
    if (std::none_of(std::begin(kValueKeeping), std::end(kValueKeeping),
                     [&](const char* op) { return producer->op_type == op; }) ||
        producer->inputs.empty() || producer->inputs[0] < 0)
      return false;
    value = producer->inputs[0];
  }
  return false;
}

std::vector<std::string> ReadLabels(const fs::path& path) {
  std::istringstream in(ReadTextFile(path));
  std::vector<std::string> labels;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(line);
  }
  while (!labels.empty() && labels.back().empty()) labels.pop_back();
  return labels;
}

}  // namespace

void FindLabels(ModelDirectory& md, const std::string& version_dir, const std::string& name_dir) {
  std::error_code ec;
  for (const std::string& dir : {version_dir, name_dir}) {
    if (dir.empty()) continue;
    const fs::path file = fs::path(dir) / "labels.txt";
    if (fs::is_regular_file(file, ec)) {
      md.labels_path = file.string();
      md.labels = ReadLabels(file);
      return;
    }
  }
}

ModelDirectory OpenModelDirectory(const std::string& path, const std::string& version) {
  ModelDirectory md;
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw Error(ErrorCode::kNotFound, path + ": no such file or directory");
  fs::path version_dir;  // holds config.json (and maybe labels.txt)
  fs::path name_dir;     // may hold labels.txt
  if (fs::is_regular_file(p, ec)) {
    if (!version.empty())
      throw Error(ErrorCode::kInvalidArgument, path + ": a version was requested but the path is a model file");
    md.model_path = p.string();
    md.name = p.stem().string();
    version_dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  } else if (fs::is_directory(p, ec)) {
    if (fs::is_regular_file(p / "model.onnx", ec)) {  // a version directory
      if (!version.empty() && version != p.filename().string())
        throw Error(ErrorCode::kInvalidArgument, path + ": is version directory '" + p.filename().string() +
                                                     "', but version '" + version + "' was requested");
      version_dir = p;
      fs::path canonical = fs::weakly_canonical(p, ec);
      if (ec) canonical = p;
      md.version = canonical.filename().string();
      name_dir = canonical.parent_path();
      md.name = name_dir.filename().string();
    } else {
      name_dir = p;
      fs::path canonical = fs::weakly_canonical(p, ec);
      md.name = (ec ? p : canonical).filename().string();
      if (!version.empty()) {
        if (version == "." || version == ".." || version.find_first_of("/\\") != std::string::npos)
          throw Error(ErrorCode::kInvalidArgument, "version '" + version + "': expected a version directory name");
        if (!fs::is_regular_file(p / version / "model.onnx", ec))
          throw Error(ErrorCode::kNotFound, path + ": version '" + version + "' has no model.onnx (" +
                                                (p / version / "model.onnx").string() + ")");
        md.version = version;
      } else {
        int64_t best = -1;
        for (const auto& entry : fs::directory_iterator(p, ec)) {
          const std::string v = entry.path().filename().string();
          if (!entry.is_directory() || !IsNumber(v) || !fs::is_regular_file(entry.path() / "model.onnx", ec)) continue;
          const int64_t n = std::stoll(v);
          if (n > best) {
            best = n;
            md.version = v;
          }
        }
        if (best < 0)
          throw Error(ErrorCode::kNotFound, path +
                                                ": not a model directory: expected model.onnx, or numeric version "
                                                "directories <version>/model.onnx");
      }
      version_dir = p / md.version;
    }
    md.model_path = (version_dir / "model.onnx").string();
  } else {
    throw Error(ErrorCode::kInvalidArgument, path + ": expected a model directory or an .onnx file");
  }

  OnnxImportOptions import_options;
  import_options.validate_ops = false;  // compiling validates; `inspect` lists unsupported ops itself
  md.graph = LoadOnnxModel(md.model_path, import_options);

  FindLabels(md, version_dir.string(), name_dir.string());  // beside the model first, then in the name directory

  const fs::path config = version_dir / "config.json";
  const bool has_config = fs::is_regular_file(config, ec);
  md.derived = !has_config;
  md.postprocess.softmax = !GraphEndsInSoftmax(md.graph);
  if (has_config) {
    md.config_path = config.string();
    std::string derive_error;
    try {
      md.preprocess = DerivePreprocessSpec(md.graph);
    } catch (const Error& e) {
      derive_error = e.what();  // config.json must then say everything the shape cannot
      md.preprocess = PreprocessSpec{};
    }
    ParseModelConfig(ReadTextFile(config), md.config_path, &md.preprocess, &md.postprocess, &md.batching,
                     &md.precision, &md.device);
    if (md.preprocess.input.empty()) {
      if (md.graph.input_infos.size() == 1)
        md.preprocess.input = md.graph.input_infos[0].name;
      else
        throw Error(ErrorCode::kInvalidArgument, md.config_path + ": field \"input\" is needed: " + derive_error);
    }
    for (const ValueInfo& info : md.graph.input_infos)
      if (info.name == md.preprocess.input) md.preprocess.dtype = info.dtype;
    if (md.preprocess.mean.empty()) md.preprocess.mean.assign(md.preprocess.channels(), 0.0f);
    if (md.preprocess.std.empty()) md.preprocess.std.assign(md.preprocess.channels(), 1.0f);
    try {
      CheckPreprocessSpec(md.preprocess, md.graph);
    } catch (const Error& e) {
      throw Error(e.code(), md.config_path + ": " + e.what());
    }
  } else {
    md.preprocess = DerivePreprocessSpec(md.graph);
    CheckPreprocessSpec(md.preprocess, md.graph);
  }
  return md;
}

}  // namespace osprey
