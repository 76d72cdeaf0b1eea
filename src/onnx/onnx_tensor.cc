// ONNX TensorProto -> osprey Tensor, for initializers, tensor attributes and the conformance .pb files.
#include <onnx/onnx_pb.h>

#include <bit>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>

#include "core/memory_advice.h"
#include "osprey/onnx.h"

namespace osprey {

namespace fs = std::filesystem;

std::string OnnxDTypeName(int onnx_type) {
  if (onnx::TensorProto_DataType_IsValid(onnx_type))
    return onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(onnx_type));
  return "type " + std::to_string(onnx_type);
}

DType DTypeFromOnnx(int onnx_type) {
  switch (onnx_type) {
    case onnx::TensorProto_DataType_FLOAT:
    case onnx::TensorProto_DataType_DOUBLE:  // computed as float32 (TensorFromProto converts the values)
      return DType::kF32;
    case onnx::TensorProto_DataType_FLOAT16:
      return DType::kF16;
    case onnx::TensorProto_DataType_BFLOAT16:
      return DType::kBF16;
    case onnx::TensorProto_DataType_INT8:
      return DType::kI8;
    case onnx::TensorProto_DataType_UINT8:
      return DType::kU8;
    case onnx::TensorProto_DataType_INT32:
      return DType::kI32;
    case onnx::TensorProto_DataType_INT64:
      return DType::kI64;
    case onnx::TensorProto_DataType_BOOL:
      return DType::kBool;
    default:
      break;
  }
  throw Error(ErrorCode::kUnsupported, "ONNX element type " + OnnxDTypeName(onnx_type) +
                                           " is not supported (supported: FLOAT, FLOAT16, BFLOAT16, INT8, UINT8, "
                                           "INT32, INT64, BOOL; DOUBLE as FLOAT)");
}

namespace {

[[noreturn]] void BadTensor(const std::string& what, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, what + ": " + message);
}

uint64_t ParseExternalNumber(const std::string& what, const std::string& key, const std::string& value) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty())
    BadTensor(what, "external data '" + key + "' is not a non-negative integer: '" + value + "'");
  return v;
}

// Reads external data into a new tensor after checking the location stays inside `base_dir` and the byte range fits.
Tensor ReadExternal(const onnx::TensorProto& tp, DType dtype, const Shape& shape, int64_t numel,
                    const std::string& base_dir, const std::string& what) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  bool has_location = false;
  for (const auto& kv : tp.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
      has_location = true;
    } else if (kv.key() == "offset") {
      offset = ParseExternalNumber(what, "offset", kv.value());
    } else if (kv.key() == "length") {
      length = ParseExternalNumber(what, "length", kv.value());
    }
  }
  if (!has_location || location.empty()) BadTensor(what, "external data has no 'location'");
  if (base_dir.empty()) BadTensor(what, "external data '" + location + "' needs the model's directory");
  if (location.find('\0') != std::string::npos) BadTensor(what, "external data location contains a NUL byte");
  fs::path rel(location);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
    BadTensor(what, "external data location '" + location + "' must be relative to the model's directory");
  fs::path file;
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::absolute(base_dir, ec), ec);
  if (ec) BadTensor(what, "cannot resolve model directory '" + base_dir + "': " + ec.message());
  file = fs::weakly_canonical(base / rel, ec);
  if (ec) BadTensor(what, "cannot resolve external data location '" + location + "': " + ec.message());
  fs::path inside = file.lexically_relative(base);
  if (inside.empty() || inside.is_absolute() || *inside.begin() == "..")
    BadTensor(what, "external data location '" + location + "' points outside the model's directory");
  if (!fs::is_regular_file(file, ec))
    throw Error(ErrorCode::kNotFound, what + ": external data file '" + location + "' not found next to the model");
  uint64_t file_size = fs::file_size(file, ec);
  if (ec) throw Error(ErrorCode::kNotFound, what + ": cannot read size of external data file '" + location + "'");
  if (offset > file_size)
    BadTensor(what, "external data offset " + std::to_string(offset) + " is past the end of '" + location + "' (" +
                        std::to_string(file_size) + " bytes)");
  uint64_t available = file_size - offset;
  uint64_t span = length ? *length : available;
  if (span > available)
    BadTensor(what, "external data range [" + std::to_string(offset) + ", +" + std::to_string(span) + ") exceeds the " +
                        std::to_string(file_size) + " bytes of '" + location + "'");
  const int64_t needed = CheckedMul(numel, static_cast<int64_t>(DTypeSize(dtype)), what);
  if (static_cast<uint64_t>(needed) != span)
    BadTensor(what, "shape " + ShapeToString(shape) + " needs " + std::to_string(needed) +
                        " bytes but external data has " + std::to_string(span));
  Tensor t(dtype, shape);
  if (span == 0) return t;
  std::ifstream in(file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(span));
  if (!in) throw Error(ErrorCode::kUnavailable, what + ": error reading external data file '" + location + "'");
  if (dtype == DType::kBool) {
    auto* p = t.data<uint8_t>();
    for (int64_t i = 0; i < numel; ++i) p[i] = p[i] != 0;
  }
  return t;
}

