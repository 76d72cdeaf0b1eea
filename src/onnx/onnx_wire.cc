#include "onnx/onnx_wire.h"

#include <cstdint>

namespace osprey::onnx_wire {

namespace {

// Field numbers of onnx.proto along the path that is rewritten.
constexpr uint64_t kModelGraph = 7;         // ModelProto.graph: GraphProto
constexpr uint64_t kGraphInitializer = 5;   // GraphProto.initializer: repeated TensorProto
constexpr uint64_t kTensorRawData = 9;      // TensorProto.raw_data: bytes
constexpr int kLengthDelimited = 2;

enum class Level { kModel, kGraph, kTensor };

bool ReadVarint(const uint8_t*& p, const uint8_t* end, uint64_t* value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p == end) return false;
    const uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *value = v;
      return true;
    }
  }
  return false;
}

void WriteVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Advances past one field's payload; false when malformed (or a group, which onnx.proto never uses).
bool SkipPayload(int wire_type, const uint8_t*& p, const uint8_t* end) {
  uint64_t v;
  switch (wire_type) {
    case 0:
      return ReadVarint(p, end, &v);
    case 1:
      if (end - p < 8) return false;
      p += 8;
      return true;
    case 5:
      if (end - p < 4) return false;
      p += 4;
      return true;
    case kLengthDelimited:
      if (!ReadVarint(p, end, &v) || v > static_cast<uint64_t>(end - p)) return false;
      p += v;
      return true;
    default:
      return false;
  }
}

// Rewrites one message of `level` from [p, end) into `out`. `tensor` is the span of the initializer being rewritten
// (level kTensor).
bool Rewrite(Level level, const uint8_t* p, const uint8_t* end, std::string* out, std::vector<RawSpan>* spans,
             size_t tensor) {
  std::string child;
  while (p < end) {
    const uint8_t* field_start = p;
    uint64_t key;
    if (!ReadVarint(p, end, &key)) return false;
    const uint64_t field = key >> 3;
    const int wire_type = static_cast<int>(key & 7);
    if (field == 0) return false;
    const bool rewritten = wire_type == kLengthDelimited &&
                           ((level == Level::kModel && field == kModelGraph) ||
                            (level == Level::kGraph && field == kGraphInitializer) ||
                            (level == Level::kTensor && field == kTensorRawData));
    if (!rewritten) {
      if (!SkipPayload(wire_type, p, end)) return false;
      out->append(reinterpret_cast<const char*>(field_start), static_cast<size_t>(p - field_start));
      continue;
    }
    const uint8_t* key_end = p;
    uint64_t length;
    if (!ReadVarint(p, end, &length) || length > static_cast<uint64_t>(end - p)) return false;
    const uint8_t* body = p;
    p += length;
    out->append(reinterpret_cast<const char*>(field_start), static_cast<size_t>(key_end - field_start));
    if (level == Level::kTensor) {
      // The last raw_data wins, as protobuf merges a repeated singular field.
      (*spans)[tensor] = RawSpan{reinterpret_cast<const char*>(body), static_cast<size_t>(length), true};
      WriteVarint(out, 0);
      continue;
    }
    child.clear();
    size_t index = tensor;
    if (level == Level::kGraph) {
      index = spans->size();
      spans->emplace_back();
    }
    if (!Rewrite(level == Level::kModel ? Level::kGraph : Level::kTensor, body, p, &child, spans, index)) return false;
    WriteVarint(out, child.size());
    out->append(child);
  }
  return p == end;
}

}  // namespace

bool StripInitializerData(const char* data, size_t size, std::string* stripped, std::vector<RawSpan>* spans) {
  stripped->clear();
  spans->clear();
  const auto* p = reinterpret_cast<const uint8_t*>(data);
  if (!Rewrite(Level::kModel, p, p + size, stripped, spans, 0)) {
    stripped->clear();
    spans->clear();
    return false;
  }
  return true;
}

}  // namespace osprey::onnx_wire
