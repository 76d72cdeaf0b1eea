// Writing a changed copy of an ONNX model: new values for some float initializers (a retrained classifier head), the
// rest of the file byte for byte as it was, so weights that did not change stay bit-identical (and shared by the
// server's WeightStore).
#include <onnx/onnx_pb.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "osprey/onnx.h"

namespace osprey {

void WriteOnnxWithInitializers(const std::string& src_path, const std::string& dst_path,
                               const std::map<std::string, Tensor>& replacements, const std::string& output_name,
                               int64_t output_last_dim) {
  std::ifstream in(src_path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open model file '" + src_path + "'");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes))
    throw Error(ErrorCode::kInvalidArgument, "'" + src_path + "' is not a valid ONNX model (protobuf parse failed)");
  onnx::GraphProto* graph = model.mutable_graph();
  std::set<std::string> done;
  for (onnx::TensorProto& init : *graph->mutable_initializer()) {
    if (init.data_location() == onnx::TensorProto::EXTERNAL)
      throw Error(ErrorCode::kUnsupported, "'" + src_path + "' keeps weights in external data files; osprey writes " +
                                               "single-file models only");
    auto it = replacements.find(init.name());
    if (it == replacements.end()) continue;
    const Tensor& t = it->second;
    if (t.dtype() != DType::kF32)
      throw Error(ErrorCode::kInvalidArgument, "replacement for '" + init.name() + "' must be float32");
    const std::string name = init.name();
    init.Clear();
    init.set_name(name);
    init.set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : t.shape()) init.add_dims(d);
    init.set_raw_data(t.raw(), t.nbytes());
    done.insert(name);
  }
  for (const auto& [name, t] : replacements)
    if (!done.count(name))
      throw Error(ErrorCode::kInvalidArgument, "'" + src_path + "' has no initializer named '" + name + "'");
  if (!output_name.empty()) {
    bool found = false;
    for (onnx::ValueInfoProto& out : *graph->mutable_output()) {
      if (out.name() != output_name) continue;
      found = true;
      auto* shape = out.mutable_type()->mutable_tensor_type()->mutable_shape();
      if (output_last_dim >= 0 && shape->dim_size() > 0) {
        auto* last = shape->mutable_dim(shape->dim_size() - 1);
        last->Clear();
        last->set_dim_value(output_last_dim);
      }
    }
    if (!found) throw Error(ErrorCode::kInvalidArgument, "'" + src_path + "' has no graph output '" + output_name + "'");
    // Shapes inferred for intermediate values may name the old class count: drop them (they are optional).
    graph->clear_value_info();
  }
  std::ofstream out(dst_path, std::ios::binary | std::ios::trunc);
  if (!out || !model.SerializeToOstream(&out) || !out.flush())
    throw Error(ErrorCode::kUnavailable, "cannot write model file '" + dst_path + "'");
}

}  // namespace osprey
