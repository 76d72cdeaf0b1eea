// osprey run MODEL --input NAME=FILE.npy ... --output-dir DIR
#include <filesystem>
#include <set>

#include "cli/common.h"
#include "osprey/npy.h"
#include "osprey/onnx.h"

namespace osprey::cli {

int RunRun(const RunOptions& options, std::ostream& out) {
  std::map<std::string, int64_t> dims = ParseDimOverrides(options.dims);
  Graph graph = LoadOnnxModel(options.model);

  std::map<std::string, Tensor> inputs = ReadInputFiles(graph, options.inputs);
  uint64_t rng = options.seed;
  std::vector<std::string> missing;
  for (const ValueInfo& info : graph.input_infos) {
    if (inputs.count(info.name)) continue;
    if (options.random_inputs)
      inputs[info.name] = RandomInput(info.dtype, ConcreteInputShape(info, dims), &rng);
    else
      missing.push_back("'" + info.name + "' (" + DTypeName(info.dtype) + " " + info.ShapeString() + ")");
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw Error(ErrorCode::kInvalidArgument,
                "missing input(s) " + list + "; give them with --input NAME=FILE.npy or use --random-inputs");
  }

  ModelOptions model_options;
  model_options.compile.num_threads = options.threads;
  model_options.compile.precision = ParsePrecision(options.precision, "--precision");
  model_options.compile.device = ParseDevice(options.device, "--device");
  if (options.reference) {
    model_options.compile.fast_kernels = false;
    model_options.compile.fuse = false;
  }
  Model model(std::move(graph), model_options);
  std::vector<std::pair<std::string, Tensor>> outputs = model.Run(inputs);

  std::error_code ec;
  std::filesystem::create_directories(options.output_dir, ec);
  if (ec)
    throw Error(ErrorCode::kUnavailable,
                "cannot create output directory '" + options.output_dir + "': " + ec.message());
  std::set<std::string> used;
  for (auto& [name, tensor] : outputs) {
    std::string base = SanitizeFileName(name);
    std::string file = base;
    for (int k = 1; used.count(file); ++k) file = base + "_" + std::to_string(k);
    used.insert(file);
    std::string path = (std::filesystem::path(options.output_dir) / (file + ".npy")).string();
    std::string note;
    Tensor to_write = tensor;
    if (tensor.dtype() == DType::kBF16) {
      // numpy has no bfloat16; float32 holds every bfloat16 value exactly.
      to_write = CastTensor(tensor, DType::kF32);
      note = " (bfloat16 written as float32)";
    }
    WriteNpy(path, to_write);
    out << name << "  " << DTypeName(tensor.dtype()) << "  " << ShapeToString(tensor.shape()) << "  -> " << path << note
        << "\n";
  }
  return 0;
}

}  // namespace osprey::cli
