#pragma once
// Wire-level split of an ONNX model's bulk bytes from its structure, so protobuf parses kilobytes instead of copying
// every weight into a std::string first (docs/performance.md, "Cold start").
#include <cstddef>
#include <string>
#include <vector>

namespace osprey::onnx_wire {

/// Where an initializer's raw_data payload lies in the serialized model.
struct RawSpan {
  const char* data = nullptr;
  size_t size = 0;
  bool present = false;  // false: the initializer had no raw_data field (its values are in typed fields or external)
};

/// Copies the serialized ModelProto `data` into `stripped`, leaving out the raw_data payloads of the main graph's
/// initializers (ModelProto.graph.initializer[i].raw_data), which are recorded in `spans`, one entry per initializer
/// in file order (= the parsed graph's initializer order). Each stripped raw_data field is written back empty, so
/// the parsed TensorProto still has_raw_data(). Everything else (nodes, attributes, If branches, functions, unknown
/// fields) is copied byte for byte. Returns false when the bytes are not well-formed protobuf along that path (bad
/// varint, length past the end, group wire types); the caller then parses `data` whole, which reports the error.
bool StripInitializerData(const char* data, size_t size, std::string* stripped, std::vector<RawSpan>* spans);

}  // namespace osprey::onnx_wire