template <class Field>
void CheckCount(const std::string& what, const Shape& shape, int64_t numel, const Field& field, const char* name) {
  if (field.size() == numel) return;
  if (field.empty()) BadTensor(what, "has shape " + ShapeToString(shape) + " but no data");
  BadTensor(what, "shape " + ShapeToString(shape) + " has " + std::to_string(numel) + " elements but " + name +
                      " has " + std::to_string(field.size()));
}

}  // namespace

// Shared with onnx_importer.cc (declared there; no header so the protobuf types stay out of every header).
// `raw_data`, when given, is the tensor's raw_data payload read from the model bytes directly (onnx_wire.h: the
// importer leaves it out of the parsed message); it replaces tp.raw_data().
Tensor TensorFromProto(const onnx::TensorProto& tp, const std::string& base_dir, const std::string& what,
                       const std::string_view* raw_data);

// A DOUBLE tensor's values become float32 (rounded to nearest; osprey computes float64 as float32, as OpenVINO's CPU
// plugin does: PyTorch's exporters write float64 constants where a model builds position tables in float64).
Tensor DoubleAsFloat(const onnx::TensorProto& tp, const std::string& base_dir, const std::string& what,
                     const std::string_view* raw_data) {
  onnx::TensorProto bits = tp;  // the same bytes read as 8-byte integers, then reinterpreted
  bits.set_data_type(onnx::TensorProto_DataType_INT64);
  bits.clear_double_data();
  if (!tp.has_raw_data() && raw_data == nullptr && tp.data_location() != onnx::TensorProto_DataLocation_EXTERNAL)
    for (double v : tp.double_data()) bits.add_int64_data(std::bit_cast<int64_t>(v));
  const Tensor raw = TensorFromProto(bits, base_dir, what, raw_data);
  Tensor out(DType::kF32, raw.shape());
  const int64_t* in = raw.data<int64_t>();
  float* o = out.data<float>();
  for (int64_t i = 0, n = raw.numel(); i < n; ++i) {
    const double v = std::bit_cast<double>(in[i]);  // beyond float's range: infinity (a cast there is undefined)
    constexpr float kInf = std::numeric_limits<float>::infinity();
    o[i] = !(std::fabs(v) > std::numeric_limits<float>::max()) ? static_cast<float>(v) : v > 0 ? kInf : -kInf;
  }
  return out;
}

