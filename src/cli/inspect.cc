// osprey inspect MODEL [--json]
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "ops/op_registry.h"
#include "osprey/model_dir.h"
#include "osprey/onnx.h"

namespace osprey::cli {

namespace {

nlohmann::json DimsJson(const ValueInfo& info) {
  if (!info.has_shape) return nullptr;
  nlohmann::json dims = nlohmann::json::array();
  for (const Dim& d : info.dims) {
    if (d.value >= 0)
      dims.push_back(d.value);
    else
      dims.push_back(d.symbol.empty() ? "?" : d.symbol);
  }
  return dims;
}

void PrintValueInfos(const std::vector<ValueInfo>& infos, std::ostream& out) {
  size_t width = 4;
  for (const ValueInfo& i : infos) width = std::max(width, i.name.size());
  for (const ValueInfo& i : infos)
    out << "  " << std::left << std::setw(static_cast<int>(width)) << i.name << "  " << std::setw(8)
        << DTypeName(i.dtype) << " " << i.ShapeString() << "\n";
}

}  // namespace

int RunInspect(const InspectOptions& options, std::ostream& out) {
  // A model directory (<name>, <name>/<version>) also shows its preprocessing, from config.json or derived.
  std::optional<ModelDirectory> directory;
  Graph graph;
  if (std::filesystem::is_directory(options.model)) {
    directory = OpenModelDirectory(options.model);
    graph = std::move(directory->graph);
  } else {
    OnnxImportOptions import_options;
    import_options.validate_ops = false;
    graph = LoadOnnxModel(options.model, import_options);
  }

  std::vector<std::string> unsupported = UnsupportedOps(graph);
  std::string problem;  // arity or attribute problems ValidateOps finds once every op is known
  if (unsupported.empty()) {
    try {
      ValidateOps(graph);
    } catch (const Error& e) {
      problem = e.what();
    }
  }

  std::map<std::string, int> histogram;
  for (const Node& n : graph.nodes) ++histogram[(n.domain.empty() ? "" : n.domain + ".") + n.op_type];
  std::vector<std::pair<std::string, int>> ops(histogram.begin(), histogram.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  int64_t parameters = 0;
  for (const auto& [id, t] : graph.constants) parameters += t.numel();
  int64_t parameter_bytes = graph.ConstantBytes();

  if (options.json) {
    nlohmann::json j;
    j["model"] = options.model;
    j["graph"] = graph.name;
    j["opset"] = graph.opset;
    for (const ValueInfo& i : graph.input_infos)
      j["inputs"].push_back({{"name", i.name}, {"dtype", DTypeName(i.dtype)}, {"dims", DimsJson(i)}});
    for (const ValueInfo& i : graph.output_infos)
      j["outputs"].push_back({{"name", i.name}, {"dtype", DTypeName(i.dtype)}, {"dims", DimsJson(i)}});
    if (!j.contains("inputs")) j["inputs"] = nlohmann::json::array();
    j["num_nodes"] = graph.nodes.size();
    j["ops"] = nlohmann::json::object();
    for (const auto& [op, count] : ops) j["ops"][op] = count;
    j["parameters"] = parameters;
    j["parameter_bytes"] = parameter_bytes;
    j["unsupported_ops"] = unsupported;
    if (!problem.empty()) j["error"] = problem;
    j["supported"] = unsupported.empty() && problem.empty();
    if (directory) {
      nlohmann::json d;
      d["name"] = directory->name;
      d["version"] = directory->version;
      d["model_path"] = directory->model_path;
      d["config"] = directory->config_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(directory->config_path);
      d["derived"] = directory->derived;
      d["labels"] = directory->labels.size();
      d["preprocess"] = nlohmann::json::parse(directory->preprocess.ToJson());
      d["postprocess"] = {{"softmax", directory->postprocess.softmax}, {"top_k", directory->postprocess.top_k}};
      j["model_directory"] = d;
    }
    out << j.dump(2) << "\n";
  } else {
    out << "model:      " << options.model << "\n";
    out << "graph:      " << graph.name << "\n";
    out << "opset:      " << graph.opset << "\n";
    out << "inputs:\n";
    PrintValueInfos(graph.input_infos, out);
    out << "outputs:\n";
    PrintValueInfos(graph.output_infos, out);
    out << "nodes:      " << graph.nodes.size() << " (" << ops.size() << " op types)\n";
    out << "ops:\n";
    size_t width = 4;
    for (const auto& [op, count] : ops) width = std::max(width, op.size());
    for (const auto& [op, count] : ops)
      out << "  " << std::left << std::setw(static_cast<int>(width)) << op << "  " << count << "\n";
    out << "parameters: " << parameters << " (" << FormatBytes(parameter_bytes) << ")\n";
    if (unsupported.empty()) {
      out << "unsupported ops: none\n";
    } else {
      out << "unsupported ops: " << unsupported.size() << "\n";
      for (const std::string& u : unsupported) out << "  " << u << "\n";
    }
    if (!problem.empty()) out << "error: " << problem << "\n";
    if (directory) {
      out << "model directory: " << directory->name << (directory->version.empty() ? "" : " version ")
          << directory->version << " (" << directory->model_path << ")\n";
      out << "labels:     "
          << (directory->labels_path.empty() ? "none" : std::to_string(directory->labels.size()) + " (" +
                                                             directory->labels_path + ")")
          << "\n";
      out << "preprocessing (" << (directory->derived ? "derived from the input shape: no config.json" : "from " +
                                                            directory->config_path) << "):\n";
      out << directory->preprocess.Describe("  ");
      out << "postprocessing:\n";
      out << "  softmax:     " << (directory->postprocess.softmax ? "yes" : "no") << "\n";
      out << "  top_k:       " << directory->postprocess.top_k << "\n";
    }
  }
  return unsupported.empty() && problem.empty() ? 0 : 1;
}

}  // namespace osprey::cli
