#pragma once
/// ONNX importer: turns a serialized ModelProto (opsets 7..28 of the default domain) into an osprey Graph.
/// Protobuf types stay inside src/onnx; nothing here pulls in the generated headers.
#include <cstddef>
#include <map>
#include <string>

#include "osprey/graph.h"
#include "osprey/tensor.h"

namespace osprey {

/// Oldest and newest default-domain opset the importer accepts.
constexpr int kMinOnnxOpset = 7;
constexpr int kMaxOnnxOpset = 28;

/// What the importer does after building the graph.
struct OnnxImportOptions {
  /// Run ValidateOps() at the end, so one kUnsupported error lists every unsupported op with its node name.
  /// Tools that want to report unsupported ops themselves (`osprey inspect`) turn this off.
  bool validate_ops = true;
};

/// Reads and imports the model file at `path`. External data files are resolved relative to the file's directory.
/// Throws kNotFound when the file cannot be opened, kInvalidArgument for malformed models, kUnsupported for opsets,
/// dtypes, subgraphs or ops osprey does not handle. The returned graph is structurally valid and topologically sorted.
Graph LoadOnnxModel(const std::string& path, const OnnxImportOptions& options = {});

/// Imports a serialized ModelProto held in memory (`data` is not retained). External data locations are resolved
/// relative to `base_dir` and must stay inside it; an empty `base_dir` refuses external data.
Graph ParseOnnxModel(const void* data, size_t size, const std::string& base_dir, const OnnxImportOptions& options = {});

/// Parses one serialized TensorProto (the ONNX conformance `.pb` files). External data is refused.
Tensor TensorFromOnnxBytes(const void* data, size_t size);

/// Writes a copy of the ONNX model file at `src_path` to `dst_path` with the named initializers replaced by
/// `replacements` (float32; same names, new shapes and values) and, when `output_name` is given, that graph output's
/// last dim set to `output_last_dim` (intermediate shape annotations are dropped). Everything else is kept as it was,
/// so untouched weights stay bit-identical. Throws kInvalidArgument for names that do not exist, kUnsupported for
/// models with external data.
void WriteOnnxWithInitializers(const std::string& src_path, const std::string& dst_path,
                               const std::map<std::string, Tensor>& replacements, const std::string& output_name = "",
                               int64_t output_last_dim = -1);
/// osprey dtype of an ONNX TensorProto::DataType value; throws kUnsupported naming the type (e.g. "DOUBLE").
DType DTypeFromOnnx(int onnx_type);

/// Name of an ONNX TensorProto::DataType value ("FLOAT", "INT64", ...; "type 99" when unknown).
std::string OnnxDTypeName(int onnx_type);

}  // namespace osprey