Tensor TensorFromProto(const onnx::TensorProto& tp, const std::string& base_dir, const std::string& what,
                       const std::string_view* raw_data) {
  if (tp.has_segment()) throw Error(ErrorCode::kUnsupported, what + ": segmented tensors are not supported");
  if (tp.data_type() == onnx::TensorProto_DataType_DOUBLE) return DoubleAsFloat(tp, base_dir, what, raw_data);
  DType dtype;
  try {
    dtype = DTypeFromOnnx(tp.data_type());
  } catch (const Error& e) {
    throw Error(e.code(), what + ": " + e.what());
  }
  Shape shape(tp.dims().begin(), tp.dims().end());
  int64_t numel;
  try {
    numel = NumElements(shape);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, what + ": " + e.what());
  }
  if (tp.data_location() == onnx::TensorProto_DataLocation_EXTERNAL)
    return ReadExternal(tp, dtype, shape, numel, base_dir, what);

  if (tp.has_raw_data()) {
    const std::string_view raw = raw_data ? *raw_data : std::string_view(tp.raw_data());
    const int64_t needed = CheckedMul(numel, static_cast<int64_t>(DTypeSize(dtype)), what);
    if (static_cast<uint64_t>(needed) != raw.size())
      BadTensor(what, "shape " + ShapeToString(shape) + " of " + DTypeName(dtype) + " needs " + std::to_string(needed) +
                          " bytes but raw_data has " + std::to_string(raw.size()));
    Tensor t(dtype, shape);
    PrepareForFill(t, /*huge_pages=*/true);  // pages populated in one call, not faulted one by one
    // ONNX raw_data is little-endian, as is every machine osprey builds for.
    if (dtype == DType::kBool) {
      auto* p = t.data<uint8_t>();
      for (int64_t i = 0; i < numel; ++i) p[i] = raw[i] != 0;
    } else if (numel) {
      std::memcpy(t.raw(), raw.data(), raw.size());
    }
    return t;
  }

  switch (dtype) {
    case DType::kF32: {
      CheckCount(what, shape, numel, tp.float_data(), "float_data");
      Tensor t(dtype, shape);
      if (numel) std::memcpy(t.raw(), tp.float_data().data(), numel * sizeof(float));
      return t;
    }
    case DType::kI64: {
      CheckCount(what, shape, numel, tp.int64_data(), "int64_data");
      Tensor t(dtype, shape);
      if (numel) std::memcpy(t.raw(), tp.int64_data().data(), numel * sizeof(int64_t));
      return t;
    }
    case DType::kI32: {
      CheckCount(what, shape, numel, tp.int32_data(), "int32_data");
      Tensor t(dtype, shape);
      if (numel) std::memcpy(t.raw(), tp.int32_data().data(), numel * sizeof(int32_t));
      return t;
    }
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF16:
    case DType::kBF16: {
      // int32_data carries the bits of the narrow types, one element per entry.
      CheckCount(what, shape, numel, tp.int32_data(), "int32_data");
      Tensor t(dtype, shape);
      const int32_t* src = tp.int32_data().data();
      for (int64_t i = 0; i < numel; ++i) {
        switch (dtype) {
          case DType::kI8:
            t.data<int8_t>()[i] = static_cast<int8_t>(src[i]);
            break;
          case DType::kU8:
            t.data<uint8_t>()[i] = static_cast<uint8_t>(src[i]);
            break;
          case DType::kBool:
            t.data<bool>()[i] = src[i] != 0;
            break;
          default:
            t.data<uint16_t>()[i] = static_cast<uint16_t>(src[i]);
            break;
        }
      }
      return t;
    }
  }
  BadTensor(what, "unhandled dtype");
}

Tensor TensorFromOnnxBytes(const void* data, size_t size) {
  if (size > static_cast<size_t>(INT_MAX))
    throw Error(ErrorCode::kInvalidArgument, "TensorProto of " + std::to_string(size) + " bytes exceeds 2 GiB");
  onnx::TensorProto tp;
  if (!tp.ParseFromArray(data, static_cast<int>(size)))
    throw Error(ErrorCode::kInvalidArgument, "data is not a valid ONNX TensorProto (protobuf parse failed)");
  return TensorFromProto(tp, "", "tensor '" + tp.name() + "'", nullptr);
}

}  // namespace osprey
